"""Structured output: options validated, grammars compiled once, masks that hold while decoding."""

from __future__ import annotations

import json
import random
import re

import pytest
import torch

from paged_llm.engine.core.sequence import FinishReason, Priority, SamplingParams
from paged_llm.engine.errors import InvalidSamplingParams, RequestRejected
from tests.helpers.support import make_engine

# The tiny models take the bundled tokenizer's full vocabulary here, so llguidance's view of
# the tokens matches the logits.
VOCAB = 49152
SCHEMA = {
    "type": "object",
    "properties": {
        "on": {"type": "boolean"},
        "level": {"type": "integer", "minimum": 0, "maximum": 100},
        "mode": {"enum": ["heat", "cool", "auto"]},
    },
    "required": ["on", "level", "mode"],
}


def reference_greedy(model: torch.nn.Module, prompt: list[int], n: int) -> list[int]:
    """Greedy tokens from transformers' own generate with its stock attention."""
    impl = model.config._attn_implementation
    model.set_attn_implementation("sdpa")
    try:
        out = model.generate(
            torch.tensor([prompt]), max_new_tokens=n, do_sample=False, eos_token_id=None
        )
    finally:
        model.set_attn_implementation(impl)
    return out[0, len(prompt) :].tolist()


def run(engine, requests: dict[str, tuple[list[int], SamplingParams]], prios=None):
    """Add every request, step until done; tokens and finish reason per request."""
    tokens: dict[str, list[int]] = {rid: [] for rid in requests}
    reasons: dict[str, FinishReason | None] = {}
    for rid, (prompt, params) in requests.items():
        prio = (prios or {}).get(rid, Priority.INTERACTIVE)
        engine.add_request(prompt, params, prio, request_id=rid)
    while engine.has_unfinished():
        for out in engine.step():
            tokens[out.request_id].extend(out.token_ids)
            if out.finished:
                reasons[out.request_id] = out.finish_reason
    return tokens, reasons


@pytest.fixture(scope="module")
def engine():
    return make_engine(vocab_size=VOCAB, block_size=16)


def prompt(seed: int, n: int = 12) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 512) for _ in range(n)]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"json_schema": "{not json"}, "json_schema is not valid JSON"),
        ({"json_schema": [1, 2]}, "json_schema must be a JSON object"),
        ({"structural_tag": "3"}, "structural_tag must be a JSON object"),
        ({"json_object": "yes"}, "json_object must be a boolean"),
        ({"regex": ""}, "regex must be a non-empty string"),
        ({"grammar": 5}, "grammar must be a non-empty string"),
        ({"regex": "a+", "json_object": True}, "json_object and regex cannot be combined"),
    ],
)
def test_options_are_validated_by_name(kwargs, message) -> None:
    with pytest.raises(InvalidSamplingParams, match=re.escape(message)):
        SamplingParams(**kwargs)


def test_schema_given_as_mapping_is_stored_as_json_text_in_its_key_order() -> None:
    params = SamplingParams(json_schema={"type": "object", "properties": {"b": {}, "a": {}}})
    assert params.json_schema == '{"type":"object","properties":{"b":{},"a":{}}}'
    assert params.structured == ("json_schema", params.json_schema)
    assert SamplingParams().structured is None
    assert SamplingParams(json_object=True).structured == ("json_object", "")


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        (
            {"json_schema": {"type": "object", "properties": {"a": {"$ref": "#/nope"}}}},
            "json_schema",
        ),
        ({"grammar": "root ::= ("}, "grammar"),
        ({"regex": "(unclosed"}, "regex"),
        (
            {"structural_tag": {"type": "structural_tag", "format": {"type": "nope"}}},
            "structural_tag",
        ),
    ],
)
def test_a_grammar_that_cannot_compile_is_refused_at_submission(engine, kwargs, field) -> None:
    with pytest.raises(RequestRejected, match=f"^{field} cannot be enforced") as info:
        engine.add_request(prompt(1), SamplingParams(max_tokens=4, **kwargs), request_id="bad")
    assert info.value.code == "invalid_structured_output"
    assert engine.scheduler.get("bad") is None
    # The engine keeps serving: the same id is free and a good request runs.
    free = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    tokens, reasons = run(engine, {"bad": (prompt(1), free)})
    assert len(tokens["bad"]) == 3
    assert reasons["bad"] is FinishReason.LENGTH


def test_each_grammar_is_compiled_once(engine) -> None:
    params = SamplingParams(json_schema=SCHEMA)
    first = engine.structured.compile(params)
    again = engine.structured.compile(SamplingParams(json_schema=json.dumps(SCHEMA), seed=3))
    assert first is again


