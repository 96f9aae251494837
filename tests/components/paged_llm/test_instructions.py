"""Default instructions: the current date and time, and no claims of control without tools."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any
from unittest.mock import patch

import pytest
from freezegun.api import FrozenDateTimeFactory
from homeassistant.components import conversation
from homeassistant.const import CONF_LLM_HASS_API, CONF_PROMPT
from homeassistant.core import Context, HomeAssistant
from homeassistant.helpers import llm
from homeassistant.util import dt as dt_util
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.paged_llm.prompt import DEFAULT_INSTRUCTIONS, NO_CONTROL_INSTRUCTION
from paged_llm.engine.llm_engine import RequestOutput
from tests.components.paged_llm.test_conversation import (
    TOOL_TEMPLATE,
    _conversation_entity_id,
    _WeatherAPI,
    _WeatherTool,
)


@pytest.fixture
def conversation_options() -> dict[str, Any]:
    """An agent with the default instructions a new agent gets."""
    return {CONF_PROMPT: DEFAULT_INSTRUCTIONS, "max_tokens": 4, "temperature": 0.0}


async def _rendered_prompt(hass: HomeAssistant, entry: MockConfigEntry, text: str) -> str:
    """Ask the agent once; return the prompt text the chat template rendered."""
    engine = entry.runtime_data.backend.engine
    seen: list[tuple[Any, Any]] = []
    real_generate = engine.generate

    def observed(prompt: Any, *args: Any, **kwargs: Any) -> AsyncIterator[RequestOutput]:
        seen.append((prompt, kwargs.get("tools")))
        return real_generate(prompt, *args, **kwargs)

    with patch.object(engine, "generate", observed):
        await conversation.async_converse(
            hass, text, None, Context(), agent_id=_conversation_entity_id(hass, entry)
        )
    prompt, tools = seen[0]
    ids = await engine.tokenize(prompt, tools)
    return str(engine.tokenizer.decode(ids))


async def test_bundled_template_gets_the_time_and_the_no_control_sentence(
    hass: HomeAssistant, init_integration: MockConfigEntry, freezer: FrozenDateTimeFactory
) -> None:
    freezer.move_to("2026-11-30 18:05:00+00:00")
    rendered = await _rendered_prompt(hass, init_integration, "What time is it?")
    now = dt_util.now()
    assert f"It is now {now.strftime('%A, %d %B %Y, %H:%M')}." in rendered
    assert NO_CONTROL_INSTRUCTION in rendered
    # The bundled SmolLM2 template puts it in the system turn, before the question.
    assert rendered.index(NO_CONTROL_INSTRUCTION) < rendered.index("What time is it?")


async def test_tool_template_with_an_api_gets_the_time_but_not_the_no_control_sentence(
    hass: HomeAssistant, init_integration: MockConfigEntry, freezer: FrozenDateTimeFactory
) -> None:
    freezer.move_to("2026-11-30 07:30:00+00:00")
    entry = init_integration
    unregister = llm.async_register_api(hass, _WeatherAPI(hass, _WeatherTool()))
    subentry = next(s for s in entry.subentries.values() if s.subentry_type == "conversation")
    hass.config_entries.async_update_subentry(
        entry, subentry, data={**subentry.data, CONF_LLM_HASS_API: ["weather_api"]}
    )
    # With the reloaded agent's warm-up, which must not mix with what is observed.
    await hass.async_block_till_done(wait_background_tasks=True)
    tokenizer = entry.runtime_data.backend.engine.tokenizer
    original = tokenizer.chat_template
    tokenizer.chat_template = TOOL_TEMPLATE
    try:
        rendered = await _rendered_prompt(hass, entry, "Turn on the kitchen lights")
    finally:
        tokenizer.chat_template = original
        unregister()
    assert f"It is now {dt_util.now().strftime('%A, %d %B %Y, %H:%M')}." in rendered
    assert NO_CONTROL_INSTRUCTION not in rendered
    assert '"name": "get_weather"' in rendered


async def test_an_empty_prompt_still_gets_the_defaults(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    entry = init_integration
    subentry = next(s for s in entry.subentries.values() if s.subentry_type == "conversation")
    hass.config_entries.async_update_subentry(entry, subentry, data={"max_tokens": 4})
    # With the reloaded agent's warm-up, which must not mix with what is observed.
    await hass.async_block_till_done(wait_background_tasks=True)
    rendered = await _rendered_prompt(hass, entry, "Hello")
    assert "It is now " in rendered
    assert NO_CONTROL_INSTRUCTION in rendered
