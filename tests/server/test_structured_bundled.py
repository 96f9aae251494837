"""The bundled model's structured answers through a real server: every one valid and whole.

Greedy decoding with a 135M model is where JSON used to run away (digits without end, a
string repeating "1.1.1." until max_tokens). Eight schemas and four tool requests, asked
together, must each come back closed, valid for their schema, and ended by the model or
the grammar, not by max_tokens.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import llguidance
import openai
import pytest
from tokenizers import Tokenizer

from paged_llm.defaults import DEFAULT_MODEL
from paged_llm.engine.structured.json_bounds import bounded_schema
from tests.helpers.server_process import API_KEY, ServerProcess, start_server
from tests.helpers.support import tokenizer_dir

pytestmark = pytest.mark.slow

SCHEMAS: list[tuple[str, dict[str, Any]]] = [
    (
        "What temperature should the living room be tonight?",
        {"type": "object", "properties": {"celsius": {"type": "number"}}, "required": ["celsius"]},
    ),
    (
        "Rate my energy use this week and give one piece of advice.",
        {
            "type": "object",
            "properties": {"score": {"type": "integer"}, "advice": {"type": "string"}},
            "required": ["score", "advice"],
        },
    ),
    (
        "Which rooms have lights on?",
        {
            "type": "object",
            "properties": {"rooms": {"type": "array", "items": {"type": "string"}}},
            "required": ["rooms"],
        },
    ),
    (
        "Should the heating be on, and in which mode?",
        {
            "type": "object",
            "properties": {"on": {"type": "boolean"}, "mode": {"enum": ["heat", "cool", "off"]}},
            "required": ["on", "mode"],
        },
    ),
    (
        "Summarize the day at home in one sentence.",
        {"type": "object", "properties": {"summary": {"type": "string"}}, "required": ["summary"]},
    ),
    (
        "Describe the kitchen sensor.",
        {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "where": {
                    "type": "object",
                    "properties": {"floor": {"type": "integer"}, "room": {"type": "string"}},
                    "required": ["floor", "room"],
                },
            },
            "required": ["name", "where"],
        },
    ),
    (
        "List the next three reminders with their times.",
        {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"text": {"type": "string"}, "time": {"type": "string"}},
                "required": ["text", "time"],
            },
        },
    ),
    (
        "How much power did the house use today, in kWh?",
        {
            "type": "object",
            "properties": {"kwh": {"type": "number"}, "note": {"type": "string"}},
            "required": ["kwh", "note"],
        },
    ),
]


def _tool(name: str, description: str, properties: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI function tool whose arguments are all required."""
    parameters = {"type": "object", "properties": properties, "required": list(properties)}
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


TOOLS = [
    _tool(
        "set_light",
        "Set a light's brightness",
        {"room": {"type": "string"}, "level": {"type": "integer"}},
    ),
    _tool("start_timer", "Start a kitchen timer", {"minutes": {"type": "number"}}),
    _tool("add_note", "Add a note to the family board", {"text": {"type": "string"}}),
    _tool("set_scene", "Switch to a scene", {"scene": {"enum": ["movie", "dinner", "night"]}}),
]
TOOL_ASKS = [
    "Dim the bedroom light to 3",
    "Start a timer for the pasta",
    "Remind everyone to buy milk",
    "Get the living room ready for a film",
]


@pytest.fixture(scope="module")
def bundled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server over the bundled model, with room for all twelve requests at once."""
    log = tmp_path_factory.mktemp("bundled") / "server.log"
    proc = start_server(Path(DEFAULT_MODEL), log, "--kv-budget", "96MiB")
    yield proc
    assert proc.stop() == 0, proc.log_text()


def _valid(schema: dict[str, Any], text: str) -> bool:
    """Whether ``text`` is JSON that ``schema`` takes, any whitespace, no unlisted members.

    Checked with llguidance's own grammar of the schema, read strictly as the engine reads
    it (the engine's JSON bounds left out: they are what is under test).
    """
    tokenizer = Tokenizer.from_file(str(tokenizer_dir() / "tokenizer.json"))
    llt = llguidance.LLTokenizer(tokenizer.to_str())
    strict = bounded_schema(schema, None, strict=True)
    strict["x-guidance"] = {"json_allow_general_unicode_escapes": True}
    grammar = llguidance.grammar_from("json_schema", json.dumps(strict))
    matcher = llguidance.LLMatcher(llt, grammar, log_level=0)
    return bool(matcher.consume_tokens(llt.tokenize_str(text)) and matcher.is_accepting())


async def test_eight_schemas_and_four_tool_requests_all_come_back_whole(
    bundled: ServerProcess,
) -> None:
    """Asked at once, greedy: each answer closed, valid, and not cut off by max_tokens."""
    async with openai.AsyncOpenAI(
        base_url=f"{bundled.url}/v1", api_key=API_KEY, max_retries=0
    ) as client:

        async def ask_schema(question: str, schema: dict[str, Any]) -> Any:
            """One structured answer."""
            return await client.chat.completions.create(
                model=DEFAULT_MODEL,
                messages=[{"role": "user", "content": question}],
                response_format={
                    "type": "json_schema",
                    "json_schema": {"name": "answer", "schema": schema},
                },
                temperature=0,
                max_tokens=300,
            )

        async def ask_tool(question: str) -> Any:
            """One tool call, the model's choice among the four."""
            return await client.chat.completions.create(
                model=DEFAULT_MODEL,
                messages=[{"role": "user", "content": question}],
                tools=TOOLS,  # type: ignore[arg-type]
                tool_choice="required",
                temperature=0,
                max_tokens=300,
            )

        answers = await asyncio.gather(
            *(ask_schema(q, s) for q, s in SCHEMAS), *(ask_tool(q) for q in TOOL_ASKS)
        )
    for (question, schema), answer in zip(SCHEMAS, answers[: len(SCHEMAS)], strict=True):
        choice = answer.choices[0]
        text = choice.message.content or ""
        assert choice.finish_reason == "stop", (question, choice.finish_reason, text)
        assert _valid(schema, text), (question, text)
    by_name = {tool["function"]["name"]: tool["function"]["parameters"] for tool in TOOLS}
    for question, answer in zip(TOOL_ASKS, answers[len(SCHEMAS) :], strict=True):
        choice = answer.choices[0]
        calls = choice.message.tool_calls or []
        assert choice.finish_reason == "tool_calls", (question, choice.finish_reason, choice)
        assert calls, (question, choice.message)
        for call in calls:
            assert call.function.name in by_name, (question, call)
            assert _valid(by_name[call.function.name], call.function.arguments), (question, call)
