"""A conversation agent's prompt budget: its tokens against the context, and the first word's wait.

The agent's warm-up (warmup.py) counts and times the prompt each turn starts with; this
module holds those figures, tells the agent's sensor, and raises or clears its Repairs
issues: a prompt that does not fit, one that is slow to read, one a server cuts short.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from homeassistant.components import conversation
from homeassistant.components.homeassistant.llm import async_get_exposed_entities
from homeassistant.config_entries import ConfigSubentry
from homeassistant.const import CONF_LLM_HASS_API
from homeassistant.core import HomeAssistant, callback
from homeassistant.helpers import issue_registry as ir
from homeassistant.helpers.dispatcher import async_dispatcher_send

from .const import DOMAIN, PROMPT_SLOW_S
from .runtime import PagedLLMConfigEntry

# Below this many uncached tokens a request's fixed costs (templating, a scheduler step, an
# HTTP round trip) weigh more than the reading itself: no prefill speed is read from it.
MIN_RATE_TOKENS = 64
# How far a server's reported prompt tokens may fall below the count here before the server
# is taken to cut the prompt. Counted by the model's tokenizer, only the template's edges
# can differ: 5%. Estimated at 3 bytes a token, the count runs over real tokenizers (3.5
# to 4.5 bytes a token of English, fewer for JSON) by up to half again; a report under half
# the estimate would need 6 bytes a token, which no tokenizer reads from such a prompt. So
# Ollama's cut at 4,096 tokens is caught exactly when /tokenize exists, and otherwise once
# the prompt is about twice the window.
EXACT_TOLERANCE = 0.05
ESTIMATE_TOLERANCE = 0.5

ISSUE_TOO_LONG = "prompt_too_long"
ISSUE_SLOW = "prompt_slow"
ISSUE_TRUNCATED = "prompt_truncated"
ISSUES = (ISSUE_TOO_LONG, ISSUE_SLOW, ISSUE_TRUNCATED)


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


def prefill_rate(prompt_tokens: int, cached_tokens: int, seconds: float) -> float | None:
    """Uncached prompt tokens read per second by a one-token request; None from too few."""
    uncached = prompt_tokens - cached_tokens
    if uncached < MIN_RATE_TOKENS or seconds <= 0:
        return None
    return uncached / seconds


@callback
def count_exposed_entities(hass: HomeAssistant, settings: Mapping[str, Any]) -> int:
    """Entities the prompt lists: those exposed to Assist, when the agent has an LLM API.

    Home Assistant's own list for the Assist API's prompt (exposed, less calendars and
    scripts, which have tools of their own), so the count is what the prompt holds.
    """
    if not settings.get(CONF_LLM_HASS_API):
        return 0
    return len(async_get_exposed_entities(hass, conversation.DOMAIN, include_state=False))


def budget_signal(subentry_id: str) -> str:
    """The dispatcher signal an agent's budget sensor listens to."""
    return f"{DOMAIN}_prompt_budget_{subentry_id}"


def issue_id(kind: str, subentry_id: str) -> str:
    """One agent's issue of one kind (each agent has its own prompt)."""
    return f"{kind}_{subentry_id}"


@callback
def async_publish_budget(
    hass: HomeAssistant, entry: PagedLLMConfigEntry, subentry: ConfigSubentry, budget: PromptBudget
) -> None:
    """Keep an agent's budget, update its sensor, and raise or clear its Repairs issues."""
    entry.runtime_data.budgets[subentry.subentry_id] = budget
    async_dispatcher_send(hass, budget_signal(subentry.subentry_id))
    common = {
        "agent": subentry.title,
        "tokens": str(budget.prompt_tokens),
        "entities": str(budget.exposed_entities),
    }
    uncached = budget.first_token_uncached_s
    wanted = {
        ISSUE_TOO_LONG: (
            not budget.fits,
            {"context": str(budget.context_size), "answer": str(budget.answer_tokens)},
        ),
        ISSUE_SLOW: (
            budget.slow,
            {"seconds": f"{uncached or 0:.1f}", "threshold": f"{PROMPT_SLOW_S:g}"},
        ),
        ISSUE_TRUNCATED: (
            budget.truncated,
            {"reported": str(budget.server_prompt_tokens), "counted": str(budget.counted_tokens)},
        ),
    }
    for kind, (active, placeholders) in wanted.items():
        if not active:
            ir.async_delete_issue(hass, DOMAIN, issue_id(kind, subentry.subentry_id))
            continue
        ir.async_create_issue(
            hass,
            DOMAIN,
            issue_id(kind, subentry.subentry_id),
            is_fixable=False,
            severity=ir.IssueSeverity.WARNING,
            translation_key=kind,
            translation_placeholders=common | placeholders,
        )


@callback
def async_clear_budget(hass: HomeAssistant, entry: PagedLLMConfigEntry, subentry_id: str) -> None:
    """Forget an agent's budget and delete its issues (the agent is removed or reloading)."""
    data = getattr(entry, "runtime_data", None)
    if data is not None:
        data.budgets.pop(subentry_id, None)
    async_dispatcher_send(hass, budget_signal(subentry_id))
    for kind in ISSUES:
        ir.async_delete_issue(hass, DOMAIN, issue_id(kind, subentry_id))
