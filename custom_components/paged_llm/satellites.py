"""Tell the backend a voice query is coming when an Assist satellite starts listening.

A satellite (Voice PE, ESPHome, Wyoming) turns to ``listening`` at its wake word, seconds
before speech-to-text hands the query to a conversation agent. On the engine that lead
turns long summary steps into short ones, so the query does not arrive in the middle of
a step sized to the full token budget.
"""

from __future__ import annotations

from homeassistant.components.assist_satellite import DOMAIN as SATELLITE_DOMAIN
from homeassistant.components.assist_satellite.entity import AssistSatelliteState
from homeassistant.core import CALLBACK_TYPE, Event, EventStateChangedData, HomeAssistant, callback
from homeassistant.helpers.event import TrackStates, async_track_state_change_filtered

from .backend import Backend

# Listening: the wake word was heard. Processing: the query goes to the agent now; a
# command spoken for longer than the engine's hold renews the budget here.
ANNOUNCING_STATES = frozenset({AssistSatelliteState.LISTENING, AssistSatelliteState.PROCESSING})


@callback
def async_track_satellites(hass: HomeAssistant, backend: Backend) -> CALLBACK_TYPE:
    """Call ``backend.expect_interactive`` when a satellite starts listening; returns the stop."""

    @callback
    def _state_changed(event: Event[EventStateChangedData]) -> None:
        """A satellite's state changed: announce the query when it began one."""
        new, old = event.data["new_state"], event.data["old_state"]
        if new is None or new.state not in ANNOUNCING_STATES:
            return
        if old is not None and old.state == new.state:
            return  # an attribute changed, not the state
        backend.expect_interactive()

    tracker = async_track_state_change_filtered(
        hass, TrackStates(False, set(), {SATELLITE_DOMAIN}), _state_changed
    )
    return tracker.async_remove
