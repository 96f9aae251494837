"""The block-map subscription and the card's registration, over a real engine."""

from __future__ import annotations

import asyncio
import base64
import itertools
import time
from typing import Any

import pytest
from homeassistant.core import HomeAssistant
from homeassistant.setup import async_setup_component
from pytest_homeassistant_custom_component.common import MockConfigEntry
from pytest_homeassistant_custom_component.typing import ClientSessionGenerator, WebSocketGenerator

from custom_components.paged_llm import card, websocket_api
from paged_llm.engine.core.sequence import Priority, SamplingParams

SUBSCRIBE = "paged_llm/block_map/subscribe"


async def _next_event(client: Any, wait: float) -> dict[str, Any] | None:
    """The next pushed event, or None when nothing comes within ``wait`` seconds."""
    try:
        msg = await client.receive_json(timeout=wait)
    except TimeoutError:
        return None
    assert msg["type"] == "event", msg
    return msg["event"]


async def _run_requests(engine: Any, count: int, max_tokens: int) -> None:
    """A mix of classes that keeps the pool busy for a few pushes."""
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    prompts = ["turn on the kitchen light", "the hall heating " * 30, "summarise " * 80]

    async def one(i: int) -> None:
        async for _ in engine.generate(prompts[i % 3], params, Priority(i % 3)):
            pass

    await asyncio.gather(*(one(i) for i in range(count)))


def _check_map(event: dict[str, Any]) -> dict[str, Any]:
    """The event's block map, checked for internal consistency."""
    block_map = event["block_map"]
    assert block_map is not None, event
    cells = base64.b64decode(block_map["cells"])
    assert len(cells) == block_map["num_blocks"] == event["metrics"]["kv_blocks_total"]
    assert block_map["used"] + block_map["cached"] + block_map["free"] == len(cells)
    assert sum(block_map["used_by_class"].values()) == block_map["used"]
    return block_map


async def test_snapshots_arrive_while_requests_run_and_match_the_engine(
    hass: HomeAssistant, init_integration: MockConfigEntry, hass_ws_client: WebSocketGenerator
) -> None:
    engine = init_integration.runtime_data.backend.engine
    client = await hass_ws_client(hass)
    await client.send_json_auto_id({"type": SUBSCRIBE, "entry_id": init_integration.entry_id})
    result = await client.receive_json()
    assert result["success"], result

    first = await _next_event(client, 5)
    assert first is not None
    assert first["state"] == "loaded"
    assert first["entry_id"] == init_integration.entry_id
    idle = _check_map(first)
    assert idle["used"] == 0

    work = asyncio.create_task(_run_requests(engine, 6, 200))
    events: list[tuple[float, dict[str, Any]]] = []
    while not work.done():
        event = await _next_event(client, 2)
        if event is not None:
            events.append((time.monotonic(), event))
    await work
    busy = [_check_map(e) for _, e in events if e["block_map"]["used"] > 0]
    assert busy, "no snapshot showed a held block while the requests ran"
    assert any(m["num_requests_running"] > 0 for m in busy)
    assert any(len(m["used_by_class"]) == 3 and m["used"] for m in busy)
    # At most two pushes a second (a little slack for the test machine's clock reads).
    gaps = [b - a for (a, _), (b, _) in itertools.pairwise(events)]
    assert all(gap > 0.4 for gap in gaps), gaps

    # Quiet again: the next push equals the engine's own counts.
    deadline = time.monotonic() + 10
    final = None
    while time.monotonic() < deadline:
        event = await _next_event(client, 2)
        if event is not None and event["block_map"]["used"] == 0:
            final = _check_map(event)
            break
    assert final is not None
    kv = engine._llm.kv_manager
    assert final["used"] == kv.num_used_blocks == 0
    assert final["cached"] + final["free"] == kv.num_free_blocks == kv.num_blocks
    assert final["cached"] > 0  # the finished prompts' full blocks wait for reuse
    await asyncio.sleep(0)


async def test_pushes_stop_when_unsubscribed(
    hass: HomeAssistant, init_integration: MockConfigEntry, hass_ws_client: WebSocketGenerator
) -> None:
    engine = init_integration.runtime_data.backend.engine
    client = await hass_ws_client(hass)
    await client.send_json_auto_id({"type": SUBSCRIBE})
    result = await client.receive_json()
    assert result["success"], result
    subscription = result["id"]
    assert await _next_event(client, 5) is not None

    work = asyncio.create_task(_run_requests(engine, 3, 300))
    try:
        for _ in range(20):
            event = await _next_event(client, 2)
            if event is not None and event["block_map"]["used"]:
                break
        else:
            pytest.fail("no busy snapshot")
        await client.send_json_auto_id({"type": "unsubscribe_events", "subscription": subscription})
        while True:  # an event already under way may still land before the result
            msg = await client.receive_json(timeout=5)
            if msg["type"] == "result":
                assert msg["success"], msg
                break
        assert engine._llm.has_unfinished()
        try:
            msg = await client.receive_json(timeout=1.5)
        except TimeoutError:
            msg = None
        assert msg is None, f"pushed after unsubscribing: {msg}"
    finally:
        await work


async def test_aggregate_figures_when_no_map_can_be_had(
    hass: HomeAssistant, init_integration: MockConfigEntry, hass_ws_client: WebSocketGenerator
) -> None:
    # A backend without a map (a stopped engine here, another server in remote mode) still
    # gives the card the figures the sensors show.
    await init_integration.runtime_data.backend.engine.stop()
    payload = await websocket_api.async_payload(init_integration)
    assert payload["state"] == "loaded"
    assert payload["block_map"] is None
    metrics = init_integration.runtime_data.coordinator.data
    assert payload["metrics"]["kv_blocks_total"] == metrics.kv_blocks_total > 0
    assert payload["metrics"]["num_preemptions"] == metrics.num_preemptions


async def test_unknown_entry_is_an_error(
    hass: HomeAssistant, init_integration: MockConfigEntry, hass_ws_client: WebSocketGenerator
) -> None:
    client = await hass_ws_client(hass)
    await client.send_json_auto_id({"type": SUBSCRIBE, "entry_id": "nope"})
    result = await client.receive_json()
    assert not result["success"]
    assert result["error"]["code"] == "not_found"


async def test_an_unloaded_entry_shows_as_unavailable(
    hass: HomeAssistant, init_integration: MockConfigEntry, hass_ws_client: WebSocketGenerator
) -> None:
    client = await hass_ws_client(hass)
    await client.send_json_auto_id({"type": SUBSCRIBE, "entry_id": init_integration.entry_id})
    assert (await client.receive_json())["success"]
    assert (await _next_event(client, 5))["state"] == "loaded"
    assert await hass.config_entries.async_unload(init_integration.entry_id)
    event = await _next_event(client, 5)
    assert event is not None
    assert event["state"] == "unavailable"


async def test_the_card_is_served_and_loaded_on_every_dashboard(
    hass: HomeAssistant, ha_core: None, hass_client: ClientSessionGenerator
) -> None:
    assert await async_setup_component(hass, "http", {})
    assert await async_setup_component(hass, "frontend", {})
    assert await async_setup_component(hass, "paged_llm", {})
    from homeassistant.components.frontend import DATA_EXTRA_MODULE_URL

    urls = [u for u in hass.data[DATA_EXTRA_MODULE_URL].urls if u.startswith(card.CARD_URL)]
    assert len(urls) == 1
    client = await hass_client()
    response = await client.get(urls[0])
    assert response.status == 200
    body = await response.text()
    assert "customElements.define(CARD_TYPE" in body
    assert "paged_llm/block_map/subscribe" in body
