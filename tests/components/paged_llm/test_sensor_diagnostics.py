"""Sensors on the engine's service device, and the diagnostics download."""

from __future__ import annotations

import asyncio
import json

import pytest
from homeassistant.components.diagnostics import REDACTED
from homeassistant.const import EntityCategory
from homeassistant.core import HomeAssistant
from homeassistant.helpers import device_registry as dr
from homeassistant.helpers import entity_registry as er
from homeassistant.setup import async_setup_component
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.paged_llm.const import DOMAIN
from custom_components.paged_llm.diagnostics import async_get_config_entry_diagnostics

# Unit and state before the first request: counts have no unit; nobody has waited, so the
# queue wait is 0; no token has come yet, so the time to first token is not known.
EXPECTED = {
    "engine_state": (None, "idle"),
    "kv_cache_usage": ("%", "0.0"),
    "kv_blocks_used": ("blocks", "0"),
    "running_requests": (None, "0"),
    "waiting_requests": (None, "0"),
    "preemptions": (None, "0"),
    # The conversation agent's prompt-warming request may have run by now: a number, or
    # (time to first token) unknown while it has not.
    "queue_wait_p95": ("s", None),
    "time_to_first_token_p95": ("s", None),
    "generation_throughput": ("tokens/s", None),
    "prompt_throughput": ("tokens/s", None),
    # The warm-up reads the agent's prompt twice, the second time from the cache.
    "prefix_cache_hit_rate": ("%", None),
    "model_loaded": (None, "loaded"),
}


