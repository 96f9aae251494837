"""Free JSON numbers and item counts bounded in the grammar; strings left free (and fast)."""

from __future__ import annotations

import functools
import json
import random

import pytest

from paged_llm.engine.core.sequence import FinishReason, SamplingParams
from paged_llm.engine.structured.json_bounds import JsonBounds, open_string_length
from paged_llm.engine.structured.matcher import Grammar, GrammarCompiler
from paged_llm.engine.structured.tool_grammar import tool_call_structural_tag
from tests.helpers.support import make_engine

SMALL = JsonBounds(integer_digits=3, fraction_digits=2, items=2)
FREE = {
    "type": "object",
    "properties": {
        "n": {"type": "number"},
        "i": {"type": "integer"},
        "s": {"type": "string"},
        "a": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["n", "i", "s", "a"],
}


@functools.cache
def _compiler() -> GrammarCompiler:
    """llguidance over the bundled tokenizer (built once: it takes half a second)."""
    engine = make_engine(vocab_size=49152)
    return GrammarCompiler(engine.tokenizer, 49152, engine.loaded.eos_token_ids)


def _grammar(field: str, text: str, bounds: JsonBounds | None) -> Grammar:
    """The engine's grammar of one constraint, with ``bounds`` (None: as written)."""
    return _compiler().compile(field, text, bounds)


def accepts(grammar: Grammar, text: str) -> bool:
    """Whether ``grammar`` takes the whole of ``text``."""
    matcher = grammar.matcher()
    return matcher.accept_string(text) and matcher.is_completed()


def _schema_grammars(schema: dict[str, object]) -> tuple[Grammar, Grammar]:
    """The grammar of ``schema`` as written, and with SMALL's bounds."""
    text = json.dumps(schema)
    return _grammar("json_schema", text, None), _grammar("json_schema", text, SMALL)


def _answer(n: str = "1.5", i: str = "12", s: str = "abc", a: str = '["x", "y"]') -> str:
    """A FREE answer with the given raw values."""
    return f'{{"n": {n}, "i": {i}, "s": "{s}", "a": {a}}}'


@pytest.mark.parametrize(
    "values",
    [
        {"n": "1234"},  # four integer digits
        {"i": "-1234"},
        {"n": "1.234"},  # three fraction digits
        {"n": "1e123"},  # three exponent digits
        {"a": '["x", "y", "z"]'},  # three items
    ],
)
def test_a_value_past_its_bound_is_refused_that_the_free_grammar_takes(values) -> None:
    """Each bound holds, and each case is one the grammar without bounds accepts."""
    free, small = _schema_grammars(FREE)
    text = _answer(**values)
    assert accepts(free, text)
    assert not accepts(small, text)


def test_values_within_the_bounds_are_all_taken() -> None:
    """Up to each bound the bounded grammar takes what the free one does."""
    _, small = _schema_grammars(FREE)
    for text in (
        _answer(),
        _answer(n="-123.45", i="999", s="a" * 2000, a='["abcde", ""]'),
        _answer(n="-0.05", i="0", s='a\\"\\u00e9c', a="[]"),
    ):
        assert accepts(small, text), text


def test_the_schemas_own_bounds_stay_as_written() -> None:
    """maxLength, minLength (a string of any length above it) and ranges stay the schema's."""
    schema = {
        "type": "object",
        "properties": {
            "long": {"type": "string", "maxLength": 8},
            "least": {"type": "string", "minLength": 7},
            "level": {"type": "number", "minimum": 0, "maximum": 100000},
        },
        "required": ["long", "least", "level"],
    }
    _, small = _schema_grammars(schema)
    assert accepts(small, '{"long": "12345678", "least": "1234567", "level": 100000}')
    assert accepts(small, '{"long": "", "least": "%s", "level": 0.5}' % ("x" * 3000))
    assert not accepts(small, '{"long": "123456789", "least": "1234567", "level": 1}')


def test_any_json_object_and_tool_calls_are_bounded_too() -> None:
    """json_object's free values and a tool call's arguments follow the same bounds."""
    anything = _grammar("json_object", "", None)
    small = _grammar("json_object", "", SMALL)
    assert accepts(anything, '{"k": 1234}')
    assert not accepts(small, '{"k": 1234}')
    assert not accepts(small, '{"a": 1, "b": 2, "c": 3}')
    assert accepts(small, '{"k": [1.25, "abcdefgh"], "l": {}}')
    tool = {
        "type": "function",
        "function": {
            "name": "note",
            "parameters": {"type": "object", "properties": {"level": {"type": "number"}}},
        },
    }
    tag = tool_call_structural_tag([tool], tool_choice="required")
    calls = _grammar("structural_tag", json.dumps(tag), None)
    small_calls = _grammar("structural_tag", json.dumps(tag), SMALL)
    call = '<tool_call>\n{"name": "note", "arguments": {"level": %s}}\n</tool_call>'
    assert accepts(calls, call % "1.125")
    assert not accepts(small_calls, call % "1.125")
    assert accepts(small_calls, call % "1.12")


def test_bounded_numbers_are_written_without_an_exponent() -> None:
    """llguidance writes a number with a range as plain digits: a bounded number takes no
    exponent (xgrammar took one of up to ``fraction_digits`` digits), a free one does."""
    free, small = _schema_grammars(FREE)
    assert accepts(free, _answer(n="0.5e-12"))
    assert not accepts(small, _answer(n="0.5e-12"))
    assert accepts(small, _answer(n="0.00"))


def test_a_bound_below_one_is_refused_by_name() -> None:
    """A bound of 0 would refuse every number or array: a clear error instead."""
    with pytest.raises(ValueError, match="items must be at least 1"):
        JsonBounds(items=0)


def test_greedy_schema_answers_stay_in_bounds_and_close() -> None:
    """The engine's answers under a free schema end with STOP and keep every bound."""
    engine = make_engine(vocab_size=49152, json_bounds=SMALL)
    params = SamplingParams(temperature=0, max_tokens=120, json_schema=FREE)
    rng = random.Random(7)
    for n in range(6):
        prompt = [rng.randrange(3, 512) for _ in range(10)]
        engine.add_request(prompt, params, request_id=str(n))
    tokens: dict[str, list[int]] = {}
    reasons: dict[str, FinishReason | None] = {}
    while engine.has_unfinished():
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.token_ids)
            if out.finished:
                reasons[out.request_id] = out.finish_reason
    eos = set(engine.loaded.eos_token_ids)
    for rid, ids in tokens.items():
        assert reasons[rid] is FinishReason.STOP, engine.tokenizer.decode(ids)
        data = json.loads(engine.tokenizer.decode([t for t in ids if t not in eos]))
        assert isinstance(data["s"], str)
        assert len(data["a"]) <= 2
        assert abs(data["i"]) < 1000
        assert isinstance(data["n"], int | float)
    assert engine.kv_manager.num_used_blocks == 0


