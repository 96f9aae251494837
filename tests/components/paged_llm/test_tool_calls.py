"""Tool-call parsing (Hermes/Qwen, Llama 3, Mistral), streaming hold-back and prompt building."""

from __future__ import annotations

import json

import pytest
from homeassistant.components import conversation
from homeassistant.exceptions import HomeAssistantError
from homeassistant.helpers import llm

from custom_components.paged_llm.prompt import build_messages, render_plain, trim_history
from custom_components.paged_llm.tool_calls import (
    ToolCallStream,
    parse_tool_calls,
    template_call_id,
)

TOOLS = {"HassTurnOn", "HassTurnOff", "get_weather"}


def _calls(text: str) -> tuple[str, list[tuple[str, dict]]]:
    content, calls = parse_tool_calls(text, TOOLS)
    return content, [(c.tool_name, c.tool_args) for c in calls]


def test_hermes_single_call_with_text_around() -> None:
    text = (
        "Turning it on.\n<tool_call>\n"
        '{"name": "HassTurnOn", "arguments": {"name": "kitchen light"}}\n'
        "</tool_call>"
    )
    assert _calls(text) == ("Turning it on.", [("HassTurnOn", {"name": "kitchen light"})])


def test_hermes_several_calls_and_string_arguments() -> None:
    text = (
        '<tool_call>{"name": "HassTurnOn", "arguments": "{\\"area\\": \\"kitchen\\"}"}</tool_call>'
        '<tool_call>{"name": "HassTurnOff", "arguments": {"area": "hall", "name": ""}}</tool_call>'
    )
    content, calls = _calls(text)
    assert content == ""
    # Empty optional values are dropped: intent tools reject them.
    assert calls == [("HassTurnOn", {"area": "kitchen"}), ("HassTurnOff", {"area": "hall"})]


def test_hermes_unterminated_block_at_the_end() -> None:
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}'
    assert _calls(text) == ("", [("get_weather", {"city": "Oslo"})])


def test_hermes_any_tool_name_is_passed_on() -> None:
    # An unknown tool goes to Home Assistant, which tells the model it does not exist.
    text = '<tool_call>{"name": "Nope", "arguments": {}}</tool_call>'
    assert _calls(text) == ("", [("Nope", {})])


def test_hermes_block_that_is_not_json_stays_text() -> None:
    text = "<tool_call>turn on the light</tool_call>"
    assert _calls(text) == (text, [])


def test_llama3_json_with_parameters() -> None:
    text = '{"name": "get_weather", "parameters": {"city": "Paris"}}'
    assert _calls(text) == ("", [("get_weather", {"city": "Paris"})])


def test_llama3_python_tag_and_several_calls() -> None:
    text = (
        '<|python_tag|>{"name": "HassTurnOn", "parameters": {"name": "fan"}}; '
        '{"name": "HassTurnOff", "parameters": {"name": "lamp"}}'
    )
    assert _calls(text) == (
        "",
        [("HassTurnOn", {"name": "fan"}), ("HassTurnOff", {"name": "lamp"})],
    )


def test_bare_json_naming_no_offered_tool_is_an_answer() -> None:
    text = '{"name": "Ada", "age": 36}'
    assert _calls(text) == (text, [])


def test_json_answer_that_is_not_a_call_is_kept() -> None:
    text = "[1, 2, 3] is the list you asked for"
    assert _calls(text) == (text, [])


def test_mistral_array_after_marker() -> None:
    text = (
        '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Rome"}, "id": "a1b2c3d4e"}]'
    )
    assert _calls(text) == ("", [("get_weather", {"city": "Rome"})])


def test_mistral_array_when_the_marker_was_decoded_away() -> None:
    # [TOOL_CALLS] is a special token that the detokenizer drops.
    text = ' [{"name": "HassTurnOff", "arguments": {"name": "tv"}}]'
    assert _calls(text) == ("", [("HassTurnOff", {"name": "tv"})])


def test_mistral_v11_name_args_form() -> None:
    text = (
        'Sure.[TOOL_CALLS]get_weather[ARGS]{"city": "Lima"}'
        '[TOOL_CALLS]HassTurnOn[ARGS]{"name": "porch"}'
    )
    assert _calls(text) == (
        "Sure.",
        [("get_weather", {"city": "Lima"}), ("HassTurnOn", {"name": "porch"})],
    )


def test_openai_style_function_object() -> None:
    call = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Bern"}}}
    text = f"<tool_call>{json.dumps(call)}</tool_call>"
    assert _calls(text) == ("", [("get_weather", {"city": "Bern"})])


def test_call_ids_suit_every_template() -> None:
    _, calls = parse_tool_calls('{"name": "get_weather", "arguments": {}}', TOOLS)
    assert len(calls[0].id) == 9
    assert calls[0].id.isalnum()
    ulid = "01JABCDEFGHJKMNPQRSTVWXYZ0"
    assert template_call_id(ulid) == template_call_id(ulid)
    assert len(template_call_id(ulid)) == 9
    assert template_call_id("abc123def") == "abc123def"


