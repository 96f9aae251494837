"""The torch-free protocol: priorities, request checks, response shapes; the listen rule."""

from __future__ import annotations

import json
import logging

import pytest

from paged_llm.protocol.errors import ApiError
from paged_llm.protocol.priority import Priority, parse_priority, to_vllm
from paged_llm.protocol.requests import parse_chat_request, parse_completion_request
from paged_llm.protocol.responses import Usage, chat_chunk, chat_completion
from paged_llm.protocol.tool_calls import ToolCall, parse_tool_calls
from paged_llm.protocol.tool_prompt import tools_as_text
from paged_llm.server.settings import ServerSettings, is_loopback


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (-5, "interactive"), (0, "interactive"), (1, "automation"), (2, "background"),
        (100, "background"), ("BACKGROUND", "background"), (" automation ", "automation"),
        (1.0, "automation"),
    ],
)  # fmt: skip
def test_priority_from_vllm_integers_and_names(value: object, expected: str) -> None:
    assert parse_priority(value).label == expected


@pytest.mark.parametrize("value", [True, "urgent", 1.5, None, [1]])
def test_bad_priority_names_the_choices(value: object) -> None:
    with pytest.raises(ValueError, match="interactive, automation, background"):
        parse_priority(value)


def test_vllm_integer_round_trip() -> None:
    assert [parse_priority(to_vllm(p)) for p in Priority] == list(Priority)


def TEXT(text: str) -> dict[str, str]:
    return {"type": "text", "text": text}


CALL = {
    "id": "call_ULID0123456789",
    "type": "function",
    "function": {"name": "lights", "arguments": '{"on": true}'},
}
SCHEMA = {"name": "x", "schema": {"type": "object"}}
USER = [{"role": "user", "content": "x"}]


ON = {"parameters": {"type": "object", "properties": {"on": {"const": True}}}}


def test_chat_request_fields() -> None:
    request = parse_chat_request(
        {
            "model": "m",
            "messages": [
                {"role": "developer", "content": [TEXT("Be "), TEXT("brief.")]},
                {"role": "user", "content": "Lights?"},
                {"role": "assistant", "content": None, "tool_calls": [CALL]},
                {"role": "tool", "tool_call_id": "call_ULID0123456789", "content": "done"},
            ],
            "max_completion_tokens": 9,
            "max_tokens": 99,
            "stop": "END",
            "top_k": -1,
            "min_p": 0.05,
            "priority": 2,
            "stream": True,
            "stream_options": {"include_usage": True},
            "tools": [{"type": "function", "function": {"name": "lights"}}],
            "tool_choice": {"type": "function", "function": {"name": "lights"}},
            "response_format": {"type": "json_schema", "json_schema": SCHEMA},
            "chat_template_kwargs": {"enable_thinking": False},
            "tool_grammar": [{"type": "function", "function": {"name": "lights", **ON}}],
        }
    )  # fmt: skip
    assert request.messages[0] == {"role": "system", "content": "Be brief."}
    call = request.messages[2]["tool_calls"][0]
    assert call["function"]["arguments"] == {"on": True}
    # Chat templates such as Mistral's want 9 alphanumerics; both sides map alike.
    assert call["id"] == request.messages[3]["tool_call_id"]
    assert len(call["id"]) == 9
    assert call["id"].isalnum()
    assert request.max_tokens == 9
    assert request.stop == ("END",)
    assert request.top_k == 0
    assert request.min_p == 0.05
    assert request.priority is Priority.BACKGROUND
    assert request.include_usage
    assert request.tool_names == {"lights"}
    assert request.response_format.schema == {"type": "object"}
    assert request.chat_template_kwargs == {"enable_thinking": False}
    assert request.grammar_tools == request.tool_grammar != request.tools


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ([], None),
        ({"messages": "hi"}, "messages"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
         "messages[0].content[0]"),
        ({"messages": USER, "seed": "1"}, "seed"),
        ({"messages": USER, "stream": "yes"}, "stream"),
        ({"messages": USER, "tool_choice": "required"}, "tool_choice"),
        ({"messages": USER, "logprobs": 1}, "logprobs"),
        ({"messages": USER, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"messages": USER, "logprobs": True, "top_logprobs": -1}, "top_logprobs"),
        ({"messages": USER, "top_logprobs": 2}, "top_logprobs"),
        ({"messages": USER, "prompt_logprobs": 21}, "prompt_logprobs"),
        ({"messages": USER, "presence_penalty": 5}, "presence_penalty"),
        ({"messages": USER, "min_p": 1.5}, "min_p"),
        ({"messages": USER, "min_p": -0.1}, "min_p"),
        ({"messages": USER, "min_p": "0.1"}, "min_p"),
        ({"messages": USER, "chat_template_kwargs": ["enable_thinking"]}, "chat_template_kwargs"),
        ({"messages": USER, "tool_grammar": [{"type": "function", "function": {"name": "x"}}]},
         "tool_grammar"),
    ],
)  # fmt: skip
def test_chat_request_errors_name_the_field(body: object, param: str | None) -> None:
    with pytest.raises(ApiError) as caught:
        parse_chat_request(body)
    assert caught.value.status == 400
    assert caught.value.param == param


