"""A constrained answer reaches its grammar's end before max_tokens, where it can fit."""

from __future__ import annotations

import json
import random
from typing import Any

import numpy as np
import pytest

from paged_llm.engine.core.sequence import FinishReason, SamplingParams
from paged_llm.engine.structured.closer import Closer
from paged_llm.engine.structured.tool_grammar import tool_call_structural_tag
from tests.helpers.support import make_engine

VOCAB = 49152
SCHEMAS: list[dict[str, Any]] = [
    {"type": "object", "properties": {"advice": {"type": "string"}}, "required": ["advice"]},
    {
        "type": "object",
        "properties": {
            "celsius": {"type": "number"},
            "rooms": {"type": "array", "items": {"type": "string"}},
            "on": {"type": "boolean"},
            "mode": {"enum": ["heat", "cool"]},
            "where": {
                "type": "object",
                "properties": {"floor": {"type": "integer"}, "name": {"type": "string"}},
                "required": ["floor", "name"],
            },
        },
        "required": ["celsius", "rooms", "on", "mode", "where"],
    },
    {"type": "array", "items": {"type": "number"}, "minItems": 2},
]
TOOL = {
    "type": "function",
    "function": {
        "name": "note",
        "parameters": {
            "type": "object",
            "properties": {"text": {"type": "string"}, "tags": {"type": "array"}},
            "required": ["text", "tags"],
        },
    },
}


@pytest.fixture(scope="module")
def engine() -> Any:
    """A tiny random model over the bundled tokenizer: it rambles wherever it may."""
    return make_engine(vocab_size=VOCAB, block_size=16)


def _run(
    engine: Any, params: SamplingParams | list[SamplingParams], n: int = 1
) -> list[tuple[str, FinishReason | None]]:
    """Answers to ``n`` random prompts per params, run together: text (without end tokens)
    and finish reason, in order."""
    rng = random.Random(11)
    every = [p for p in (params if isinstance(params, list) else [params]) for _ in range(n)]
    for i, one in enumerate(every):
        engine.add_request([rng.randrange(3, 512) for _ in range(9)], one, request_id=str(i))
    tokens: dict[str, list[int]] = {}
    reasons: dict[str, FinishReason | None] = {}
    while engine.has_unfinished():
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.token_ids)
            if out.finished:
                reasons[out.request_id] = out.finish_reason
    eos = set(engine.loaded.eos_token_ids)
    assert engine.kv_manager.num_used_blocks == 0
    return [
        (engine.tokenizer.decode([t for t in tokens[str(i)] if t not in eos]), reasons[str(i)])
        for i in range(len(every))
    ]


def _shortest(engine: Any, params: SamplingParams) -> int:
    """Tokens of the shortest answer the closer finds from the start, its end token included."""
    compiled = engine.structured.compile(params)
    assert compiled is not None
    matcher = compiled.matcher()
    path = Closer(engine.tokenizer, VOCAB).path(matcher)
    assert path is not None
    return len(path) + 1


def test_schema_answers_close_before_max_tokens(engine) -> None:
    """Each answer ends with STOP and parses, however the model rambles: with just room
    enough for the shortest answer, and with 30 tokens more."""
    runs = [
        (schema, SamplingParams(temperature=0, max_tokens=shortest + room, json_schema=schema))
        for schema in SCHEMAS
        for shortest in [_shortest(engine, SamplingParams(json_schema=schema))]
        for room in (0, 30)
    ]
    answers = _run(engine, [params for _, params in runs], 2)
    for i, (text, reason) in enumerate(answers):
        schema = runs[i // 2][0]
        assert reason is FinishReason.STOP, text
        data = json.loads(text)
        assert isinstance(data, dict if schema["type"] == "object" else list)


def test_sampled_answers_and_tool_calls_close_too(engine) -> None:
    """Sampling (temperature 1) and a tool call's arguments are held to the end as well."""
    shortest = _shortest(engine, SamplingParams(json_schema=SCHEMAS[1]))
    sampled = SamplingParams(
        temperature=1.0, seed=3, max_tokens=shortest + 6, json_schema=SCHEMAS[1]
    )
    for text, reason in _run(engine, sampled, 3):
        assert reason is FinishReason.STOP, text
        assert set(json.loads(text)) >= {"celsius", "rooms", "on", "mode", "where"}
    tag = tool_call_structural_tag([TOOL], tool_choice="required")
    tool = SamplingParams(temperature=0, max_tokens=40, structural_tag=tag)
    for text, reason in _run(engine, tool, 3):
        assert reason is FinishReason.STOP, text
        call = json.loads(text.split("<tool_call>")[1].split("</tool_call>")[0])
        assert call["name"] == "note"
        assert set(call["arguments"]) == {"text", "tags"}


def test_without_room_to_close_the_answer_ends_with_length(engine) -> None:
    """Where not even the shortest answer fits, it is cut as before (LENGTH)."""
    shortest = _shortest(engine, SamplingParams(json_schema=SCHEMAS[1]))
    params = SamplingParams(temperature=0, max_tokens=shortest // 2, json_schema=SCHEMAS[1])
    for text, reason in _run(engine, params, 2):
        assert reason is FinishReason.LENGTH
        with pytest.raises(json.JSONDecodeError):
            json.loads(text)


def test_the_path_leaves_the_requests_matcher_where_it_was(engine) -> None:
    """The search runs on a fork: the matcher's own state and its accepted text stay."""
    compiled = engine.structured.compile(SamplingParams(json_schema=SCHEMAS[1]))
    assert compiled is not None
    matcher = compiled.matcher()
    for token in engine.tokenizer.encode('{"celsius": 21.5, "rooms": ["hall", "ki'):
        assert matcher.accept_token(token)
    closer = Closer(engine.tokenizer, VOCAB)
    path = closer.path(matcher)
    assert path is not None
    ending = engine.tokenizer.decode(path)
    assert ending.startswith('"]')
    assert not matcher.is_completed()
    data = json.loads('{"celsius": 21.5, "rooms": ["hall", "ki' + ending)
    assert data["rooms"] == ["hall", "ki"]
    assert len(path) <= _shortest(engine, SamplingParams(json_schema=SCHEMAS[1]))


def test_a_row_masked_twice_is_forced_to_the_same_token(engine) -> None:
    """A step that masks a row again (one row failing in a batch) forces the same token."""
    shortest = _shortest(engine, SamplingParams(json_schema=SCHEMAS[1]))
    params = SamplingParams(temperature=0, max_tokens=shortest, json_schema=SCHEMAS[1])
    seq = engine.add_request([5, 6, 7, 8], params, request_id="twice")
    engine.step()
    picks = []
    for _ in range(2):
        logits = np.zeros((1, VOCAB), dtype=np.float32)
        engine.structured.apply(logits, [seq])
        assert int(np.isfinite(logits).sum()) == 1
        picks.append(int(logits.argmax()))
    assert picks[0] == picks[1]
    while engine.has_unfinished():
        engine.step()
    assert engine.kv_manager.num_used_blocks == 0