@pytest.mark.parametrize(
    ("text", "shown", "calls"),
    [
        ("Hello there, how are you?", "Hello there, how are you?", []),
        ("a < b and c <tool_x> d", "a < b and c <tool_x> d", []),
        (
            'Okay! <tool_call>{"name": "HassTurnOn", "arguments": {"name": "tv"}}</tool_call>',
            "Okay! ",
            [("HassTurnOn", {"name": "tv"})],
        ),
        (
            '  {"name": "get_weather", "parameters": {"city": "Oslo"}}',
            "",
            [("get_weather", {"city": "Oslo"})],
        ),
        ('{"answer": 42}', '{"answer": 42}', []),
        (
            '[TOOL_CALLS][{"name": "HassTurnOff", "arguments": {"name": "tv"}}]',
            "",
            [("HassTurnOff", {"name": "tv"})],
        ),
    ],
)
def test_stream_shows_text_and_holds_back_calls(
    text: str, shown: str, calls: list[tuple[str, dict]]
) -> None:
    stream = ToolCallStream(TOOLS)
    live = "".join(stream.feed(ch) for ch in text)
    final = stream.finish()
    assert live + final == shown if not calls else live.rstrip() + final == shown.rstrip()
    assert [(c.tool_name, c.tool_args) for c in stream.calls] == calls
    if calls:
        assert "<tool_call" not in live
        assert "[TOOL" not in live
        assert "{" not in live


def test_stream_releases_a_partial_marker_that_was_not_one() -> None:
    stream = ToolCallStream(TOOLS)
    assert stream.feed("value <tool") == "value "
    assert stream.feed("box> ok") == "<toolbox> ok"
    assert stream.finish() == ""


def _history() -> list[conversation.Content]:
    return [
        conversation.SystemContent("Be brief."),
        conversation.UserContent("Turn on the fan"),
        conversation.AssistantContent(
            agent_id="a",
            content="On it.",
            tool_calls=[
                llm.ToolInput(tool_name="HassTurnOn", tool_args={"name": "fan"}, id="01JULIDULID")
            ],
        ),
        conversation.ToolResultContent(
            agent_id="a",
            tool_call_id="01JULIDULID",
            tool_name="HassTurnOn",
            result=llm.ToolResult(data={"success": True}),
        ),
        conversation.AssistantContent(agent_id="a", content="The fan is on."),
        conversation.UserContent("Thanks"),
    ]


TOOL_SPECS = [
    {
        "type": "function",
        "function": {"name": "HassTurnOn", "parameters": {"type": "object", "properties": {}}},
    }
]


def test_messages_for_templates_that_know_tools() -> None:
    messages = build_messages(_history(), tools=TOOL_SPECS, native_tools=True)
    assert [m["role"] for m in messages] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "user",
    ]
    assert messages[0]["content"] == "Be brief."
    call = messages[2]["tool_calls"][0]
    assert call["function"] == {"name": "HassTurnOn", "arguments": {"name": "fan"}}
    assert call["id"] == messages[3]["tool_call_id"] == template_call_id("01JULIDULID")
    assert json.loads(messages[3]["content"]) == {"data": {"success": True}, "error": False}


def test_messages_for_templates_without_tools() -> None:
    messages = build_messages(_history(), tools=TOOL_SPECS, native_tools=False)
    assert [m["role"] for m in messages] == [
        "system",
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
    ]
    assert "<tools>" in messages[0]["content"]
    assert '"name": "HassTurnOn"' in messages[0]["content"]
    assert messages[2]["content"].startswith("On it.\n<tool_call>")
    assert messages[3]["content"].startswith("<tool_response>")
    assert all(set(m) == {"role", "content"} for m in messages)
    # What the model is told to write is what the parser reads back.
    _, calls = parse_tool_calls(messages[2]["content"], TOOLS)
    assert [(c.tool_name, c.tool_args) for c in calls] == [("HassTurnOn", {"name": "fan"})]


def test_attachments_are_refused() -> None:
    content = [
        conversation.SystemContent(""),
        conversation.UserContent(
            "What is this?",
            attachments=[
                conversation.Attachment(
                    media_content_id="media-source://x",
                    mime_type="image/png",
                    path=None,  # type: ignore[arg-type]
                )
            ],
        ),
    ]
    with pytest.raises(HomeAssistantError) as err:
        build_messages(content, tools=None, native_tools=False)
    assert err.value.translation_domain == "paged_llm"
    assert err.value.translation_key == "attachments_not_supported"


def test_json_instruction_goes_to_the_last_user_message() -> None:
    messages = build_messages(
        _history(), tools=None, native_tools=False, json_instruction="JSON please"
    )
    assert messages[-1]["content"] == "Thanks\n\nJSON please"


def test_trim_history_keeps_the_system_prompt_and_recent_rounds() -> None:
    history = _history()
    assert trim_history(history, 0) == history
    assert trim_history(history, 1) == history
    trimmed = trim_history([*history, conversation.UserContent("And again")], 1)
    assert trimmed[0] is history[0]
    assert [getattr(c, "content", None) for c in trimmed[1:]] == ["Thanks", "And again"]


def test_plain_transcript_for_models_without_chat_template() -> None:
    text = render_plain(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    )
    assert text == "Be brief.\nUser: Hi\nAssistant:"
