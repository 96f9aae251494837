"""The home grammar: Assist's tool calls can name only what exists in the home."""

from __future__ import annotations

import json
from typing import Any
from unittest.mock import patch

import pytest
from homeassistant.components import conversation
from homeassistant.const import CONF_LLM_HASS_API
from homeassistant.core import Context, HomeAssistant
from homeassistant.helpers import entity_registry as er
from homeassistant.helpers import intent, llm
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.paged_llm.backend import Sampling
from custom_components.paged_llm.const import CONF_HOME_GRAMMAR, DOMAIN
from custom_components.paged_llm.home_grammar import (
    MAX_VALUES,
    Home,
    async_get_home,
    grammar_tools,
)
from custom_components.paged_llm.prompt import format_tool
from custom_components.paged_llm.tool_calls import parse_tool_calls
from paged_llm.engine.core.sequence import SamplingParams
from paged_llm.engine.structured.tool_grammar import ToolCallFormat, tool_call_structural_tag

ASSISTANT = conversation.DOMAIN


async def _assist_tools(hass: HomeAssistant) -> list[llm.Tool]:
    """The tools Home Assistant's Assist API offers a conversation agent."""
    api = await llm.async_get_api(
        hass,
        llm.LLM_API_ASSIST,
        llm.LLMContext(
            platform=DOMAIN,
            context=Context(),
            language="en",
            assistant=ASSISTANT,
            device_id=None,
        ),
    )
    return list(api.tools)


def _properties(tools: list[dict[str, Any]], name: str) -> dict[str, Any]:
    """The argument schemas of the named tool (``intent__HassTurnOn`` for HassTurnOn)."""
    spec = next(t["function"] for t in tools if t["function"]["name"].split("__")[-1] == name)
    properties: dict[str, Any] = spec["parameters"].get("properties", {})
    return properties


async def test_assist_intents_name_only_what_the_home_has(
    hass: HomeAssistant, small_home: None
) -> None:
    """Names and aliases of exposed entities; every area and floor; present domains only."""
    home = async_get_home(hass, ASSISTANT)
    assert "Ceiling light" in home.names
    assert "big lamp" in home.names
    assert "Desk lamp 寝室" in home.names
    assert "Front door" not in home.names  # not exposed
    assert set(home.areas) == {"Kitchen", "Küche", "Bedroom", 'Kid\'s "den" 🦖'}
    assert set(home.floors) == {"Ground floor", "downstairs", "Attic"}
    assert set(home.domains) == {"light", "sensor"}
    assert home.device_classes == ("temperature",)

    tools = await _assist_tools(hass)
    formatted = [format_tool(tool, llm.selector_serializer) for tool in tools]
    shown = json.dumps(formatted)
    held = grammar_tools(tools, formatted, home)
    assert json.dumps(formatted) == shown  # what the model is shown is not changed
    turn_on = _properties(held, intent.INTENT_TURN_ON)
    assert turn_on["name"]["enum"] == list(home.names)
    assert turn_on["area"]["enum"] == list(home.areas)
    assert turn_on["floor"]["enum"] == list(home.floors)
    assert set(turn_on["domain"]["items"]["enum"]) <= {"light", "sensor"}
    assert _properties(held, intent.INTENT_CANCEL_ALL_TIMERS)["area"]["enum"] == list(home.areas)
    live = _properties(held, "GetLiveContext")  # its filters: a string or a list of them
    assert live["name"]["enum"] == list(home.names)
    assert [
        option.get("enum") or option["items"]["enum"] for option in live["domain"]["anyOf"]
    ] == [
        ["light", "sensor"],
        ["light", "sensor"],
    ]
    # A timer's name is its own, free text.
    handler = next(h for h in intent.async_get(hass) if h.intent_type == intent.INTENT_START_TIMER)
    timer_tool = llm.IntentTool(intent.INTENT_START_TIMER, handler)
    (timer,) = grammar_tools([timer_tool], [format_tool(timer_tool, llm.selector_serializer)], home)
    timer_slots = timer["function"]["parameters"]["properties"]
    assert timer_slots["name"] == {"type": "string"}
    # Every intent tool that takes a device class keeps only classes the home has.
    for spec in held:
        device_class = spec["function"]["parameters"].get("properties", {}).get("device_class")
        if device_class is not None:
            assert set(device_class["items"]["enum"]) <= {"temperature"}


def test_a_home_with_more_names_than_a_grammar_compiles_quickly_leaves_them_free() -> None:
    """Past MAX_VALUES names the slot stays a free string (compiling it took seconds)."""
    tool = llm.IntentTool(
        intent.INTENT_TURN_ON, intent.ServiceIntentHandler("HassTurnOn", "homeassistant", "turn_on")
    )
    formatted = [format_tool(tool, llm.selector_serializer)]
    names = tuple(f"Lamp {i}" for i in range(MAX_VALUES + 1))
    held = grammar_tools([tool], formatted, Home(names, ("Kitchen",), (), ("light",), ()))
    properties = _properties(held, intent.INTENT_TURN_ON)
    assert properties["name"] == {"type": "string"}
    assert properties["area"]["enum"] == ["Kitchen"]