def test_open_string_length_follows_quotes_and_escapes() -> None:
    """The open string's length, escapes included; -1 once every string is closed."""
    assert open_string_length('{"a": "xyz') == 3
    assert open_string_length('{"a": "x\\"y') == 4
    assert open_string_length('{"a": "x\\\\"') == -1
    assert open_string_length('<tool_call>\n{"k') == 1
    assert open_string_length('{"a": 1}') == -1


def test_free_strings_end_at_the_engines_cap() -> None:
    """A string without maxLength is closed once it holds string_chars characters."""
    engine = make_engine(vocab_size=49152, json_bounds=JsonBounds(string_chars=8))
    params = SamplingParams(temperature=0, max_tokens=200, json_schema=FREE)
    rng = random.Random(3)
    for n in range(4):
        engine.add_request([rng.randrange(3, 512) for _ in range(8)], params, request_id=str(n))
    tokens: dict[str, list[int]] = {}
    while engine.has_unfinished():
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.token_ids)
    eos = set(engine.loaded.eos_token_ids)
    for ids in tokens.values():
        data = json.loads(engine.tokenizer.decode([t for t in ids if t not in eos]))
        # The cap, and at most one token's characters past it (the token that reached it).
        for text in [data["s"], *data["a"]]:
            assert len(text) < 8 + 16, text
    assert engine.kv_manager.num_used_blocks == 0


def test_a_looping_string_is_closed_where_it_loops() -> None:
    """A string whose tokens repeat a unit ends there, long before the character cap.

    The tiny random model, greedy and pushed to repeat itself (a negative frequency
    penalty), fills a free string with one token or a short cycle of them; without the
    loop check those strings ran until the way to max_tokens forced them shut.
    """
    engine = make_engine(vocab_size=49152)
    schema = {"type": "object", "properties": {"s": {"type": "string"}}, "required": ["s"]}
    params = SamplingParams(
        temperature=0, max_tokens=160, json_schema=schema, frequency_penalty=-2.0
    )
    rng = random.Random(5)
    for n in range(6):
        engine.add_request([rng.randrange(3, 512) for _ in range(8)], params, request_id=str(n))
    tokens: dict[str, list[int]] = {}
    finish: dict[str, FinishReason | None] = {}
    while engine.has_unfinished():
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.token_ids)
            finish[out.request_id] = out.finish_reason
    eos = set(engine.loaded.eos_token_ids)
    for request_id, ids in tokens.items():
        data = json.loads(engine.tokenizer.decode([t for t in ids if t not in eos]))
        assert finish[request_id] == FinishReason.STOP
        # Closed at its loop: 16 turns of one token, 8 of a longer unit, all within 100
        # tokens here (without the check every answer took about 150).
        assert len(ids) < 100, (len(ids), data["s"])
    assert engine.kv_manager.num_used_blocks == 0


@pytest.mark.parametrize(
    ("tail", "looping"),
    [
        ([7] * 16, True),
        ([7] * 15, False),
        ([1, 2] * 8, True),
        ([1, 2] * 7 + [1, 3], False),
        ([1, 2, 3, 4, 5, 6, 7, 8] * 8, True),
        ([1, 2, 3, 4, 5, 6, 7, 8] * 7, False),
        ([1, 2, 3, 4, 5, 6, 7, 8, 9] * 9, False),  # a unit longer than 8 tokens
        (list(range(64)), False),
    ],
)
def test_loops_are_units_of_up_to_eight_tokens_repeated(tail: list[int], looping: bool) -> None:
    """The loop check: a unit of 1-8 tokens, 8 times and at least 16 tokens, at the end."""
    from paged_llm.engine.structured.output import _looping

    prompt = [99, 98, 97]
    assert _looping(prompt + tail, len(tail)) is looping
    # Prompt tokens never count towards a loop.
    assert _looping([7] * 20 + [5], 1) is False
