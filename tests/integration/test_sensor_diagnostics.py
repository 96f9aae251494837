"""Sensors on the engine's service device, and the diagnostics download."""

from __future__ import annotations

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

EXPECTED = {
    "kv_cache_usage": ("%", "0.0"),
    "kv_blocks_used": ("blocks", "0"),
    "running_requests": ("requests", "0"),
    "waiting_requests": ("requests", "0"),
    "preemptions": ("preemptions", "0"),
    "queue_wait_p95": ("s", "unknown"),
    "time_to_first_token_p95": ("s", "unknown"),
    "generation_throughput": ("tokens/s", "0.0"),
    "prefix_cache_hit_rate": ("%", "0.0"),
    "model_loaded": (None, "loaded"),
}


async def test_sensors_are_diagnostic_entities_of_one_service_device(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    entity_registry = er.async_get(hass)
    device_registry = dr.async_get(hass)
    sensors = [
        e
        for e in er.async_entries_for_config_entry(entity_registry, init_integration.entry_id)
        if e.domain == "sensor"
    ]
    assert {e.unique_id.removeprefix(f"{init_integration.entry_id}_") for e in sensors} == set(
        EXPECTED
    )
    assert {e.device_id for e in sensors} == {init_integration.runtime_data.device_id}
    device = device_registry.async_get(init_integration.runtime_data.device_id)
    assert device is not None
    assert device.entry_type is dr.DeviceEntryType.SERVICE
    assert (DOMAIN, init_integration.entry_id) in device.identifiers
    for entry in sensors:
        assert entry.entity_category is EntityCategory.DIAGNOSTIC
        key = entry.unique_id.removeprefix(f"{init_integration.entry_id}_")
        unit, idle = EXPECTED[key]
        state = hass.states.get(entry.entity_id)
        assert state is not None
        assert state.attributes.get("unit_of_measurement") == unit, key
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
    assert engine["dtype"] == "torch.float32"
    llm_engine = init_integration.runtime_data.backend.engine.engine
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
