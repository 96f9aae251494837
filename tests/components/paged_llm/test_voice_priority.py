"""Voice never waits behind a summary: the prompt is warmed at start and survives a long summary."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from homeassistant.components import conversation
from homeassistant.core import Context, HomeAssistant
from homeassistant.helpers import entity_registry as er
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.paged_llm.const import DOMAIN
from paged_llm.engine.core.sequence import Priority


@pytest.fixture
def engine_settings(engine_settings: dict[str, Any]) -> dict[str, Any]:
    """A pool of 2,048 tokens, so the document below is several times the pool."""
    return {**engine_settings, "kv_budget_mib": 1}


async def test_voice_is_never_queued_behind_a_summary_larger_than_the_pool(
    hass: HomeAssistant, init_integration: MockConfigEntry, make_long_text: Callable[[int], str]
) -> None:
    entry = init_integration
    engine = entry.runtime_data.backend.engine
    llm_engine = engine._llm
    kv = llm_engine.kv_manager
    pool_tokens = kv.num_blocks * kv.block_size
    assert pool_tokens == 2048
    subentry = next(s for s in entry.subentries.values() if s.subentry_type == "conversation")
    agent = er.async_get(hass).async_get_entity_id("conversation", DOMAIN, subentry.subentry_id)
    assert agent is not None

    # The agent warmed the cache with its prompt when the engine started (a background
    # task: the plain wait does not wait for it, and a busy machine lost that race once).
    await hass.async_block_till_done(wait_background_tasks=True)
    assert kv.prefix_cache_queries > 0

    # After every step, note whether a voice request was left waiting.
    scheduler = llm_engine.scheduler
    real_schedule = scheduler.schedule
    voice_left_waiting: list[int] = []

    def schedule() -> Any:
        out = real_schedule()
        voice_left_waiting.append(scheduler.num_waiting_by_class()[Priority.INTERACTIVE])
        return out

    scheduler.schedule = schedule  # type: ignore[method-assign]
    outputs: list[Any] = []
    real_generate = engine.generate

    async def observed(prompt: Any, params: Any, priority: Any, **kwargs: Any) -> Any:
        async for out in real_generate(prompt, params, priority, **kwargs):
            if out.finished:
                outputs.append((priority, params, out))
            yield out

    engine.generate = observed  # type: ignore[method-assign]
    summary_done = asyncio.Event()

    async def summarize() -> Any:
        try:
            return await hass.services.async_call(
                DOMAIN,
                "summarize",
                {"text": make_long_text(3 * pool_tokens), "max_tokens": 8},
                blocking=True,
                return_response=True,
            )
        finally:
            summary_done.set()

    async def voice() -> list[conversation.ConversationResult]:
        answers = []
        for i in range(6):
            await asyncio.sleep(0.05)
            answers.append(
                await conversation.async_converse(
                    hass, f"Is light {i} on?", None, Context(), agent_id=agent
                )
            )
        return answers

    try:
        summary, answers = await asyncio.gather(summarize(), voice())
    finally:
        del engine.generate
        del scheduler.schedule
    assert summary is not None
    assert summary["chunks"] >= 3  # parts sized to a share of the pool
    assert all(a.response.speech["plain"]["speech"] for a in answers)
    # The agent re-warms its prompt (one token) when the registry changes, and Home
    # Assistant's prompt holds the time of day: on a slow machine the debounced warm-up
    # after setup falls inside the test. Those are not voice queries.
    voice_outputs = [
        out
        for priority, params, out in outputs
        if priority == "interactive" and params.max_tokens != 1
    ]
    assert len(voice_outputs) == 6
    # No voice request ever waited a step, none was preempted, and each found the
    # warmed system prompt in the cache, summary or not.
    assert voice_left_waiting
    assert not any(voice_left_waiting)
    assert all(out.timing.num_preemptions == 0 for out in voice_outputs)
    assert all(out.cached_tokens >= kv.block_size for out in voice_outputs)
    # The summary overlapped the voice queries.
    assert summary_done.is_set()
    assert kv.num_used_blocks == 0
