"""What a loaded entry holds, the hand-over of test-loaded backends, and error translation."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from homeassistant.config_entries import ConfigEntry
from homeassistant.core import HomeAssistant
from homeassistant.exceptions import HomeAssistantError, ServiceValidationError
from homeassistant.helpers.update_coordinator import DataUpdateCoordinator
from homeassistant.util.hass_dict import HassKey

from paged_llm.protocol.snapshot import MetricsSnapshot

from .backend import Backend, BackendError
from .const import DOMAIN

if TYPE_CHECKING:
    from .prompt_budget import PromptBudget

type PagedLLMConfigEntry = ConfigEntry[PagedLLMData]

# Backends the config flow started while testing, waiting for their entry's setup.
DATA_PENDING_BACKENDS: HassKey[dict[str, Backend]] = HassKey(f"{DOMAIN}_pending_backends")


@dataclass
class PagedLLMData:
    """What a loaded entry holds: the backend, the data it started from, the metrics."""

    backend: Backend
    # The entry data the backend was started with; a change restarts it.
    settings: dict[str, Any]
    coordinator: DataUpdateCoordinator[MetricsSnapshot]
    # The backend's service device, which the agents' devices hang off.
    device_id: str
    # Serialises reloads of the agent platforms when subentries change.
    platform_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # Each conversation agent's prompt budget by subentry id, which its sensor shows.
    budgets: dict[str, PromptBudget] = field(default_factory=dict)
    # Uncached prompt tokens read per second, as an agent's warm-up last measured it; kept
    # here so agents reloading, or a prompt too long to send, still have a prediction.
    prefill_rate: float | None = None


def hand_over_backend(hass: HomeAssistant, unique_id: str, backend: Backend) -> None:
    """Keep a backend the config flow started so the new entry's setup need not load again."""
    previous = hass.data.setdefault(DATA_PENDING_BACKENDS, {}).pop(unique_id, None)
    if previous is not None:
        hass.async_create_background_task(previous.async_close(), f"{DOMAIN} stop unclaimed")
    hass.data[DATA_PENDING_BACKENDS][unique_id] = backend


def take_pending_backend(hass: HomeAssistant, unique_id: str | None) -> Backend | None:
    """The backend the config flow handed over for this entry, if any."""
    if unique_id is None:
        return None
    return hass.data.get(DATA_PENDING_BACKENDS, {}).pop(unique_id, None)


async def async_stop_pending_backends(hass: HomeAssistant) -> None:
    """Stop backends no entry claimed (Home Assistant is stopping)."""
    pending = hass.data.pop(DATA_PENDING_BACKENDS, {})
    for backend in pending.values():
        await backend.async_close()


def ha_error(err: BackendError) -> HomeAssistantError:
    """A translated Home Assistant error for a failed request."""
    cls = ServiceValidationError if err.caller else HomeAssistantError
    return cls(
        translation_domain=DOMAIN,
        translation_key=err.key,
        translation_placeholders={"reason": err.reason, **err.placeholders},
    )