def test_constrained_output_parses_validates_and_stops_at_the_grammars_end(engine) -> None:
    requests = {
        f"j{i}": (prompt(10 + i), SamplingParams(temperature=0, max_tokens=60, json_schema=SCHEMA))
        for i in range(3)
    }
    requests["o"] = (prompt(20), SamplingParams(temperature=0, max_tokens=40, json_object=True))
    requests["r"] = (prompt(21), SamplingParams(temperature=0, max_tokens=20, regex="(yes|no)"))
    requests["g"] = (
        prompt(22),
        SamplingParams(temperature=0, max_tokens=20, grammar='root ::= "light." ("on" | "off")'),
    )
    requests["s"] = (
        prompt(23),
        SamplingParams(temperature=0.8, seed=5, max_tokens=60, json_schema=SCHEMA),
    )
    tokens, reasons = run(engine, requests)
    tok = engine.tokenizer
    eos = set(engine.loaded.eos_token_ids)
    texts = {rid: tok.decode([t for t in ids if t not in eos]) for rid, ids in tokens.items()}
    for rid in ("j0", "j1", "j2", "s"):
        data = json.loads(texts[rid])
        assert isinstance(data["on"], bool)
        assert 0 <= data["level"] <= 100
        assert data["mode"] in {"heat", "cool", "auto"}
        assert reasons[rid] is FinishReason.STOP
        assert tokens[rid][-1] in eos
    assert reasons["o"] is FinishReason.LENGTH or isinstance(json.loads(texts["o"]), dict)
    assert texts["r"] in {"yes", "no"}
    assert texts["g"] in {"light.on", "light.off"}
    assert engine.kv_manager.num_used_blocks == 0
    assert not engine.structured._trackers


def test_latin_letters_before_hex_digits_come_out_as_written(engine) -> None:
    """ "Küche": xgrammar once printed ü as \\xfc and read \\xfcc back as U+0FCC; with any
    grammar library each value must come out exactly."""
    rooms = ["Küche 1a", "Fußboden", "Réception", "Café 2", "寝室 ✨"]
    requests = {
        room: (
            prompt(40 + i),
            SamplingParams(
                temperature=0,
                max_tokens=60,
                json_schema={
                    "type": "object",
                    "properties": {"room": {"enum": [room]}},
                    "required": ["room"],
                },
            ),
        )
        for i, room in enumerate(rooms)
    }
    tokens, _reasons = run(engine, requests)
    eos = set(engine.loaded.eos_token_ids)
    for room, ids in tokens.items():
        text = engine.tokenizer.decode([t for t in ids if t not in eos])
        assert json.loads(text) == {"room": room}


def test_max_tokens_inside_the_json_ends_with_length(engine) -> None:
    tokens, reasons = run(
        engine,
        {"cut": (prompt(30), SamplingParams(temperature=0, max_tokens=3, json_schema=SCHEMA))},
    )
    assert reasons["cut"] is FinishReason.LENGTH
    text = engine.tokenizer.decode(tokens["cut"])
    assert text.startswith("{")
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)


def test_ignore_eos_still_ends_where_the_grammar_ends(engine) -> None:
    params = SamplingParams(temperature=0, max_tokens=30, regex="(yes|no)", ignore_eos=True)
    tokens, reasons = run(engine, {"y": (prompt(31), params)})
    assert reasons["y"] is FinishReason.STOP
    assert engine.tokenizer.decode(tokens["y"][:-1]) in {"yes", "no"}


def test_free_requests_sharing_steps_with_constrained_ones_keep_generates_tokens(engine) -> None:
    free = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    requests = {f"f{i}": (prompt(40 + i, 5 + 7 * i), free) for i in range(3)}
    for i in range(3):
        requests[f"c{i}"] = (
            prompt(50 + i),
            SamplingParams(temperature=0, max_tokens=12, json_schema=SCHEMA),
        )
    tokens, _ = run(engine, requests)
    for i in range(3):
        prompt_ids = requests[f"f{i}"][0]
        assert tokens[f"f{i}"] == reference_greedy(engine.loaded.model, prompt_ids, 12)


def test_a_preempted_constrained_request_recomputes_to_the_same_tokens() -> None:
    # 8 blocks of 16 cannot hold three 40-token prompts growing to 64 tokens.
    params = SamplingParams(temperature=0, max_tokens=24, regex="[a-z ]+", ignore_eos=True)
    prompts = {f"p{i}": (prompt(60 + i, 40), params) for i in range(3)}
    prios = {"p0": Priority.BACKGROUND, "p1": Priority.AUTOMATION, "p2": Priority.INTERACTIVE}
    roomy = make_engine(vocab_size=VOCAB, block_size=16, max_model_len=128)
    expected, _ = run(roomy, prompts, prios)
    tight = make_engine(vocab_size=VOCAB, block_size=16, kv_budget=8 * 8192, max_model_len=128)
    assert tight.num_kv_blocks == 8
    got, reasons = run(tight, prompts, prios)
    assert tight.scheduler.num_preemptions > 0
    assert got == expected
    for rid, ids in got.items():
        assert reasons[rid] is FinishReason.LENGTH
        assert re.fullmatch("[a-z ]+", tight.tokenizer.decode(ids)), rid
    assert tight.kv_manager.num_used_blocks == 0


def test_matcher_follows_rollback_when_output_shrinks(engine) -> None:
    """sync() replays tokens the matcher missed and rolls back ones the sequence lost."""
    params = SamplingParams(temperature=0, max_tokens=10, regex="(ab)+c")
    seq = engine.add_request(prompt(70), params, request_id="rb")
    ids = [engine.tokenizer.encode(t, add_special_tokens=False)[0] for t in ("ab", "ab")]
    seq.token_ids.extend(ids)
    assert engine.structured.sync(seq)
    del seq.token_ids[-1]
    assert engine.structured.sync(seq)
    seq.token_ids.append(engine.tokenizer.encode("c", add_special_tokens=False)[0])
    assert engine.structured.sync(seq)
    assert engine.structured._trackers["rb"].matcher.is_completed()
    engine.abort("rb")
    assert not engine.structured.is_constrained("rb")
