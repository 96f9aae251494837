"""Websocket subscription that pushes the KV pool's block map to the dashboard card."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any, Protocol

import probatio
from homeassistant.components.websocket_api import async_register_command
from homeassistant.components.websocket_api.connection import ActiveConnection
from homeassistant.components.websocket_api.const import ERR_NOT_FOUND
from homeassistant.components.websocket_api.decorators import websocket_command
from homeassistant.components.websocket_api.messages import event_message
from homeassistant.config_entries import ConfigEntryState
from homeassistant.core import HomeAssistant, callback

from .const import DOMAIN, LOGGER

if TYPE_CHECKING:
    from paged_llm.protocol.snapshot import MetricsSnapshot

    from .runtime import PagedLLMConfigEntry

# The card's refresh limit: at most two pushes a second per subscription.
PUSH_INTERVAL_S = 0.5
# A push whose map and figures equal the last one's is skipped; one is still sent this
# often so the card can tell a quiet pool from a dead connection.
HEARTBEAT_S = 10.0
WS_SUBSCRIBE = f"{DOMAIN}/block_map/subscribe"


class BlockMapSource(Protocol):
    """A backend that can show its pool: the embedded engine, or this project's server.

    ``block_map`` returns the engine's ``BlockMap.as_dict()`` form, or None when the
    backend has none (another OpenAI-compatible server); the card then shows the
    aggregate figures. Backends without the method get the same treatment.
    """

    async def block_map(self) -> dict[str, Any] | None:
        """The pool's block map now, or None."""
        ...


def aggregate(snapshot: MetricsSnapshot) -> dict[str, Any]:
    """The figures every backend reports, block map or not."""
    return {
        "kv_blocks_used": snapshot.kv_blocks_used,
        "kv_blocks_total": snapshot.kv_blocks_total,
        "kv_cache_usage_perc": snapshot.kv_cache_usage_perc,
        "num_requests_running": snapshot.num_requests_running,
        "num_requests_waiting": snapshot.num_requests_waiting,
        "num_preemptions": snapshot.num_preemptions,
        "prefix_cache_hit_rate": snapshot.prefix_cache_hit_rate,
        "generation_throughput": snapshot.generation_throughput,
    }


def _source(entry: PagedLLMConfigEntry) -> BlockMapSource | None:
    """The entry's backend when it can be asked for a block map."""
    backend = entry.runtime_data.backend
    if callable(getattr(backend, "block_map", None)):
        source: BlockMapSource = backend  # type: ignore[assignment]
        return source
    return None


async def async_payload(entry: PagedLLMConfigEntry) -> dict[str, Any]:
    """One push: the entry's block map when its backend has one, its figures always."""
    if entry.state is not ConfigEntryState.LOADED:
        return {"entry_id": entry.entry_id, "title": entry.title, "state": "unavailable"}
    data = entry.runtime_data
    payload: dict[str, Any] = {
        "entry_id": entry.entry_id,
        "title": entry.title,
        "state": "loaded",
        "metrics": aggregate(data.coordinator.data),
        "block_map": None,
    }
    source = _source(entry)
    if source is None:
        return payload
    try:
        block_map = await source.block_map()
    except Exception as err:
        # A map is optional: the figures still go out.
        LOGGER.debug("No block map from %s: %s", entry.title, err)
        return payload
    payload["block_map"] = block_map
    return payload


def _find_entry(hass: HomeAssistant, entry_id: str | None) -> PagedLLMConfigEntry | None:
    """The entry asked for, or the first loaded one when none is named."""
    if entry_id is not None:
        entry = hass.config_entries.async_get_entry(entry_id)
        return entry if entry is not None and entry.domain == DOMAIN else None
    entries = hass.config_entries.async_entries(DOMAIN)
    loaded = [e for e in entries if e.state is ConfigEntryState.LOADED]
    candidates = loaded or entries
    return candidates[0] if candidates else None


def _same(a: dict[str, Any] | None, b: dict[str, Any]) -> bool:
    """Whether two pushes show the same thing (the map's timestamp aside)."""
    if a is None:
        return False
    a_map, b_map = a.get("block_map"), b.get("block_map")
    if (a_map is None) != (b_map is None):
        return False
    if a_map is not None and b_map is not None:
        keys = ("cells", "used", "num_requests_running", "num_requests_waiting")
        if any(a_map[k] != b_map[k] for k in keys):
            return False
    return {k: v for k, v in a.items() if k != "block_map"} == {
        k: v for k, v in b.items() if k != "block_map"
    }


@websocket_command(
    {
        probatio.Required("type"): WS_SUBSCRIBE,
        probatio.Optional("entry_id"): str,
    }
)
@callback
def ws_subscribe_block_map(
    hass: HomeAssistant, connection: ActiveConnection, msg: dict[str, Any]
) -> None:
    """Push the entry's block map and figures while the subscriber stays (at most 2 Hz)."""
    entry = _find_entry(hass, msg.get("entry_id"))
    if entry is None:
        connection.send_error(
            msg["id"],
            ERR_NOT_FOUND,
            f"no {DOMAIN} entry {msg.get('entry_id') or ''}".strip(),
        )
        return
    entry_id = entry.entry_id

    async def push() -> None:
        """Send a payload whenever it changed, never faster than PUSH_INTERVAL_S."""
        last: dict[str, Any] | None = None
        last_sent = 0.0
        while True:
            started = time.monotonic()
            current = hass.config_entries.async_get_entry(entry_id)
            if current is None:
                connection.send_message(
                    event_message(msg["id"], {"entry_id": entry_id, "state": "removed"})
                )
                return
            # Taking the map waits for the engine's step under way: from a few ms to a step.
            payload = await async_payload(current)
            if not _same(last, payload) or started - last_sent >= HEARTBEAT_S:
                connection.send_message(event_message(msg["id"], payload))
                last, last_sent = payload, time.monotonic()
            # The pace counts from the last send, so a slow take followed by a quick one
            # cannot put two pushes closer than the interval.
            since = time.monotonic() - max(started, last_sent)
            await asyncio.sleep(max(0.0, PUSH_INTERVAL_S - since))

    # Not the entry's task: the subscription outlives a reload and shows it as unavailable.
    task = hass.async_create_background_task(push(), f"{DOMAIN} block map subscription")

    @callback
    def unsubscribe() -> None:
        """Stop pushing: the card closed or the connection went away."""
        task.cancel()

    connection.subscriptions[msg["id"]] = unsubscribe
    connection.send_result(msg["id"])


@callback
def async_setup_websocket_api(hass: HomeAssistant) -> None:
    """Register the integration's websocket commands."""
    async_register_command(hass, ws_subscribe_block_map)