def test_logprob_fields_parse() -> None:
    chat = parse_chat_request({"messages": USER, "logprobs": True, "top_logprobs": 3})
    assert chat.logprobs == 3
    assert parse_chat_request({"messages": USER, "logprobs": True}).logprobs == 0
    assert parse_chat_request({"messages": USER, "logprobs": False}).logprobs is None
    text = parse_completion_request({"prompt": "hi", "logprobs": 2, "echo": True})
    assert (text.logprobs, text.echo) == (2, True)
    for body, param in (({"logprobs": 21}, "logprobs"), ({"echo": 1}, "echo")):
        with pytest.raises(ApiError) as caught:
            parse_completion_request({"prompt": "hi", **body})
        assert caught.value.param == param


def test_completion_prompt_forms() -> None:
    assert parse_completion_request({"prompt": ["one"]}).prompt == "one"
    assert parse_completion_request({"prompt": [1, 2, 3]}).prompt == [1, 2, 3]
    with pytest.raises(ApiError, match="prompt"):
        parse_completion_request({"prompt": ["a", "b"]})


def test_response_shapes() -> None:
    call = ToolCall("lights", {"room": "hall"}, "abc123def")
    body = chat_completion("id", "m", "", [call], "tool_calls", Usage(3, 2, 1), created=7)
    message = body["choices"][0]["message"]
    assert message["content"] is None
    assert json.loads(message["tool_calls"][0]["function"]["arguments"]) == {"room": "hall"}
    assert body["usage"] == {
        "prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5,
        "prompt_tokens_details": {"cached_tokens": 1},
    }  # fmt: skip
    usage_only = chat_chunk("id", "m", 7, None, usage=Usage(1, 1))
    assert usage_only["choices"] == []
    assert "usage" not in chat_chunk("id", "m", 7, {"content": "x"})


def test_listening_beyond_loopback_needs_a_key_or_no_auth(caplog: pytest.LogCaptureFixture) -> None:
    assert is_loopback("127.0.0.5")
    assert is_loopback("::1")
    assert is_loopback("localhost")
    assert not is_loopback("0.0.0.0")
    assert not is_loopback("192.168.1.2")
    ServerSettings().check()
    ServerSettings(host="0.0.0.0", api_key="k").check()
    with pytest.raises(ValueError, match="--no-auth"):
        ServerSettings(host="0.0.0.0").check()
    with caplog.at_level(logging.WARNING):
        ServerSettings(host="0.0.0.0", no_auth=True).check()
    assert "without an API key" in caplog.text
    with pytest.raises(ValueError, match="empty"):
        ServerSettings(api_key=" ").check()


LIGHTS = {"type": "function", "function": {"name": "lights", "parameters": {"type": "object"}}}


def test_tools_as_text_writes_the_tools_calls_and_results_for_a_template_without_them() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "lights", "arguments": "{}"}}
    messages = [
        {"role": "user", "content": "Lights on"},
        {"role": "assistant", "content": None, "tool_calls": [call, {**call, "id": "c2"}]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
        {"role": "tool", "tool_call_id": "c2", "content": [{"type": "text", "text": "done"}]},
        {"role": "assistant", "content": "Done."},
        {"role": "tool", "tool_call_id": "c3", "content": "late"},
    ]
    shown = tools_as_text(messages, [LIGHTS])
    # No system message: one is added for the tools.
    roles = [m["role"] for m in shown]
    assert roles == ["system", "user", "assistant", "user", "assistant", "user"]
    assert json.dumps(LIGHTS["function"]) in shown[0]["content"]
    assert all(set(m) == {"role", "content"} for m in shown)
    # The calls as the parser reads them back, the results of one run in one user turn.
    content, calls = parse_tool_calls(shown[2]["content"], {"lights"})
    assert (content, [(c.tool_name, c.tool_args) for c in calls]) == (
        "",
        [("lights", {}), ("lights", {})],
    )
    assert shown[3]["content"] == (
        "<tool_response>\nok\n</tool_response>\n<tool_response>\ndone\n</tool_response>"
    )
    assert shown[5]["content"] == "<tool_response>\nlate\n</tool_response>"
    assert messages[1]["tool_calls"] == [call, {**call, "id": "c2"}]  # the input is untouched


def test_tools_as_text_keeps_a_system_prompt_and_arguments_it_cannot_parse() -> None:
    broken = {"function": {"name": "lights", "arguments": "{not json"}}
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "assistant", "content": "Sure.", "tool_calls": [broken]},
    ]
    shown = tools_as_text(messages, [LIGHTS])
    assert shown[0]["content"].startswith("Be brief.\n\n# Tools")
    assert shown[1]["content"] == (
        'Sure.\n<tool_call>\n{"name": "lights", "arguments": "{not json"}\n</tool_call>'
    )
    # Without tools offered, only the turns become text; the system prompt stays.
    assert tools_as_text(messages, None)[0] == messages[0]
