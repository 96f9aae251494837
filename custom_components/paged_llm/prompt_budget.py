"""A conversation agent's prompt budget published: its sensor told, its Repairs issues raised.

The agent's warm-up (warmup.py) counts and times the prompt each turn starts with; this
module keeps those figures (a PromptBudget, runtime.py) on the entry, tells the agent's
sensor, and raises or clears its Repairs issues: a prompt that does not fit, one that is
slow to read, one a server cuts short.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from homeassistant.components import conversation
from homeassistant.components.homeassistant.llm import async_get_exposed_entities
from homeassistant.config_entries import ConfigSubentry
from homeassistant.const import CONF_LLM_HASS_API
from homeassistant.core import HomeAssistant, callback
from homeassistant.helpers import issue_registry as ir
from homeassistant.helpers.dispatcher import async_dispatcher_send

from .const import DOMAIN, PROMPT_SLOW_S
from .runtime import PagedLLMConfigEntry, PromptBudget

# Below this many uncached tokens a request's fixed costs (templating, a scheduler step, an
# HTTP round trip) weigh more than the reading itself: no prefill speed is read from it.
MIN_RATE_TOKENS = 64

ISSUE_TOO_LONG = "prompt_too_long"
ISSUE_SLOW = "prompt_slow"
ISSUE_TRUNCATED = "prompt_truncated"
ISSUES = (ISSUE_TOO_LONG, ISSUE_SLOW, ISSUE_TRUNCATED)


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
