"""The metrics coordinator: a server's metrics polled, the embedded engine's pushed."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from homeassistant.config_entries import ConfigEntry
from homeassistant.core import HomeAssistant
from homeassistant.exceptions import ConfigEntryAuthFailed
from homeassistant.helpers.update_coordinator import DataUpdateCoordinator, UpdateFailed

from paged_llm.protocol.snapshot import MetricsSnapshot

from .backend import Backend, BackendError
from .const import DOMAIN, LOGGER, REMOTE_METRICS_INTERVAL_S


class PagedLLMCoordinator(DataUpdateCoordinator[MetricsSnapshot]):
    """An entry's metrics snapshots, for its sensors, agents and the block-map card."""

    def __init__(
        self, hass: HomeAssistant, entry: ConfigEntry[Any], backend: Backend, *, remote: bool
    ) -> None:
        """Watch ``backend``'s metrics; a ``remote`` one is polled, the engine pushes."""
        # Its own logger: a debug line per pushed snapshot would drown the integration's log.
        super().__init__(
            hass,
            LOGGER.getChild("metrics"),
            config_entry=entry,
            name=f"{DOMAIN} {entry.title}",
            # A server is polled; the embedded engine pushes.
            update_interval=timedelta(seconds=REMOTE_METRICS_INTERVAL_S) if remote else None,
        )
        self.backend = backend

    async def _async_update_data(self) -> MetricsSnapshot:
        """A fresh snapshot: the server is asked; the engine pushes, so this reads its last."""
        try:
            return await self.backend.async_refresh_metrics()
        except BackendError as err:
            if err.key == "server_auth_failed":
                # The server's key changed while the entry ran: ask for the new one.
                raise ConfigEntryAuthFailed(
                    translation_domain=DOMAIN,
                    translation_key=err.key,
                    translation_placeholders={"reason": err.reason},
                ) from err
            # A server away or loading is no failure (the backend logs it once); anything
            # else the coordinator logs once and marks the sensors unavailable.
            raise UpdateFailed(
                translation_domain=DOMAIN,
                translation_key=err.key,
                translation_placeholders={"reason": err.reason, **err.placeholders},
            ) from err
