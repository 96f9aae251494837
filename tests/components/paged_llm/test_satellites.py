"""An Assist satellite that hears its wake word announces the voice query to the engine."""

from __future__ import annotations

import asyncio

from homeassistant.core import HomeAssistant
from pytest_homeassistant_custom_component.common import MockConfigEntry

from tests.helpers.support import becomes_true

HOLD_S = 0.3


async def test_a_listening_satellite_holds_the_engines_step_budget(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    await hass.async_block_till_done()
    scheduler = init_integration.runtime_data.backend.engine._llm.scheduler
    # A short hold, so the warm-up query's own hold has passed and each check is quick.
    scheduler.config.interactive_hold_seconds = HOLD_S
    await asyncio.sleep(HOLD_S + 0.1)
    assert not scheduler.step_budget_held()

    hass.states.async_set("assist_satellite.kitchen", "idle")
    hass.states.async_set("media_player.kitchen", "listening")  # not a satellite
    await hass.async_block_till_done()
    assert not await becomes_true(scheduler.step_budget_held, HOLD_S)

    hass.states.async_set("assist_satellite.kitchen", "listening")  # the wake word
    await hass.async_block_till_done()
    assert await becomes_true(scheduler.step_budget_held, 1.0)
    await asyncio.sleep(HOLD_S + 0.1)
    assert not scheduler.step_budget_held()

    # An attribute change while listening announces nothing new ...
    hass.states.async_set("assist_satellite.kitchen", "listening", {"volume": 0.5})
    await hass.async_block_till_done()
    assert not await becomes_true(scheduler.step_budget_held, HOLD_S)
    # ... speech-to-text ending (processing) renews the hold for the query itself.
    hass.states.async_set("assist_satellite.kitchen", "processing")
    await hass.async_block_till_done()
    assert await becomes_true(scheduler.step_budget_held, 1.0)


async def test_an_unloaded_entry_stops_listening_to_satellites(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    backend = init_integration.runtime_data.backend
    calls: list[None] = []
    backend.expect_interactive = lambda: calls.append(None)  # type: ignore[method-assign]
    hass.states.async_set("assist_satellite.kitchen", "listening")
    await hass.async_block_till_done()
    assert len(calls) == 1
    assert await hass.config_entries.async_unload(init_integration.entry_id)
    hass.states.async_set("assist_satellite.kitchen", "processing")
    await hass.async_block_till_done()
    assert len(calls) == 1
