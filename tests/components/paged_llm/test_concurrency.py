"""Mixed load: conversations, AI tasks and a long summary at once, watched through the sensors."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from homeassistant.components import ai_task, conversation
from homeassistant.const import EVENT_STATE_CHANGED
from homeassistant.core import Context, Event, HomeAssistant, callback
from homeassistant.helpers import entity_registry as er
from homeassistant.helpers import intent
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.paged_llm.const import DOMAIN

SENSORS = {
    "kv_cache_usage": "sensor.tiny_kv_cache_usage",
    "kv_blocks_used": "sensor.tiny_kv_blocks_in_use",
    "running": "sensor.tiny_running_sequences",
    "waiting": "sensor.tiny_waiting_requests",
    "preemptions": "sensor.tiny_preemptions",
    "queue_wait": "sensor.tiny_queue_wait_interactive_p95",
    "ttft": "sensor.tiny_time_to_first_token_interactive_p95",
    "throughput": "sensor.tiny_generation_throughput",
    "prefix_hit_rate": "sensor.tiny_prefix_cache_hit_rate",
}


def _entity_id(hass: HomeAssistant, entry: MockConfigEntry, platform: str, kind: str) -> str:
    """The entity id of the entry's agent of one kind."""
    subentry = next(s for s in entry.subentries.values() if s.subentry_type == kind)
    entity_id = er.async_get(hass).async_get_entity_id(platform, DOMAIN, subentry.subentry_id)
    assert entity_id is not None
    return entity_id


async def _wait_for_state(hass: HomeAssistant, entity_id: str, value: str) -> None:
    """Wait for a pushed state (the engine publishes at most about once a second)."""
    for _ in range(100):
        state = hass.states.get(entity_id)
        if state is not None and state.state == value:
            return
        await asyncio.sleep(0.05)
    state = hass.states.get(entity_id)
    raise AssertionError(f"{entity_id} stayed {state.state if state else None}, not {value}")


async def test_mixed_load_completes_in_priority_order(
    hass: HomeAssistant, init_integration: MockConfigEntry, make_long_text: Callable[[int], str]
) -> None:
    entry = init_integration
    for entity_id in SENSORS.values():
        assert hass.states.get(entity_id) is not None, entity_id
    assert hass.states.get(SENSORS["kv_blocks_used"]).state == "0"

    seen: dict[str, list[float]] = {name: [] for name in SENSORS}
    by_entity = {entity_id: name for name, entity_id in SENSORS.items()}

    @callback
    def record(event: Event) -> None:
        name = by_entity.get(event.data["entity_id"])
        new = event.data["new_state"]
        if name and new is not None and new.state not in ("unknown", "unavailable"):
            seen[name].append(float(new.state))

    unsubscribe = hass.bus.async_listen(EVENT_STATE_CHANGED, record)
    finished: dict[str, float] = {}
    conversation_id = _entity_id(hass, entry, "conversation", "conversation")
    task_id = _entity_id(hass, entry, "ai_task", "ai_task_data")
    document = make_long_text(3000)

    async def converse(i: int) -> conversation.ConversationResult:
        result = await conversation.async_converse(
            hass, f"Is light {i} on?", None, Context(), agent_id=conversation_id
        )
        finished[f"conversation {i}"] = time.monotonic()
        return result

    async def task(i: int) -> ai_task.GenDataTaskResult:
        result = await ai_task.async_generate_data(
            hass, task_name=f"task {i}", entity_id=task_id, instructions=f"Name {i} colours"
        )
        finished[f"task {i}"] = time.monotonic()
        return result

    async def summarize() -> Any:
        response = await hass.services.async_call(
            DOMAIN,
            "summarize",
            {"text": document, "max_tokens": 48},
            blocking=True,
            return_response=True,
        )
        finished["summary"] = time.monotonic()
        return response

    try:
        results = await asyncio.gather(
            summarize(), *(converse(i) for i in range(6)), task(0), task(1)
        )
        # Idle again: every block is back in the pool, and the sensors say so.
        await _wait_for_state(hass, SENSORS["kv_blocks_used"], "0")
        await _wait_for_state(hass, SENSORS["running"], "0")
    finally:
        unsubscribe()

    summary, *answers = results
    assert summary["summary"]
    assert summary["chunks"] >= 2  # a part holds at most a fifth of the 8,192-token pool
    assert summary["prompt_tokens"] > 2500
    for result in answers[:6]:
        assert result.response.response_type is intent.IntentResponseType.ACTION_DONE
        assert result.response.speech["plain"]["speech"]
    for result in answers[6:]:
        assert result.data

    # Interactive requests are served before the background summary.
    last_conversation = max(t for name, t in finished.items() if name.startswith("conversation"))
    assert last_conversation < finished["summary"]

    # While the load ran, the pushed sensors showed it.
    assert max(seen["kv_cache_usage"]) > 0
    assert max(seen["kv_blocks_used"]) > 0
    assert max(seen["running"]) > 0
    assert seen["kv_blocks_used"][-1] == 0
    assert seen["running"][-1] == 0
    assert hass.states.get(SENSORS["kv_cache_usage"]).state == "0.0"
    for name in ("queue_wait", "ttft"):
        state = hass.states.get(SENSORS[name])
        assert float(state.state) > 0, name
        assert "interactive" in state.attributes
    assert float(hass.states.get(SENSORS["preemptions"]).state) >= 0
    # The shared system prompt is found in the prefix cache after the first request.
    assert float(hass.states.get(SENSORS["prefix_hit_rate"]).state) > 0
    assert hass.states.get(SENSORS["kv_blocks_used"]).attributes["kv_blocks_total"] == (
        entry.runtime_data.backend.engine.info.num_kv_blocks
    )
