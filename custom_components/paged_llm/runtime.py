"""What a loaded entry holds, its agents' prompt budgets, and test-loaded backends' hand-over."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from homeassistant.config_entries import ConfigEntry
from homeassistant.core import HomeAssistant
from homeassistant.util.hass_dict import HassKey

from .backend import Backend
from .const import DOMAIN, PROMPT_SLOW_S
from .coordinator import PagedLLMCoordinator

type PagedLLMConfigEntry = ConfigEntry[PagedLLMData]

# Backends the config flow started while testing, waiting for their entry's setup.
DATA_PENDING_BACKENDS: HassKey[dict[str, Backend]] = HassKey(f"{DOMAIN}_pending_backends")

# How far a server's reported prompt tokens may fall below the count here before the server
# is taken to cut the prompt. Counted by the model's tokenizer, only the template's edges
# can differ: 5%. Estimated at 3 bytes a token, the count runs over real tokenizers (3.5
# to 4.5 bytes a token of English, fewer for JSON) by up to half again; a report under half
# the estimate would need 6 bytes a token, which no tokenizer reads from such a prompt. So
# Ollama's cut at 4,096 tokens is caught exactly when /tokenize exists, and otherwise once
# the prompt is about twice the window.
EXACT_TOLERANCE = 0.05
ESTIMATE_TOLERANCE = 0.5


@dataclass
class PagedLLMData:
    """What a loaded entry holds: the backend, the data it started from, the metrics."""

    backend: Backend
    # The entry data the backend was started with; a change restarts it.
    settings: dict[str, Any]
    coordinator: PagedLLMCoordinator
    # The backend's service device, which the agents' devices hang off.
    device_id: str
    # Serialises reloads of the agent platforms when subentries change.
    platform_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # Each conversation agent's prompt budget by subentry id, which its sensor shows.
    budgets: dict[str, PromptBudget] = field(default_factory=dict)
    # Uncached prompt tokens read per second, as an agent's warm-up last measured it; kept
    # here so agents reloading, or a prompt too long to send, still have a prediction.
    prefill_rate: float | None = None


@dataclass(slots=True)
class PromptBudget:
    """What a conversation agent's prompt costs: tokens against the context, time to read it."""

    # The prompt's size: the server's report, or the count here where the server cut it.
    prompt_tokens: int
    # The most tokens one request can hold: the model's context, or a smaller KV pool;
    # None where a server does not say (Ollama), so no fit is judged against a guess.
    context_size: int | None
    # The agent's answer limit (max_tokens): the request needs room for it too.
    answer_tokens: int
    # Entities exposed to Assist (they are listed in the prompt); 0 without an LLM API.
    exposed_entities: int
    # The count here, and whether the model's tokenizer made it (else a bytes estimate).
    counted_tokens: int
    counted_exactly: bool
    # Whether a server runs the model: it reports its own count, and may cut the prompt.
    remote: bool = False
    server_prompt_tokens: int | None = None
    truncated: bool = False
    # Prompt tokens read per second when nothing was cached, as last measured (any agent).
    prefill_rate: float | None = None
    # Measured: the same one-token request again, its prompt now in the prefix cache.
    first_token_cached_s: float | None = None

    @property
    def fits(self) -> bool:
        """Whether a turn's request (prompt and answer) fits in one request's room."""
        room = self.context_size
        return room is None or self.prompt_tokens + self.answer_tokens <= room

    @property
    def first_token_uncached_s(self) -> float | None:
        """Predicted: the whole prompt read at the last measured speed (None before one)."""
        return self.prompt_tokens / self.prefill_rate if self.prefill_rate else None

    @property
    def slow(self) -> bool:
        """Whether the first word, the prompt not cached, is predicted later than the limit."""
        seconds = self.first_token_uncached_s
        return seconds is not None and seconds > PROMPT_SLOW_S

    def note_server_count(self, reported: int) -> None:
        """Take the server's prompt tokens; a report clearly under the count means a cut."""
        if reported <= 0:  # a server that reports no usage
            return
        tolerance = EXACT_TOLERANCE if self.counted_exactly else ESTIMATE_TOLERANCE
        self.server_prompt_tokens = reported
        self.truncated = reported < self.counted_tokens * (1 - tolerance)
        # Cut, the report is what was left; the prompt itself is the count.
        self.prompt_tokens = self.counted_tokens if self.truncated else reported

    def attributes(self) -> dict[str, Any]:
        """The sensor's attributes: the context, its share, the entities, the waits."""
        uncached = self.first_token_uncached_s
        room = self.context_size
        attributes: dict[str, Any] = {
            "context_size": room,
            "context_share": round(100 * self.prompt_tokens / room, 1) if room else None,
            "exposed_entities": self.exposed_entities,
            "prefill_tokens_per_s": _rounded(self.prefill_rate, 1),
            "first_token_uncached_s": _rounded(uncached, 2),
            "first_token_cached_s": _rounded(self.first_token_cached_s, 2),
        }
        if self.remote:
            attributes |= {
                "server_prompt_tokens": self.server_prompt_tokens,
                "counted_tokens": self.counted_tokens,
                "counted_exactly": self.counted_exactly,
                "truncated": self.truncated,
            }
        return attributes


def _rounded(value: float | None, digits: int) -> float | None:
    """``value`` rounded, or None while unknown."""
    return None if value is None else round(value, digits)


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
