"""Warm the engine's prefix cache with a conversation agent's system prompt, and measure it.

The first voice query after a restart, or after the prompt changed, then finds the long
system prompt (instructions, the home's devices, the tools) already computed. Interactive
blocks are evicted last, so it stays cached while summaries run.

The same requests give the prompt's budget (prompt_budget.py): its exact size, the time to
read it cold (which gives the prefill speed) and the time to the first token once cached.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from homeassistant.components import conversation
from homeassistant.const import CONF_LLM_HASS_API, CONF_PROMPT
from homeassistant.core import Context, HomeAssistant
from homeassistant.helpers import llm

from .backend import Backend, Delta, Sampling
from .const import CONF_THINK, DEFAULT_THINK, DOMAIN, LOGGER, PRIORITY_CONVERSATION
from .entity import agent_sampling
from .prompt import agent_instructions, build_messages, format_tool
from .prompt_budget import count_exposed_entities, prefill_rate
from .remote import RemoteBackend
from .runtime import PagedLLMConfigEntry, PromptBudget

# A user turn after the system prompt: only the blocks before it are worth keeping.
WARMUP_USER_TEXT = "Hello"


async def _async_render_context(hass: HomeAssistant, api: Any) -> Context | None:
    """The context to render the prompt in: none, or the owner's for an admin-only API.

    Home Assistant 2026.11 gives an API that requires an admin (its own "Home Assistant"
    API) only to an admin user's turns, so a prompt rendered for no user would fail. The
    warm-up only renders the prompt (no tool runs); the owner's is the prompt such a turn
    gets.
    """
    chosen = {api} if isinstance(api, str) else set(api or ())
    if not any(known.requires_admin for known in llm.async_get_apis(hass) if known.id in chosen):
        return None
    owner = await hass.auth.async_get_owner()
    return Context(user_id=owner.id) if owner is not None else None


async def async_render_agent_prompt(
    hass: HomeAssistant, entry: PagedLLMConfigEntry, settings: Mapping[str, Any]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """The messages a conversation turn would send, as the agent builds them, and its tools."""
    chat_log = conversation.ChatLog(hass, f"{DOMAIN}-warmup")
    api = settings.get(CONF_LLM_HASS_API)
    context = llm.LLMContext(
        platform=DOMAIN,
        context=await _async_render_context(hass, api),
        language=hass.config.language,
        assistant=conversation.DOMAIN,
        device_id=None,
    )
    # The agent's own instructions (with the no-control sentence), so the prefix matches.
    instructions = agent_instructions(settings.get(CONF_PROMPT), bool(api))
    await chat_log.async_provide_llm_data(context, api, instructions)
    chat_log.content.append(conversation.UserContent(content=WARMUP_USER_TEXT))
    native_tools = entry.runtime_data.backend.native_tools
    tools = None
    if chat_log.llm_api:
        serializer = chat_log.llm_api.custom_serializer
        tools = [format_tool(tool, serializer) for tool in chat_log.llm_api.tools]
    messages = build_messages(chat_log.content, tools=tools, native_tools=native_tools)
    return messages, tools if native_tools else None


def _request_room(backend: Backend) -> int | None:
    """The most tokens one request can hold: the context, or a smaller KV pool.

    None where a server does not say its context: its fallback is a guess for splitting
    summaries, not a limit to report a prompt against.
    """
    if not backend.context_known:
        return None
    pool = backend.kv_pool_tokens
    return min(backend.context_size, pool) if pool else backend.context_size


async def _async_one_token(
    backend: Backend,
    messages: Sequence[Mapping[str, Any]],
    sampling: Sampling,
    tools: list[dict[str, Any]] | None,
) -> tuple[float, Delta]:
    """Run a one-token request: its seconds (the first token's: there is no other), last delta."""
    start = time.monotonic()
    last = Delta()
    async for delta in backend.stream(messages, sampling, PRIORITY_CONVERSATION, tools):
        last = delta
    return time.monotonic() - start, last


async def async_warm_prefix(
    hass: HomeAssistant, entry: PagedLLMConfigEntry, settings: Mapping[str, Any], last: str | None
) -> tuple[str | None, PromptBudget | None]:
    """Prefill the agent's prompt unless it equals ``last``, counting and timing it.

    Returns the prompt warmed (``last`` again when it could not be, so a later call tries
    again) and its budget (None when the prompt is unchanged or could not be counted).
    """
    # The conversation's own template switch, so the prompt is the one a turn sends. One
    # token: the prompt's prefill is what fills the cache (a server's too).
    thinking = bool(settings.get(CONF_THINK, DEFAULT_THINK))
    sampling = agent_sampling(settings, max_tokens=1, temperature=0.0, thinking=thinking)
    try:
        # Held from here: the entry may unload while this runs, and take runtime_data along.
        data = entry.runtime_data
        backend = data.backend
        prompt, tools = await async_render_agent_prompt(hass, entry, settings)
        key = repr((prompt, tools))
        if key == last:
            return last, None
        counted, exact = await backend.async_count_prompt_tokens(prompt, sampling, tools)
        budget = PromptBudget(
            prompt_tokens=counted,
            context_size=_request_room(backend),
            answer_tokens=agent_sampling(settings).max_tokens,
            exposed_entities=count_exposed_entities(hass, settings),
            counted_tokens=counted,
            counted_exactly=exact,
            remote=isinstance(backend, RemoteBackend),
            prefill_rate=data.prefill_rate,
        )
    except Exception as err:  # a cold cache is slower, never broken
        LOGGER.debug("Could not count the conversation agent's prompt: %s", err)
        return last, None
    if exact and not budget.fits:
        # The engine (or vLLM) would refuse it: nothing to warm; the last speed predicts.
        return key, budget
    try:
        cold_s, cold = await _async_one_token(backend, prompt, sampling, tools)
        # Again, now that the prompt is cached: the first token a voice query waits for.
        budget.first_token_cached_s, _ = await _async_one_token(backend, prompt, sampling, tools)
    except Exception as err:
        LOGGER.debug("Could not warm the prefix cache: %s", err)
        return last, budget
    if budget.remote:
        budget.note_server_count(cold.prompt_tokens)
    # Only a read of enough uncached tokens tells the speed; else the last one stands.
    rate = prefill_rate(cold.prompt_tokens or counted, cold.cached_tokens, cold_s)
    if rate is not None:
        data.prefill_rate = budget.prefill_rate = rate
    LOGGER.debug(
        "Warmed the prefix cache with the conversation agent's prompt: %d tokens (%d cached) "
        "in %.2f s, then %.2f s cached",
        cold.prompt_tokens,
        cold.cached_tokens,
        cold_s,
        budget.first_token_cached_s,
    )
    return key, budget
