"""Constrained decoding through the agents: task structures and tool calls the model must fit."""

from __future__ import annotations

import json
from typing import Any
from unittest.mock import patch

import probatio
from homeassistant.components import ai_task, conversation
from homeassistant.config_entries import ConfigSubentry
from homeassistant.const import CONF_LLM_HASS_API
from homeassistant.core import Context, HomeAssistant
from homeassistant.helpers import entity_registry as er
from homeassistant.helpers import llm, selector
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.paged_llm.const import DOMAIN
from custom_components.paged_llm.prompt import format_tool
from custom_components.paged_llm.tool_calls import parse_tool_calls
from paged_llm.engine.core.sequence import SamplingParams
from paged_llm.engine.structured.tool_grammar import ToolCallFormat, tool_call_structural_tag

SWITCH = probatio.Schema({probatio.Required("on"): selector.BooleanSelector()})


def _entity_id(hass: HomeAssistant, entry: MockConfigEntry, domain: str, kind: str) -> str:
    subentry: ConfigSubentry = next(s for s in entry.subentries.values() if s.subentry_type == kind)
    entity_id = er.async_get(hass).async_get_entity_id(domain, DOMAIN, subentry.subentry_id)
    assert entity_id is not None
    return entity_id


async def test_a_random_model_held_to_the_structure_answers_valid_data(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    entity_id = _entity_id(hass, init_integration, "ai_task", "ai_task_data")
    result = await ai_task.async_generate_data(
        hass, task_name="switch", entity_id=entity_id, instructions="On?", structure=SWITCH
    )
    assert isinstance(result.data, dict)
    assert isinstance(result.data["on"], bool)


class _LightTool(llm.Tool):
    """A Home-Assistant-like tool with bounded arguments, so a random model can finish a call."""

    name = "HassLightSet"
    description = "Sets a light's brightness"
    parameters = probatio.Schema(
        {
            probatio.Required("name"): probatio.In(["hall", "kitchen"]),
            probatio.Required("brightness"): probatio.All(int, probatio.Range(min=0, max=100)),
        }
    )

    async def async_call(self, hass: HomeAssistant, tool_input: Any, llm_context: Any) -> Any:
        return {"ok": True}


class _LightAPI(llm.API):
    """An LLM API offering the light tool."""

    def __init__(self, hass: HomeAssistant) -> None:
        super().__init__(hass=hass, id="light_api", name="Light API")

    async def async_get_api_instance(self, llm_context: llm.LLMContext) -> llm.APIInstance:
        return llm.APIInstance(
            api=self, api_prompt="Use the tools.", llm_context=llm_context, tools=[_LightTool()]
        )


async def test_conversation_with_tools_decodes_under_a_tag_of_the_offered_tools(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    entry = init_integration
    unregister = llm.async_register_api(hass, _LightAPI(hass))
    subentry = next(s for s in entry.subentries.values() if s.subentry_type == "conversation")
    hass.config_entries.async_update_subentry(
        entry, subentry, data={**subentry.data, CONF_LLM_HASS_API: ["light_api"]}
    )
    # With the reloaded agent's warm-up, which must not mix with what is observed.
    await hass.async_block_till_done(wait_background_tasks=True)
    engine = entry.runtime_data.backend.engine
    seen: list[SamplingParams] = []
    real_generate = engine.generate

    def observed(prompt: Any, params: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(params)
        return real_generate(prompt, params, *args, **kwargs)

    try:
        with patch.object(engine, "generate", observed):
            await conversation.async_converse(
                hass,
                "Dim the hall",
                None,
                Context(),
                agent_id=_entity_id(hass, entry, "conversation", "conversation"),
            )
    finally:
        unregister()
    tag = json.loads(seen[0].structural_tag)
    (call,) = tag["format"]["tags"]
    # This template knows no tools: the Hermes format the system prompt teaches.
    assert tag["format"]["triggers"] == ["<tool_call>"]
    assert call["begin"] == '<tool_call>\n{"name": "HassLightSet", "arguments": '
    assert call["content"]["json_schema"]["properties"]["brightness"]["maximum"] == 100


async def test_every_forced_call_names_an_offered_tool_and_fits_its_schema(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    """A random model forced to call: each call parses back and validates, in each format."""
    engine = init_integration.runtime_data.backend.engine
    tool = _LightTool()
    tools = [format_tool(tool, llm.selector_serializer)]
    prompt = [{"role": "user", "content": "Set the hall light"}]
    for fmt in ToolCallFormat:
        tag = tool_call_structural_tag(tools, fmt, tool_choice="required")
        params = SamplingParams(temperature=0, max_tokens=64, structural_tag=tag)
        text = ""
        async for out in engine.generate(prompt, params, "interactive"):
            text += out.text
        _content, calls = parse_tool_calls(text, {tool.name})
        assert calls, (fmt, text)
        for call in calls:
            assert call.tool_name == tool.name
            tool.parameters(call.tool_args)
