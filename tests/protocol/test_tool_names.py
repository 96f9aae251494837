"""Called tool names mapped back to the offered tool, as Home Assistant 2026.11 names them."""

from __future__ import annotations

import pytest

from paged_llm.protocol.tool_calls import ToolCallStream, parse_tool_calls, resolve_tool_name

# The Assist API's tools in Home Assistant 2026.11 (helpers.llm, a test instance), and a
# merged API's plain tool.
OFFERED = {
    "homeassistant__GetLiveContext",
    "intent__HassTurnOn",
    "intent__HassTurnOff",
    "intent__HassCancelAllTimers",
    "llm__GetDateTime",
    "get_weather",
}


@pytest.mark.parametrize(
    ("called", "meant"),
    [
        ("intent__HassTurnOn", "intent__HassTurnOn"),  # as offered
        ("HassTurnOn", "intent__HassTurnOn"),  # the domain dropped (releases before 2026.9)
        ("GetLiveContext", "homeassistant__GetLiveContext"),
        ("assist__intent__HassTurnOn", "intent__HassTurnOn"),  # 2026.10's merged name
        ("assist__HassTurnOn", "intent__HassTurnOn"),  # the API's name for the domain
        ("weather_api__get_weather", "get_weather"),
        ("get_weather", "get_weather"),
        ("HassLightSet", "HassLightSet"),  # not offered: left for the caller to refuse
        ("intent__", "intent__"),
        ("__", "__"),
        ("", ""),
    ],
)
def test_a_called_name_resolves_to_the_offered_tool_it_means(called: str, meant: str) -> None:
    assert resolve_tool_name(called, OFFERED) == meant


def test_a_name_two_tools_end_with_stays_as_it_is() -> None:
    offered = {"assist__intent__HassTurnOn", "other-api__intent__HassTurnOn"}
    assert resolve_tool_name("intent__HassTurnOn", offered) == "intent__HassTurnOn"
    assert resolve_tool_name("HassTurnOn", offered) == "HassTurnOn"
    assert resolve_tool_name("assist__intent__HassTurnOn", offered) == "assist__intent__HassTurnOn"
    assert resolve_tool_name("HassTurnOn", set()) == "HassTurnOn"  # nothing offered


@pytest.mark.parametrize(
    "text",
    [
        '<tool_call>\n{"name": "HassTurnOn", "arguments": {"name": "lamp"}}\n</tool_call>',
        '{"name": "HassTurnOn", "parameters": {"name": "lamp"}}',  # Llama 3
        '[TOOL_CALLS][{"name": "HassTurnOn", "arguments": {"name": "lamp"}}]',
        '[TOOL_CALLS]HassTurnOn[ARGS]{"name": "lamp"}',  # Mistral v11
    ],
)
def test_every_format_hands_back_the_offered_name(text: str) -> None:
    _content, calls = parse_tool_calls(text, OFFERED)
    assert [(c.tool_name, c.tool_args) for c in calls] == [("intent__HassTurnOn", {"name": "lamp"})]
    stream = ToolCallStream(OFFERED)
    for piece in (text[:7], text[7:20], text[20:]):
        stream.feed(piece)
    stream.finish()
    assert [c.tool_name for c in stream.calls] == ["intent__HassTurnOn"]


def test_bare_json_naming_an_offered_tool_without_its_domain_is_a_call() -> None:
    """Bare JSON is a call only when it names an offered tool; a dropped domain still does."""
    content, calls = parse_tool_calls('{"name": "GetLiveContext", "parameters": {}}', OFFERED)
    assert (content, [c.tool_name for c in calls]) == ("", ["homeassistant__GetLiveContext"])
    answer = '{"name": "Ada", "parameters": {}}'
    assert parse_tool_calls(answer, OFFERED) == (answer, [])
