"""Tool-call structural tags: formats by template, tool_choice, and what the grammar admits."""

from __future__ import annotations

import copy
import json

import pytest

from paged_llm.engine.core.sequence import SamplingParams
from paged_llm.engine.errors import RequestRejected
from paged_llm.engine.structured.matcher import GrammarCompiler
from paged_llm.engine.structured.tool_grammar import (
    ToolCallFormat,
    detect_tool_call_format,
    tool_call_structural_tag,
)
from tests.helpers.support import make_engine

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "HassTurnOn",
            "parameters": {
                "type": "object",
                "properties": {"name": {"type": "string"}},
                "required": ["name"],
            },
        },
    },
    {"type": "function", "function": {"name": "GetLiveContext"}},
]


@pytest.mark.parametrize(
    ("template", "fmt"),
    [
        (None, ToolCallFormat.HERMES),
        ("{{ '<tool_call>' }}", ToolCallFormat.HERMES),
        ("{{ '[TOOL_CALLS]' }}", ToolCallFormat.MISTRAL),
        ("{{ '<|python_tag|>' }}", ToolCallFormat.LLAMA3),
        ("{{ messages }}", ToolCallFormat.HERMES),
    ],
)
def test_format_follows_the_chat_template(template, fmt) -> None:
    assert detect_tool_call_format(template) is fmt


def test_tool_choice_shapes_the_tag() -> None:
    assert tool_call_structural_tag(TOOLS, tool_choice="none") is None
    assert tool_call_structural_tag([], tool_choice="auto") is None
    auto = tool_call_structural_tag(TOOLS)
    assert auto is not None
    assert [t["begin"] for t in auto["format"]["tags"]] == [
        '<tool_call>\n{"name": "HassTurnOn", "arguments": ',
        '<tool_call>\n{"name": "GetLiveContext", "arguments": ',
    ]
    assert auto["format"]["tags"][1]["content"]["json_schema"] == {"type": "object"}
    assert not auto["format"]["at_least_one"]
    required = tool_call_structural_tag(TOOLS, ToolCallFormat.LLAMA3, "required")
    assert required is not None
    assert required["format"]["at_least_one"]
    assert required["format"]["stop_after_first"]
    named = tool_call_structural_tag(
        TOOLS, ToolCallFormat.MISTRAL, {"type": "function", "function": {"name": "HassTurnOn"}}
    )
    assert named is not None
    assert [t["begin"] for t in named["format"]["tags"]] == [
        '[TOOL_CALLS][{"name": "HassTurnOn", "arguments": '
    ]
    with pytest.raises(ValueError, match="tool_choice names 'Nope'"):
        tool_call_structural_tag(TOOLS, tool_choice={"function": {"name": "Nope"}})
    with pytest.raises(ValueError, match="tool_choice must be"):
        tool_call_structural_tag(TOOLS, tool_choice="sometimes")
    with pytest.raises(ValueError, match="tools: every tool needs a function name"):
        tool_call_structural_tag([{"type": "function", "function": {}}])


def test_the_grammar_admits_text_then_only_offered_calls() -> None:
    engine = make_engine(vocab_size=49152)
    tag = tool_call_structural_tag(TOOLS)
    compiled = engine.structured.compile(SamplingParams(structural_tag=tag))
    assert compiled is not None

    def admits(text: str) -> bool:
        matcher = compiled.matcher()
        return matcher.accept_string(text)

    assert admits("Sure, turning it on. ")
    assert admits(
        '<tool_call>\n{"name": "HassTurnOn", "arguments": {"name": "lamp"}}\n</tool_call>'
    )
    assert not admits('<tool_call>\n{"name": "Unknown"')
    assert not admits('<tool_call>\n{"name": "HassTurnOn", "arguments": {"name": 5')
    assert not admits('<tool_call>\n{"name": "HassTurnOn", "arguments": {"other"')
    with pytest.raises(RequestRejected, match=r"^structural_tag cannot be enforced"):
        engine.add_request([5, 6], SamplingParams(structural_tag={"format": {"type": "x"}}))


def test_mistral_special_token_opens_a_call() -> None:
    # Mistral's tokenizers have [TOOL_CALLS] as one special token; the model emits that
    # token, not the text spelt out, so the grammar must take the token as the trigger.
    tokenizer = copy.deepcopy(make_engine(vocab_size=49152).loaded.tokenizer)
    tokenizer.add_special_tokens({"additional_special_tokens": ["[TOOL_CALLS]"]})
    token = tokenizer.convert_tokens_to_ids("[TOOL_CALLS]")
    compiler = GrammarCompiler(tokenizer, len(tokenizer), (tokenizer.eos_token_id,))
    tag = tool_call_structural_tag(TOOLS, ToolCallFormat.MISTRAL)
    compiled = compiler.compile("structural_tag", json.dumps(tag), None)

    matcher = compiled.matcher()
    assert matcher.accept_string("Turning it on. ")
    assert matcher.accept_token(token)
    assert matcher.accept_string('[{"name": "HassTurnOn", "arguments": {"name": "lamp"}}]')
    # After the token, only an offered tool's call may follow.
    refused = compiled.matcher()
    assert refused.accept_token(token)
    assert not refused.accept_string('[{"name": "Unknown"')