async def test_sensors_are_diagnostic_entities_of_one_service_device(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    entity_registry = er.async_get(hass)
    device_registry = dr.async_get(hass)
    every_sensor = [
        e
        for e in er.async_entries_for_config_entry(entity_registry, init_integration.entry_id)
        if e.domain == "sensor"
    ]
    # Besides the engine's, one prompt-size sensor on each conversation agent's own device.
    agent_sensors = [e for e in every_sensor if e.config_subentry_id is not None]
    conversation = next(
        s for s in init_integration.subentries.values() if s.subentry_type == "conversation"
    )
    assert [(e.unique_id, e.config_subentry_id) for e in agent_sensors] == [
        (f"{conversation.subentry_id}_prompt_tokens", conversation.subentry_id)
    ]
    sensors = [e for e in every_sensor if e.config_subentry_id is None]
    assert {e.unique_id.removeprefix(f"{init_integration.entry_id}_") for e in sensors} == set(
        EXPECTED
    )
    assert {e.device_id for e in sensors} == {init_integration.runtime_data.device_id}
    device = device_registry.async_get(init_integration.runtime_data.device_id)
    assert device is not None
    assert device.entry_type is dr.DeviceEntryType.SERVICE
    assert (DOMAIN, init_integration.entry_id) in device.identifiers
    for entry in sensors:
        key = entry.unique_id.removeprefix(f"{init_integration.entry_id}_")
        # The engine state is what a person looks for first: not hidden among diagnostics.
        category = None if key == "engine_state" else EntityCategory.DIAGNOSTIC
        assert entry.entity_category is category, key
        unit, idle = EXPECTED[key]
        state = hass.states.get(entry.entity_id)
        assert state is not None
        assert state.attributes.get("unit_of_measurement") == unit, key
        if idle is None:
            assert state.state == "unknown" or float(state.state) >= 0, key
        else:
            assert state.state == idle, key
    # The agents' devices hang off the engine's device.
    agents = [
        device_registry.async_get(e.device_id)
        for e in er.async_entries_for_config_entry(entity_registry, init_integration.entry_id)
        if e.domain in ("conversation", "ai_task")
    ]
    assert len(agents) == 2
    assert all(d is not None and d.via_device_id == device.id for d in agents)


async def test_a_manual_refresh_reads_the_latest_snapshot(
    hass: HomeAssistant, init_integration: MockConfigEntry, caplog: pytest.LogCaptureFixture
) -> None:
    assert await async_setup_component(hass, "homeassistant", {})
    await hass.services.async_call(
        "homeassistant",
        "update_entity",
        {"entity_id": "sensor.tiny_kv_blocks_in_use"},
        blocking=True,
    )
    await hass.async_block_till_done()
    assert hass.states.get("sensor.tiny_kv_blocks_in_use").state == "0"
    assert "Update for sensor.tiny_kv_blocks_in_use fails" not in caplog.text


async def test_sensors_become_unavailable_when_the_engine_stops(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    await init_integration.runtime_data.backend.engine.stop()
    init_integration.runtime_data.coordinator.async_update_listeners()
    await hass.async_block_till_done()
    assert hass.states.get("sensor.tiny_kv_cache_usage").state == "unavailable"
    assert hass.states.get("sensor.tiny_engine_state").state == "unloaded"


async def test_latency_sensors_follow_the_interactive_class(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    """A background request must not make voice look slow; it shows as an attribute."""
    coordinator = init_integration.runtime_data.coordinator
    engine = init_integration.runtime_data.backend.engine

    async def generate(priority: str) -> None:
        await hass.services.async_call(
            DOMAIN,
            "generate",
            {"prompt": "hello there", "max_tokens": 3, "priority": priority},
            blocking=True,
            return_response=True,
        )
        await asyncio.sleep(0.5)  # the engine refreshes its snapshot on going idle
        coordinator.async_set_updated_data(engine.metrics())
        await hass.async_block_till_done()

    await generate("background")
    # The main state is the interactive class's figure (the agent's prompt warm-up may have
    # made one, or not yet), never the background request's.
    snapshot = engine.metrics()
    ttft = hass.states.get("sensor.tiny_time_to_first_token_interactive_p95")
    voice = snapshot.time_to_first_token_seconds.get("interactive")
    background = snapshot.time_to_first_token_seconds["background"].p95
    assert background is not None
    assert background > 0
    assert ttft.attributes["background"] == pytest.approx(background)
    if voice is None or voice.p95 is None:
        assert ttft.state == "unknown"
        assert ttft.attributes["interactive"] is None
    else:
        assert float(ttft.state) == pytest.approx(voice.p95)
    assert float(hass.states.get("sensor.tiny_generation_throughput").state) > 0
    assert float(hass.states.get("sensor.tiny_prompt_throughput").state) > 0
    assert hass.states.get("sensor.tiny_engine_state").state == "idle"

    await generate("interactive")
    snapshot = engine.metrics()
    ttft = hass.states.get("sensor.tiny_time_to_first_token_interactive_p95")
    interactive = snapshot.time_to_first_token_seconds["interactive"].p95
    assert float(ttft.state) == pytest.approx(interactive)
    assert ttft.attributes["interactive"] == pytest.approx(interactive)


async def test_diagnostics_hold_settings_figures_and_versions_but_no_prompts(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    await hass.services.async_call(
        DOMAIN,
        "generate",
        {"prompt": "hello", "max_tokens": 2},
        blocking=True,
        return_response=True,
    )
    diagnostics = await async_get_config_entry_diagnostics(hass, init_integration)
    json.dumps(diagnostics)  # the download is JSON
    assert diagnostics["entry"]["data"] == dict(init_integration.data)
    subentries = diagnostics["entry"]["subentries"]
    conversation = next(s for s in subentries if s["type"] == "conversation")
    assert conversation["data"]["prompt"] == REDACTED
    assert conversation["data"]["max_tokens"] == 8
    engine = diagnostics["engine"]
    assert engine["is_running"] is True
    assert engine["device"] == "cpu"
    assert engine["dtype"] == "float32"
    # auto keeps a model folder's weights dense: only a GGUF file's 4-bit ones stay 4-bit.
    assert engine["weights"] == "float"
    llm_engine = init_integration.runtime_data.backend.engine._llm
    # How decode attention runs: a user without a C compiler sees why it is slower.
    assert engine["attention"] == llm_engine.runner.attention_text
    assert engine["attention"].startswith(("C kernel in place", "torch ("))
    # Dense weights: transformers runs the forward pass, and the diagnostics say why.
    assert engine["forward"].startswith("transformers' forward (")
    assert engine["num_kv_blocks"] == llm_engine.num_kv_blocks
    assert engine["max_model_len"] == 4096
    assert engine["config"]["kv_budget"] == 4 * 2**20
    assert "kv_blocks_used" in engine["metrics"]
    assert "prefix_cache_hit_rate" in engine["metrics"]
    versions = diagnostics["versions"]
    assert versions["integration"] == "0.1.0"
    assert versions["paged-llm"] == "0.1.0"
    assert versions["torch"]
    assert versions["transformers"]
    assert versions["home_assistant"]
    assert "cuda_available" in versions
