"""Embedded: the model unloads after idle time when asked to, and loads for the next request."""

from __future__ import annotations

import asyncio
from typing import Any

from homeassistant.core import HomeAssistant
from homeassistant.helpers import entity_registry as er
from pytest_homeassistant_custom_component.common import MockConfigEntry

DOMAIN = "paged_llm"


def _loaded_state(hass: HomeAssistant, entry: MockConfigEntry) -> str:
    entity_id = er.async_get(hass).async_get_entity_id(
        "sensor", DOMAIN, f"{entry.entry_id}_model_loaded"
    )
    assert entity_id is not None
    state = hass.states.get(entity_id)
    assert state is not None
    return state.state


async def _generate(hass: HomeAssistant) -> dict[str, Any]:
    response = await hass.services.async_call(
        DOMAIN,
        "generate",
        {"prompt": "Hello", "max_tokens": 2},
        blocking=True,
        return_response=True,
    )
    assert response is not None
    return response


async def test_idle_model_unloads_and_the_next_request_loads_it(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    entry = init_integration
    backend = entry.runtime_data.backend
    assert backend.idle_unload_s == 0  # off by default
    assert _loaded_state(hass, entry) == "loaded"
    # The form counts in minutes; a fraction of a second keeps the test short.
    backend.idle_unload_s = 0.3
    await _generate(hass)
    first_engine = backend.engine
    assert not backend.unloaded  # a request just ended: the countdown runs
    for _ in range(50):
        await asyncio.sleep(0.1)
        if backend.unloaded:
            break
    await hass.async_block_till_done()
    assert backend.unloaded
    assert not first_engine.is_running  # the model and the KV pool are freed
    assert _loaded_state(hass, entry) == "unloaded"
    assert backend.available  # a request may still come, and it will load the model

    response = await _generate(hass)
    assert response["completion_tokens"] >= 1
    await hass.async_block_till_done()
    assert backend.engine is not first_engine
    assert backend.engine.is_running
    assert _loaded_state(hass, entry) == "loaded"


async def test_an_unloaded_model_is_still_described_and_a_summary_loads_it(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    """A caller that sizes its work first (summarize) is not told the sleeping engine is dead."""
    backend = init_integration.runtime_data.backend
    before = (backend.context_size, backend.kv_pool_tokens, backend.native_tools)
    backend.idle_unload_s = 600.0  # armed, not due: the test fires it
    await backend._async_unload_idle()
    assert backend.unloaded
    assert (backend.context_size, backend.kv_pool_tokens, backend.native_tools) == before
    response = await hass.services.async_call(
        DOMAIN,
        "summarize",
        {"text": "The kitchen light was on all night. " * 40, "max_tokens": 4},
        blocking=True,
        return_response=True,
    )
    assert response is not None
    assert response["summary"]
    assert not backend.unloaded
