"""The Paged LLM add-on: the entry its discovery sets up, and a repair while it is away."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from homeassistant.const import (
    CONF_API_KEY,
    CONF_HOST,
    CONF_MODEL,
    CONF_PORT,
    CONF_TIMEOUT,
    CONF_URL,
)
from homeassistant.core import HomeAssistant, callback
from homeassistant.helpers import issue_registry as ir
from homeassistant.helpers.service_info.hassio import HassioServiceInfo
from homeassistant.util.hass_dict import HassKey

from paged_llm.protocol.snapshot import EngineState

from .backend import Backend
from .const import BACKEND_REMOTE, CONF_BACKEND, DEFAULT_TIMEOUT_S, DOMAIN
from .coordinator import PagedLLMCoordinator

if TYPE_CHECKING:
    from .runtime import PagedLLMConfigEntry

# The slug of the add-on that announced an entry's server, kept in the entry's data.
CONF_ADDON = "addon"
# An add-on that restarts (an update, new options) is away for seconds; only an outage
# longer than this gets a repair.
UNREACHABLE_REPAIR_S = 60.0
ISSUE_UNREACHABLE = "addon_unreachable"
# Since when each add-on entry's server has not answered (monotonic seconds), by entry id.
_DOWN_SINCE: HassKey[dict[str, float]] = HassKey(f"{DOMAIN}_addon_down_since")


def addon_unique_id(slug: str) -> str:
    """The unique id of the entry an add-on sets up: one per add-on, whatever its model."""
    return f"addon:{slug}"


def discovered_data(info: HassioServiceInfo) -> dict[str, Any]:
    """Entry data for the server an add-on announced (KeyError, ValueError: it said too little)."""
    config = info.config
    host, port = str(config[CONF_HOST]).strip(), int(config[CONF_PORT])
    if not host or not 0 < port < 65536:
        raise ValueError(f"no server at {host!r} port {port}")
    data: dict[str, Any] = {
        CONF_BACKEND: BACKEND_REMOTE,
        CONF_URL: f"http://{host}:{port}",
        CONF_TIMEOUT: DEFAULT_TIMEOUT_S,
        CONF_ADDON: info.slug,
    }
    for key in (CONF_API_KEY, CONF_MODEL):
        if value := str(config.get(key) or "").strip():
            data[key] = value
    return data


def _issue_id(entry: PagedLLMConfigEntry) -> str:
    """The repair of one entry."""
    return f"{ISSUE_UNREACHABLE}_{entry.entry_id}"


@callback
def async_server_unreachable(hass: HomeAssistant, entry: PagedLLMConfigEntry) -> None:
    """Note that an add-on entry's server did not answer; a repair once that lasted."""
    if CONF_ADDON not in entry.data:
        return
    since = hass.data.setdefault(_DOWN_SINCE, {}).setdefault(entry.entry_id, time.monotonic())
    if time.monotonic() - since < UNREACHABLE_REPAIR_S:
        return
    ir.async_create_issue(
        hass,
        DOMAIN,
        _issue_id(entry),
        is_fixable=False,
        severity=ir.IssueSeverity.ERROR,
        translation_key=ISSUE_UNREACHABLE,
        translation_placeholders={"entry": entry.title, "url": entry.data[CONF_URL]},
    )


@callback
def async_server_reachable(hass: HomeAssistant, entry: PagedLLMConfigEntry) -> None:
    """The entry's server answered: the outage, and its repair, are over."""
    hass.data.get(_DOWN_SINCE, {}).pop(entry.entry_id, None)
    ir.async_delete_issue(hass, DOMAIN, _issue_id(entry))


@callback
def async_track_addon(
    hass: HomeAssistant,
    entry: PagedLLMConfigEntry,
    coordinator: PagedLLMCoordinator,
    backend: Backend,
) -> Callable[[], None]:
    """Follow an add-on entry's server through the metrics poll; returns the unsubscribe."""
    if CONF_ADDON not in entry.data:
        return lambda: None
    async_server_reachable(hass, entry)  # it answered: the entry just started

    @callback
    def _polled() -> None:
        """A server away is one that neither serves nor says it is loading."""
        if backend.available or coordinator.data.engine_state is not EngineState.UNLOADED:
            async_server_reachable(hass, entry)
        else:
            async_server_unreachable(hass, entry)

    return coordinator.async_add_listener(_polled)
