"""Repetition, frequency and presence penalties: definitions, transformers parity, seeds."""

from __future__ import annotations

import random
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from paged_llm.engine.config import EngineConfig
from paged_llm.engine.core.sequence import Priority, SamplingParams, Sequence
from paged_llm.engine.errors import InvalidSamplingParams
from paged_llm.engine.llm_engine import LLMEngine
from paged_llm.engine.model.loader import load_model
from paged_llm.engine.sample.penalties import apply_penalties
from tests.helpers.support import make_engine


def seq(prompt: list[int], output: list[int], **params: object) -> Sequence:
    """A sequence with ``output`` already generated."""
    s = Sequence("r", prompt, SamplingParams(**params), Priority.INTERACTIVE, 0.0)  # type: ignore[arg-type]
    for token in output:
        s.append_token(token)
    return s


def reference(row: torch.Tensor, s: Sequence) -> torch.Tensor:
    """The definitions, one token at a time."""
    out = row.clone()
    p = s.params
    seen = set(s.prompt_token_ids) | set(s.output_token_ids)
    for token in range(len(out)):
        value = float(out[token])
        if token in seen:
            r = p.repetition_penalty or 1.0  # None: the model's own, 1 for these
            value = value / r if value > 0 else value * r
        count = s.output_token_ids.count(token)
        value -= p.frequency_penalty * count
        value -= p.presence_penalty * (count > 0)
        out[token] = value
    return out


def test_each_penalty_matches_its_definition_row_by_row() -> None:
    torch.manual_seed(0)
    logits = torch.randn(5, 40) * 3
    seqs = [
        seq([1, 2, 3], [4, 4, 5], repetition_penalty=1.5),
        seq([1, 2, 3], [4, 4, 5], frequency_penalty=0.7),
        seq([1, 2, 3], [4, 4, 5], presence_penalty=-1.2),
        seq([1, 2, 3], [4, 4, 5]),  # no penalty: untouched
        seq([7, 8], [9, 9, 9, 8], repetition_penalty=0.8, frequency_penalty=2, presence_penalty=1),
    ]
    out = logits.clone()
    apply_penalties(out, seqs)
    for i, s in enumerate(seqs):
        torch.testing.assert_close(out[i], reference(logits[i], s))
    assert torch.equal(out[3], logits[3])
    # Frequency counts repeats; the prompt alone is not penalised by it.
    assert out[1, 4] == pytest.approx(float(logits[1, 4]) - 1.4)
    assert out[1, 1] == logits[1, 1]


def test_no_penalties_leave_the_logits_untouched() -> None:
    logits = torch.randn(2, 10)
    out = logits.clone()
    apply_penalties(out, [seq([1], [2]), seq([3], [])])
    assert torch.equal(out, logits)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_logits_are_penalised_in_float32_and_stored_back(dtype: torch.dtype) -> None:
    torch.manual_seed(1)
    logits = (torch.randn(2, 30) * 3).to(dtype)
    seqs = [seq([1, 2], [3, 3, 2], repetition_penalty=1.3, frequency_penalty=0.4), seq([5], [6])]
    out = logits.clone()
    apply_penalties(out, seqs)
    assert out.dtype == dtype
    assert torch.equal(out[0], reference(logits[0].float(), seqs[0]).to(dtype))
    assert torch.equal(out[1], logits[1])


def test_a_long_prompt_and_a_large_vocabulary_equal_the_definition() -> None:
    """Repeated tokens in the prompt and the output, every penalty on, Qwen's vocabulary."""
    rng = random.Random(2)
    vocab = 151_936
    prompt = [rng.randrange(vocab) for _ in range(1500)] + [7] * 20
    output = [rng.choice(prompt) for _ in range(150)] + [rng.randrange(vocab) for _ in range(50)]
    s = seq(prompt, output, repetition_penalty=1.2, frequency_penalty=0.3, presence_penalty=0.2)
    torch.manual_seed(2)
    logits = torch.randn(1, vocab) * 4
    out = logits.clone()
    apply_penalties(out, [s])
    touched = sorted(set(prompt) | set(output))
    # The reference works in double precision, the engine in float32.
    torch.testing.assert_close(
        out[0, touched], reference(logits[0, touched], _renumbered(s, touched))
    )
    untouched = torch.ones(vocab, dtype=torch.bool)
    untouched[touched] = False
    assert torch.equal(out[0, untouched], logits[0, untouched])