def test_a_home_with_nothing_exposed_drops_the_targets_it_cannot_fill() -> None:
    """No names: an optional ``name`` is dropped rather than left impossible to fill."""
    tool = llm.IntentTool(
        intent.INTENT_TURN_ON, intent.ServiceIntentHandler("HassTurnOn", "homeassistant", "turn_on")
    )
    formatted = [format_tool(tool, llm.selector_serializer)]
    held = grammar_tools([tool], formatted, Home((), ("Kitchen",), (), (), ()))
    properties = _properties(held, intent.INTENT_TURN_ON)
    assert "name" not in properties
    assert "floor" not in properties
    assert properties["area"]["enum"] == ["Kitchen"]


async def test_forced_calls_under_the_home_grammar_name_exposed_entities(
    hass: HomeAssistant, small_home: None, init_integration: MockConfigEntry
) -> None:
    """A random model made to call HassTurnOn names only the home's, in every format.

    The home has thousands of names, with quotes, emoji and other scripts, and repeats.
    """
    tools = await _assist_tools(hass)
    tool = next(t for t in tools if t.name.split("__")[-1] == intent.INTENT_TURN_ON)
    formatted = [format_tool(tool, llm.selector_serializer)]
    many = [f'Lamp {i} "{"ÄЖ寝🦖"[i % 4]}"' for i in range(3000)] + ["Lamp 1", "Lamp 1"]
    home = Home(tuple(sorted(set(many))), ("Kitchen",), ("Attic",), ("light",), ())
    held = grammar_tools([tool], formatted, home)
    engine = init_integration.runtime_data.backend.engine
    prompt = [{"role": "user", "content": "Turn on the lamp"}]
    for fmt in ToolCallFormat:
        tag = tool_call_structural_tag(held, fmt, tool_choice="required")
        params = SamplingParams(temperature=1.0, seed=7, max_tokens=96, structural_tag=tag)
        text = ""
        async for out in engine.generate(prompt, params, "interactive"):
            text += out.text
        _content, calls = parse_tool_calls(text, {tool.name})
        assert calls, (fmt, text)
        for call in calls:
            args = call.tool_args
            assert set(args) <= {"name", "area", "floor", "domain"}, args
            assert args.get("name", "Lamp 1") in home.names
            assert args.get("area", "Kitchen") == "Kitchen"
            assert args.get("floor", "Attic") == "Attic"


async def test_the_agent_holds_its_calls_to_the_home_unless_turned_off(
    hass: HomeAssistant, small_home: None, init_integration: MockConfigEntry
) -> None:
    """The conversation agent's grammar carries the home's names; the option turns it off."""
    entry = init_integration
    subentry = next(s for s in entry.subentries.values() if s.subentry_type == "conversation")
    agent_id = er.async_get(hass).async_get_entity_id("conversation", DOMAIN, subentry.subentry_id)
    engine = entry.runtime_data.backend.engine
    real_generate = engine.generate

    async def names_in_grammar(options: dict[str, Any]) -> list[str] | None:
        """Converse once with these agent options; the name enum HassTurnOn was held to."""
        hass.config_entries.async_update_subentry(
            entry, subentry, data={**subentry.data, **options}
        )
        await hass.async_block_till_done()
        seen: list[SamplingParams] = []

        def observed(prompt: Any, params: Any, *args: Any, **kwargs: Any) -> Any:
            seen.append(params)
            return real_generate(prompt, params, *args, **kwargs)

        with patch.object(engine, "generate", observed):
            await conversation.async_converse(hass, "Lights on", None, Context(), agent_id=agent_id)
        # The reloaded agent's prefix warm-up may come first; it is held to nothing.
        tag = json.loads(next(p.structural_tag for p in seen if p.structural_tag))
        for call in tag["format"]["tags"]:
            if f'__{intent.INTENT_TURN_ON}"' in call["begin"]:  # intent__HassTurnOn
                enum: list[str] | None = call["content"]["json_schema"]["properties"]["name"].get(
                    "enum"
                )
                return enum
        raise AssertionError("HassTurnOn was not offered")

    on = {CONF_LLM_HASS_API: [llm.LLM_API_ASSIST]}
    assert await names_in_grammar(on) == list(async_get_home(hass, ASSISTANT).names)
    assert await names_in_grammar({**on, CONF_HOME_GRAMMAR: False}) is None


async def test_a_narrowed_grammar_that_cannot_compile_falls_back_to_the_plain_tools(
    hass: HomeAssistant, init_integration: MockConfigEntry, caplog: pytest.LogCaptureFixture
) -> None:
    """No request fails on the home grammar; the cause is logged once, not per request."""
    backend = init_integration.runtime_data.backend
    plain = {
        "type": "function",
        "function": {
            "name": "HassTurnOn",
            "parameters": {"type": "object", "properties": {"name": {"type": "string"}}},
        },
    }
    refused = {
        "type": "function",
        "function": {
            "name": "HassTurnOn",
            "parameters": {"type": "object", "properties": {"name": {"$ref": "#/nowhere"}}},
        },
    }
    sampling = Sampling(max_tokens=8, temperature=0, tool_grammar=[refused], plain_tools=[plain])
    for _ in range(2):
        params = await backend._constrain(SamplingParams(max_tokens=8), sampling)
        tag = json.loads(params.structural_tag)
        (call,) = tag["format"]["tags"]
        assert call["content"]["json_schema"] == plain["function"]["parameters"]
    refusals = [r for r in caplog.records if "refused a constraint" in r.getMessage()]
    assert len(refusals) == 1
