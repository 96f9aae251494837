"""The one place requests meet the backend: entities and actions stream through here."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from homeassistant.core import HomeAssistant
from homeassistant.exceptions import HomeAssistantError

from .backend import BackendError, Delta, Sampling, ScoreQuery
from .const import LOGGER
from .errors import ha_error, one_error
from .runtime import PagedLLMConfigEntry


@dataclass
class Completion:
    """A finished request: its text and token counts."""

    text: str
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


async def async_stream(
    hass: HomeAssistant,
    entry: PagedLLMConfigEntry,
    messages: Sequence[Mapping[str, Any]],
    sampling: Sampling,
    priority: str,
    tools: list[dict[str, Any]] | None = None,
) -> AsyncIterator[Delta]:
    """Stream an answer from the entry's backend; failures become translated errors."""
    # No availability check first: a stopped engine says so itself, and a server that is
    # back answers at once, before the next metrics poll notices.
    backend = entry.runtime_data.backend
    with _translated(hass, entry):
        async for delta in backend.stream(messages, sampling, priority, tools):
            yield delta


@contextlib.contextmanager
def _translated(hass: HomeAssistant, entry: PagedLLMConfigEntry) -> Iterator[None]:
    """Turn a backend's failure into one translated error; a crashed engine is reloaded."""
    try:
        yield
    except BackendError as err:
        if err.restart:
            # The engine's step loop crashed: restart it rather than stay broken.
            LOGGER.error("The engine failed (%s); restarting it", err.reason)
            hass.config_entries.async_schedule_reload(entry.entry_id)
        raise ha_error(err) from err
    except HomeAssistantError:
        raise
    except Exception as err:
        raise one_error(err) from err


async def async_score(
    hass: HomeAssistant,
    entry: PagedLLMConfigEntry,
    queries: Sequence[ScoreQuery],
    priority: str,
) -> list[list[float]]:
    """Each query's continuations' log probabilities; failures become translated errors."""
    with _translated(hass, entry):
        return await entry.runtime_data.backend.async_score(queries, priority)


async def async_complete(
    hass: HomeAssistant,
    entry: PagedLLMConfigEntry,
    messages: Sequence[Mapping[str, Any]],
    sampling: Sampling,
    priority: str,
) -> Completion:
    """Run one request to the end."""
    parts: list[str] = []
    last = Delta()
    async for delta in async_stream(hass, entry, messages, sampling, priority):
        parts.append(delta.text)
        last = delta
    return Completion(
        text="".join(parts).strip(),
        finish_reason=last.finish_reason,
        prompt_tokens=last.prompt_tokens,
        completion_tokens=last.completion_tokens,
        cached_tokens=last.cached_tokens,
    )