def _renumbered(s: Sequence, touched: list[int]) -> Sequence:
    """``s`` with its tokens renumbered to their places in ``touched`` (the reference walks
    every token of the row it gets, so it gets only the touched ones)."""
    place = {token: i for i, token in enumerate(touched)}
    renumbered = seq([place[t] for t in s.prompt_token_ids], [], **_params(s))
    for token in s.output_token_ids:
        renumbered.append_token(place[token])
    return renumbered


def _params(s: Sequence) -> dict[str, object]:
    """The penalties of ``s`` as keyword arguments."""
    p = s.params
    return {
        "repetition_penalty": p.repetition_penalty,
        "frequency_penalty": p.frequency_penalty,
        "presence_penalty": p.presence_penalty,
    }


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("repetition_penalty", 0),
        ("repetition_penalty", float("nan")),
        ("frequency_penalty", 2.5),
        ("presence_penalty", -3),
        ("presence_penalty", "1"),
    ],
)
def test_invalid_penalties_name_the_field(field: str, value: object) -> None:
    with pytest.raises(InvalidSamplingParams, match=field):
        SamplingParams(**{field: value})  # type: ignore[arg-type]


def test_greedy_repetition_penalty_equals_transformers() -> None:
    """transformers' RepetitionPenaltyLogitsProcessor has the same definition."""
    engine = make_engine()
    model = engine.loaded.model
    prompt = [random.Random(3).randrange(3, 512) for _ in range(20)]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, repetition_penalty=1.6)
    engine.add_request(prompt, params, request_id="p")
    engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
    tokens: dict[str, list[int]] = {}
    while engine.has_unfinished():
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.token_ids)
    model.set_attn_implementation("sdpa")
    ids = model.generate(
        torch.tensor([prompt]),
        max_new_tokens=24,
        do_sample=False,
        eos_token_id=None,
        repetition_penalty=1.6,
    )
    assert tokens["p"] == ids[0, len(prompt) :].tolist()
    # The penalty changed the answer: the unpenalised twin differs.
    assert tokens["p"] != tokens["req-1"]


def run(engine, requests: list[tuple[str, SamplingParams]]) -> dict[str, list[int]]:
    """Run requests sharing every step; tokens per request id."""
    prompt = list(range(10, 30))
    for rid, params in requests:
        engine.add_request(prompt, params, request_id=rid)
    tokens: dict[str, list[int]] = {}
    while engine.has_unfinished():
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.token_ids)
    return tokens


def test_seeded_penalised_request_is_the_same_alone_or_batched() -> None:
    seeded = SamplingParams(
        temperature=1.0,
        seed=11,
        max_tokens=16,
        ignore_eos=True,
        repetition_penalty=1.3,
        frequency_penalty=0.5,
        presence_penalty=0.4,
    )
    alone = run(make_engine(), [("s", seeded)])["s"]
    others = [
        (f"o{i}", SamplingParams(temperature=0.8, max_tokens=8 + i, frequency_penalty=1.0))
        for i in range(3)
    ]
    batched = run(make_engine(), [*others, ("s", seeded)])["s"]
    assert alone == batched


def test_a_request_without_a_repetition_penalty_gets_the_models_own(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Qwen2.5's generation_config sets one; transformers applies it to greedy decoding."""
    from transformers import GenerationConfig

    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir, folder)
    GenerationConfig(bos_token_id=1, eos_token_id=2, repetition_penalty=1.6).save_pretrained(folder)
    config = EngineConfig(model=str(folder), device="cpu", dtype="float32", kv_budget=8 * 2**20)
    loaded = load_model(config)
    assert loaded.repetition_penalty == 1.6
    engine = LLMEngine(loaded, config)
    prompt = [random.Random(5).randrange(3, 2000) for _ in range(20)]
    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    engine.add_request(prompt, greedy, request_id="own")
    engine.add_request(prompt, replace(greedy, repetition_penalty=1.0), request_id="off")
    tokens: dict[str, list[int]] = {}
    while engine.has_unfinished():
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.token_ids)
    model = loaded.model
    model.set_attn_implementation("sdpa")
    for rid, extra in (("own", {}), ("off", {"repetition_penalty": 1.0})):
        ids = model.generate(
            torch.tensor([prompt]), max_new_tokens=24, do_sample=False, eos_token_id=None, **extra
        )
        assert tokens[rid] == ids[0, len(prompt) :].tolist(), rid
    assert tokens["own"] != tokens["off"]
