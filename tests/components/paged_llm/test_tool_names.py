"""Tool names as Home Assistant 2026.11 gives them, from the prompt to the call and back.

Assist's tools carry their integration's domain (``intent__HassTurnOn``,
``homeassistant__GetLiveContext``, ``llm__GetDateTime``); since 2026.11 a merged API
keeps every name as it is and puts ``<api>__`` only before names that two APIs share
(2026.10 put every merged tool under its API's name: ``assist__intent__HassTurnOn``).
"""

from __future__ import annotations

import json
from typing import Any

import probatio
from homeassistant.components import conversation
from homeassistant.components.conversation import async_get_chat_log
from homeassistant.const import CONF_LLM_HASS_API
from homeassistant.core import Context, HomeAssistant
from homeassistant.helpers import chat_session, intent, llm
from pytest_homeassistant_custom_component.common import MockConfigEntry, async_mock_service

from custom_components.paged_llm.const import DOMAIN
from custom_components.paged_llm.home_grammar import async_get_home, grammar_tools, targets_home
from custom_components.paged_llm.prompt import format_tool
from custom_components.paged_llm.tool_calls import parse_tool_calls
from custom_components.paged_llm.warmup import async_render_agent_prompt
from paged_llm.engine.structured.tool_grammar import ToolCallFormat, tool_call_structural_tag
from tests.components.paged_llm.test_conversation import _conversation_entity_id, _StandInEngine

ASSISTANT = conversation.DOMAIN


def _context() -> llm.LLMContext:
    return llm.LLMContext(
        platform=DOMAIN, context=Context(), language="en", assistant=ASSISTANT, device_id=None
    )


class _Tool(llm.Tool):
    """A tool of another API, named as it likes."""

    parameters = probatio.Schema({probatio.Optional("name"): str})
    integration = DOMAIN

    def __init__(self, name: str) -> None:
        self.name = name
        self.description = f"The other API's {name}"

    async def async_call(
        self, hass: HomeAssistant, tool_input: llm.ToolInput, llm_context: llm.LLMContext
    ) -> dict[str, Any]:
        return {}


class _OtherAPI(llm.API):
    """An LLM API beside Assist, its tools named by the test."""

    def __init__(self, hass: HomeAssistant, names: list[str]) -> None:
        super().__init__(hass=hass, id="other_api", name="Other API")
        self.names = names

    async def async_get_api_instance(self, llm_context: llm.LLMContext) -> llm.APIInstance:
        tools: list[llm.Tool] = [_Tool(name) for name in self.names]
        return llm.APIInstance(self, "Other tools.", llm_context, tools)


async def test_assist_tools_carry_their_integrations_domain(
    hass: HomeAssistant, small_home: None
) -> None:
    """The names 2026.11 gives Assist's tools, alone and merged with an API not clashing."""
    api = await llm.async_get_api(hass, llm.LLM_API_ASSIST, _context())
    names = [tool.name for tool in api.tools]
    assert "intent__HassTurnOn" in names
    assert "homeassistant__GetLiveContext" in names
    assert all("__" in name for name in names), names

    llm.async_register_api(hass, _OtherAPI(hass, ["HassTurnOn", "get_weather"]))
    merged = await llm.async_get_api(hass, [llm.LLM_API_ASSIST, "other_api"], _context())
    assert [tool.name for tool in merged.tools] == [*names, "HassTurnOn", "get_weather"]
    # The prompt names each API's tools as the model must call them.
    assert "(homeassistant__GetLiveContext, intent__HassTurnOn" in merged.api_prompt
    # The home grammar finds Assist's intents by what they are, not by their names.
    home = async_get_home(hass, ASSISTANT)
    formatted = [format_tool(tool, llm.selector_serializer) for tool in merged.tools]
    held = {spec["function"]["name"]: spec for spec in grammar_tools(merged.tools, formatted, home)}
    turn_on = held["intent__HassTurnOn"]["function"]["parameters"]["properties"]
    assert turn_on["name"]["enum"] == list(home.names)
    other = held["HassTurnOn"]["function"]["parameters"]["properties"]
    assert "enum" not in other["name"]  # another API's tool of the same short name: free


