"""Warm the engine's prefix cache with a conversation agent's system prompt.

The first voice query after a restart, or after the prompt changed, then finds the long
system prompt (instructions, the home's devices, the tools) already computed. Interactive
blocks are evicted last, so it stays cached while summaries run.
"""

from __future__ import annotations

from typing import Any

from homeassistant.components import conversation
from homeassistant.const import CONF_LLM_HASS_API, CONF_PROMPT
from homeassistant.core import HomeAssistant
from homeassistant.helpers import llm

from .backend import Sampling
from .const import DOMAIN, LOGGER, PRIORITY_CONVERSATION
from .prompt import build_messages, format_tool
from .runtime import PagedLLMConfigEntry

# A user turn after the system prompt: only the blocks before it are worth keeping.
WARMUP_USER_TEXT = "Hello"


async def async_render_agent_prompt(
    hass: HomeAssistant, entry: PagedLLMConfigEntry, settings: dict[str, Any]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """The messages a conversation turn would send, as the agent builds them, and its tools."""
    chat_log = conversation.ChatLog(hass, f"{DOMAIN}-warmup")
    context = llm.LLMContext(
        platform=DOMAIN,
        context=None,
        language=hass.config.language,
        assistant=conversation.DOMAIN,
        device_id=None,
    )
    await chat_log.async_provide_llm_data(
        context, settings.get(CONF_LLM_HASS_API), settings.get(CONF_PROMPT)
    )
    chat_log.content.append(conversation.UserContent(content=WARMUP_USER_TEXT))
    native_tools = entry.runtime_data.backend.native_tools
    tools = None
    if chat_log.llm_api:
        serializer = chat_log.llm_api.custom_serializer
        tools = [format_tool(tool, serializer) for tool in chat_log.llm_api.tools]
    messages = build_messages(chat_log.content, tools=tools, native_tools=native_tools)
    return messages, tools if native_tools else None


async def async_warm_prefix(
    hass: HomeAssistant, entry: PagedLLMConfigEntry, settings: dict[str, Any], last: str | None
) -> str | None:
    """Prefill the agent's prompt once unless it equals ``last``; return the prompt warmed."""
    try:
        prompt, tools = await async_render_agent_prompt(hass, entry, settings)
        key = repr((prompt, tools))
        if key == last:
            return last
        # One token: the prompt's prefill is what fills the cache (a server's too).
        sampling = Sampling(max_tokens=1, temperature=0.0)
        backend = entry.runtime_data.backend
        async for _ in backend.stream(prompt, sampling, PRIORITY_CONVERSATION, tools):
            pass
    except Exception as err:  # a cold cache is slower, never broken
        LOGGER.debug("Could not warm the prefix cache: %s", err)
        return last
    LOGGER.debug("Warmed the prefix cache with the conversation agent's prompt")
    return key
