"""Tool calls end to end: a scripted model answers with a call, returned as OpenAI tool_calls."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.helpers.scripted_model import build_scripted_model
from tests.helpers.server_process import API_KEY, MODEL, ServerProcess, start_server

# The model's whole answer, every token distinct (the scripted model is a bigram table).
CALL = '{"name":"lights","arguments": {"room" : "kitchen"} }'
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lights",
            "description": "Turn the lights of a room on.",
            "parameters": {"type": "object", "properties": {"room": {"type": "string"}}},
        },
    }
]
ASK = [{"role": "user", "content": "Kitchen lights on, please."}]
# An earlier round: the call and its result.
HISTORY = [
    *ASK,
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_01HXYZABCDEF",
                "type": "function",
                "function": {"name": "lights", "arguments": '{"room": "kitchen"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_01HXYZABCDEF", "content": '{"success": true}'},
]


@pytest.fixture(scope="module")
def client(scripted_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[openai.OpenAI]:
    model = build_scripted_model(scripted_dir / "lights-call", CALL)
    log = tmp_path_factory.mktemp("tools") / "server.log"
    proc: ServerProcess = start_server(model, log, "--served-model-name", MODEL)
    yield openai.OpenAI(base_url=f"{proc.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)
    assert proc.stop() == 0


def test_without_tools_the_answer_is_text(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=40)
    assert reply.choices[0].message.content == CALL
    assert reply.choices[0].finish_reason == "stop"
    assert reply.choices[0].message.tool_calls is None


def test_tool_call_not_streaming(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        max_tokens=40,
        tools=TOOLS,  # type: ignore[arg-type]
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert not choice.message.content
    (call,) = choice.message.tool_calls or []
    assert call.type == "function"
    assert call.function.name == "lights"  # type: ignore[union-attr]
    assert json.loads(call.function.arguments) == {"room": "kitchen"}  # type: ignore[union-attr]
    assert call.id


def test_tool_call_streaming(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=ASK,
            max_tokens=40,
            tools=TOOLS,
            stream=True,  # type: ignore[arg-type]
        )
    )
    # Nothing of the call leaks out as text.
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == ""
    deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
    (delta,) = deltas
    assert delta.index == 0
    assert delta.function is not None
    assert delta.function.name == "lights"
    assert json.loads(delta.function.arguments or "") == {"room": "kitchen"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_tool_choice_none_keeps_the_text(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        max_tokens=40,
        tools=TOOLS,
        tool_choice="none",  # type: ignore[arg-type]
    )
    assert reply.choices[0].message.content == CALL


def test_tool_results_in_the_history_are_accepted(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=MODEL,
        messages=HISTORY,
        max_tokens=40,
        tools=TOOLS,  # type: ignore[arg-type]
    )
    assert reply.choices[0].finish_reason == "tool_calls"
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model=MODEL,
            messages=[*ASK, {**HISTORY[1], "tool_calls": [{"type": "function", "function": {
                "name": "lights", "arguments": "{not json"}}]}],  # type: ignore[list-item]
            max_tokens=4,
        )  # fmt: skip
    assert "messages[1].tool_calls[0].function.arguments" in str(caught.value)


def test_a_template_without_tools_gets_them_as_hermes_instructions(client: openai.OpenAI) -> None:
    """The bundled tokenizer's template renders no tools: they are written into the prompt."""
    from transformers import AutoTokenizer

    from paged_llm.protocol.tool_prompt import tools_as_text
    from tests.helpers.support import tokenizer_dir

    history = [{"role": "system", "content": "Be brief."}, *HISTORY]
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir())
    for tools in (TOOLS, None):
        reply = client.chat.completions.create(
            model=MODEL,
            messages=history,  # type: ignore[arg-type]
            max_tokens=1,
            tools=tools or openai.omit,  # type: ignore[arg-type]
        )
        shown = tools_as_text(history, tools)
        assert reply.usage is not None
        want = tokenizer.apply_chat_template(
            shown, add_generation_prompt=True, tokenize=True, return_dict=True
        )["input_ids"]
        assert reply.usage.prompt_tokens == len(want)
    prompt = tokenizer.apply_chat_template(tools_as_text(history, TOOLS), tokenize=False)
    assert "<tools>" in prompt
    assert '"name": "lights"' in prompt
    assert (
        '<tool_call>\n{"name": "lights", "arguments": {"room": "kitchen"}}\n</tool_call>' in prompt
    )
    assert '<tool_response>\n{"success": true}\n</tool_response>' in prompt