async def test_clashing_merged_names_get_their_apis_prefix_and_stay_apart(
    hass: HomeAssistant, small_home: None
) -> None:
    """Two APIs offering ``intent__HassTurnOn``: each under its API, each called by that name."""
    llm.async_register_api(hass, _OtherAPI(hass, ["intent__HassTurnOn"]))
    merged = await llm.async_get_api(hass, [llm.LLM_API_ASSIST, "other_api"], _context())
    names = {tool.name for tool in merged.tools}
    assert {"assist__intent__HassTurnOn", "other-api__intent__HassTurnOn"} <= names
    assist = next(t for t in merged.tools if t.name == "assist__intent__HassTurnOn")
    assert targets_home(assist) == intent.INTENT_TURN_ON
    other = next(t for t in merged.tools if t.name == "other-api__intent__HassTurnOn")
    assert targets_home(other) is None

    # The grammar takes the prefixed names as they are, in every format.
    formatted = [format_tool(tool, llm.selector_serializer) for tool in merged.tools]
    for fmt in ToolCallFormat:
        tag = tool_call_structural_tag(formatted, fmt)
        assert tag is not None
        begins = [t["begin"] for t in tag["format"]["tags"]]
        assert any('"assist__intent__HassTurnOn"' in begin for begin in begins), begins

    call = '<tool_call>\n{"name": "%s", "arguments": {"name": "Ceiling light"}}\n</tool_call>'
    _text, calls = parse_tool_calls(call % "assist__intent__HassTurnOn", names)
    assert [c.tool_name for c in calls] == ["assist__intent__HassTurnOn"]
    # Which of the two a bare name means cannot be told: it stays as written.
    _text, calls = parse_tool_calls(call % "HassTurnOn", names)
    assert [c.tool_name for c in calls] == ["HassTurnOn"]


async def test_a_call_without_the_domain_reaches_the_assist_tool(
    hass: HomeAssistant, small_home: None, init_integration: MockConfigEntry
) -> None:
    """A model that writes ``HassTurnOn`` (as older releases named it) still turns the light on."""
    entry = init_integration
    subentry = next(s for s in entry.subentries.values() if s.subentry_type == "conversation")
    hass.config_entries.async_update_subentry(
        entry, subentry, data={**subentry.data, CONF_LLM_HASS_API: [llm.LLM_API_ASSIST]}
    )
    await hass.async_block_till_done(wait_background_tasks=True)
    entity_id = _conversation_entity_id(hass, entry)
    turned_on = async_mock_service(hass, "light", "turn_on")
    real = entry.runtime_data.backend.engine
    stand_in = _StandInEngine(
        real,
        [
            ['<tool_call>\n{"name": "HassTurnOn", ', '"arguments": {"name": "Ceiling light"}}'],
            ["The ceiling light is on."],
        ],
    )
    entry.runtime_data.backend.engine = stand_in  # type: ignore[assignment]
    try:
        with (
            chat_session.async_get_chat_session(hass, context=Context()) as session,
            async_get_chat_log(hass, session) as chat_log,
        ):
            result = await conversation.async_converse(
                hass,
                "Turn on the ceiling light",
                session.conversation_id,
                Context(),
                agent_id=entity_id,
            )
    finally:
        entry.runtime_data.backend.engine = real

    assert result.response.speech["plain"]["speech"] == "The ceiling light is on."
    assert [call.data["entity_id"] for call in turned_on] == [["light.test_ceiling"]]
    results = [c for c in chat_log.content if isinstance(c, conversation.ToolResultContent)]
    assert [r.tool_name for r in results] == ["intent__HassTurnOn"]
    # The model was shown the real name, and sees its call under that name afterwards.
    assert '"name": "intent__HassTurnOn"' in stand_in.prompts[0][0]["content"]
    assert json.dumps("intent__HassTurnOn") in stand_in.prompts[1][-2]["content"]


async def test_the_warm_up_renders_the_prompt_of_an_admin_only_api(
    hass: HomeAssistant, small_home: None, init_integration: MockConfigEntry, hass_owner_user: Any
) -> None:
    """2026.11's Home Assistant API serves admins only; the warm-up renders it as the owner."""
    entry = init_integration
    subentry = next(s for s in entry.subentries.values() if s.subentry_type == "conversation")
    apis = [llm.LLM_API_ASSIST, llm.LLM_API_HOME_ASSISTANT]
    assert next(
        a for a in llm.async_get_apis(hass) if a.id == llm.LLM_API_HOME_ASSISTANT
    ).requires_admin
    messages, _tools = await async_render_agent_prompt(
        hass, entry, {**subentry.data, CONF_LLM_HASS_API: apis}
    )
    assert '"name": "intent__HassTurnOn"' in messages[0]["content"]
