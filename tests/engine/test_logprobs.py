"""Log probabilities: generated tokens' and the prompt's, against transformers' own logits.

Both runners: the torch runner over a tiny in-memory model, the numpy runner over a tiny
GGUF file (its reference is transformers' model of the same file). Values are the raw
model distribution's (log_softmax of the logits, before sampling settings).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from paged_llm.engine.core.sequence import SamplingParams
from paged_llm.engine.errors import InvalidSamplingParams
from paged_llm.engine.outputs import RequestOutput, TokenLogprob
from tests.helpers.support import make_engine

TOL = 1e-4
PROMPT = [5, 17, 300, 41, 7, 99, 12, 250, 3, 64, 128, 33, 71, 200, 18, 90, 45, 6, 11]


def reference(model: Any, ids: list[int]) -> np.ndarray:
    """transformers' log_softmax over every position of ``ids`` (float64), with sdpa."""
    impl = model.config._attn_implementation
    model.set_attn_implementation("sdpa")
    try:
        with torch.inference_mode():
            logits = model(input_ids=torch.tensor([ids])).logits[0].double()
    finally:
        model.set_attn_implementation(impl)
    result: np.ndarray = torch.log_softmax(logits, dim=-1).numpy()
    return result


def run(engine: Any, requests: dict[str, tuple[list[int], SamplingParams]]) -> dict[str, Any]:
    """Run ``requests`` together; per id: generated tokens, their records, prompt records."""
    for rid, (ids, params) in requests.items():
        engine.add_request(ids, params, request_id=rid)
    got: dict[str, dict[str, Any]] = {
        rid: {"tokens": [], "logprobs": [], "prompt": None, "outs": []} for rid in requests
    }
    while engine.has_unfinished():
        for out in engine.step():
            entry = got[out.request_id]
            entry["outs"].append(out)
            entry["tokens"].extend(out.token_ids)
            if out.logprobs is not None:
                entry["logprobs"].extend(out.logprobs)
            if out.prompt_logprobs is not None:
                assert entry["prompt"] is None  # given once
                entry["prompt"] = out.prompt_logprobs
    return got


def check_record(rec: TokenLogprob, row: np.ndarray, token: int, k: int) -> None:
    """One record against a reference log-softmax row."""
    assert rec.token_id == token
    assert abs(rec.logprob - row[token]) <= TOL
    assert rec.rank >= 1
    assert len(rec.top) == k
    values = [v for _, v in rec.top]
    assert values == sorted(values, reverse=True)
    want = np.sort(row)[::-1][:k]
    assert np.allclose(values, want, atol=TOL)
    for tid, value in rec.top:
        assert abs(value - row[tid]) <= TOL


def check_generated(model: Any, prompt: list[int], entry: dict[str, Any], k: int) -> None:
    """Every generated token's record against transformers' logits over the whole text."""
    tokens = entry["tokens"]
    ref = reference(model, prompt + tokens)
    assert len(entry["logprobs"]) == len(tokens)
    for i, (rec, token) in enumerate(zip(entry["logprobs"], tokens, strict=True)):
        check_record(rec, ref[len(prompt) + i - 1], token, k)


def check_prompt(model: Any, prompt: list[int], records: list[Any], start: int, k: int) -> None:
    """Prompt records: None before ``start`` (and at 0), transformers' values from it on."""
    ref = reference(model, prompt)
    assert len(records) == len(prompt)
    for pos, rec in enumerate(records):
        if pos < max(start, 1):
            assert rec is None
        else:
            check_record(rec, ref[pos - 1], prompt[pos], k)


@pytest.fixture(scope="module")
def tiny() -> Any:
    """A tiny llama engine factory (one model, fresh engines)."""

    def build(**overrides: Any) -> Any:
        return make_engine(block_size=8, **overrides)

    return build


def test_greedy_logprobs_are_transformers_and_argmax(tiny: Any) -> None:
    engine = tiny()
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=5)
    got = run(engine, {"a": (PROMPT, params)})["a"]
    check_generated(engine.loaded.model, PROMPT, got, 5)
    for rec in got["logprobs"]:
        assert rec.rank == 1
        assert rec.top[0][0] == rec.token_id  # greedy: the chosen token is the top one


def test_sampled_tokens_get_the_raw_distributions_logprobs(tiny: Any) -> None:
    # Temperature and penalties change what is sampled, not the logprobs reported.
    engine = tiny()
    params = SamplingParams(
        temperature=1.5, top_k=20, seed=7, max_tokens=6, ignore_eos=True, logprobs=0,
        repetition_penalty=1.3,
    )  # fmt: skip
    got = run(engine, {"a": (PROMPT, params)})["a"]
    check_generated(engine.loaded.model, PROMPT, got, 0)


def test_prompt_logprobs_are_transformers(tiny: Any) -> None:
    # A budget of 8 tokens per step: the prompt comes in chunks, each scoring its rows.
    engine = tiny(max_num_batched_tokens=8)
    params = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=3)
    got = run(engine, {"a": (PROMPT, params)})["a"]
    check_prompt(engine.loaded.model, PROMPT, got["prompt"], 0, 3)
    assert got["logprobs"] == []  # not asked for the generated token


def test_batching_does_not_change_logprobs(tiny: Any) -> None:
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True, logprobs=4,
                            prompt_logprobs=2)  # fmt: skip
    alone = run(tiny(), {"a": (PROMPT, params)})["a"]
    others = SamplingParams(temperature=0.8, seed=3, max_tokens=7, ignore_eos=True)
    together = run(
        tiny(max_num_batched_tokens=16),
        {
            "x": (list(range(30, 70)), others),
            "a": (PROMPT, params),
            "y": ([9, 8, 7], SamplingParams(max_tokens=4, logprobs=1)),
        },
    )
    got = together["a"]
    assert got["tokens"] == alone["tokens"]
    for ours, theirs in zip(got["logprobs"], alone["logprobs"], strict=True):
        assert ours.token_id == theirs.token_id
        assert abs(ours.logprob - theirs.logprob) <= 1e-5
        assert [t for t, _ in ours.top] == [t for t, _ in theirs.top]
    for ours, theirs in zip(got["prompt"][1:], alone["prompt"][1:], strict=True):
        assert abs(ours.logprob - theirs.logprob) <= 1e-5
    assert all(
        out.logprobs is None and out.prompt_logprobs is None for out in together["x"]["outs"]
    )
    assert together["y"]["prompt"] is None
    assert len(together["y"]["logprobs"]) == 4


def test_a_request_without_logprobs_pays_nothing(tiny: Any) -> None:
    engine = tiny()
    engine.add_request(PROMPT, SamplingParams(temperature=0, max_tokens=3), request_id="a")
    while engine.has_unfinished():
        for out in engine.step():
            assert out.logprobs is None
            assert out.prompt_logprobs is None
        # Nothing computed: no records, and only the sampling rows went through the head.
        assert not engine.runner.logprobs.sampled
        assert not engine.runner.logprobs.prompt


def test_scoring_a_continuation_reuses_the_cached_prefix(tiny: Any) -> None:
    """The evaluate shape: prefix + alternative, max_tokens=1, scoring only the tail."""
    engine = tiny()
    model = engine.loaded.model
    prefix = PROMPT + list(range(100, 120))  # 39 tokens: 4 full blocks of 8
    warm = run(engine, {"warm": ([*prefix, 1], SamplingParams(max_tokens=1))})["warm"]
    assert warm["outs"][-1].cached_tokens == 0
    for alt in ([400, 401, 402], [7]):
        params = SamplingParams(max_tokens=1, prompt_logprobs=0, prompt_logprobs_from=-len(alt))
        got = run(engine, {"alt": (prefix + alt, params)})["alt"]
        out: RequestOutput = got["outs"][-1]
        # The prefix came from the cache, the scored tail (and the row before it) did not.
        assert out.cached_tokens == (len(prefix) - 1) // 8 * 8 > 0
        check_prompt(model, prefix + alt, got["prompt"], len(prefix), 0)
        total = sum(rec.logprob for rec in got["prompt"][len(prefix) :])
        ref = reference(model, prefix + alt)
        want = sum(ref[len(prefix) + i - 1, t] for i, t in enumerate(alt))
        assert abs(total - want) <= TOL * len(alt)
    # Scoring the whole prompt takes nothing from the cache (every row is needed).
    params = SamplingParams(max_tokens=1, prompt_logprobs=1)
    got = run(engine, {"all": ([*prefix, 400], params)})["all"]
    assert got["outs"][-1].cached_tokens == 0
    check_prompt(model, [*prefix, 400], got["prompt"], 0, 1)


def test_prompt_logprobs_survive_preemption(tiny: Any) -> None:
    """A preempted request keeps its scored rows and scores only what is missing."""
    engine = tiny(max_num_batched_tokens=8)
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, prompt_logprobs=1,
                            logprobs=1)  # fmt: skip
    engine.add_request(PROMPT, params, request_id="a")
    engine.step()  # the first chunk is scored
    seq = engine.scheduler.get("a")
    done = len(seq.scored_prompt)
    assert done > 0
    # Preempt by hand as the scheduler does, then run to the end.
    engine.scheduler._preempt(seq, _step(engine))
    got: dict[str, Any] = {"tokens": [], "logprobs": [], "prompt": None}
    while engine.has_unfinished():
        for out in engine.step():
            got["tokens"].extend(out.token_ids)
            got["logprobs"].extend(out.logprobs or [])
            if out.prompt_logprobs is not None:
                got["prompt"] = out.prompt_logprobs
    check_prompt(engine.loaded.model, PROMPT, got["prompt"], 0, 1)
    check_generated(engine.loaded.model, PROMPT, got, 1)


def _step(engine: Any) -> Any:
    """A scheduler step record to preempt into."""
    from paged_llm.engine.core.scheduler import _Step

    return _Step(now=0.0, budget=0, seconds=None)


@pytest.mark.parametrize(
    ("field", "value"),
    [("logprobs", -1), ("logprobs", 21), ("logprobs", 2.0), ("logprobs", True),
     ("prompt_logprobs", 21), ("prompt_logprobs", "3"), ("prompt_logprobs_from", 1.5)],
)  # fmt: skip
def test_bad_values_name_the_field(field: str, value: object) -> None:
    with pytest.raises(InvalidSamplingParams, match=f"^{field} "):
        SamplingParams(**{field: value})  # type: ignore[arg-type]


def test_numpy_runner_logprobs_are_transformers(tmp_path: Path) -> None:
    """The numpy runner over a tiny float32 GGUF file, against transformers' model of it."""
    from paged_llm.engine.model.cpu_runner import CpuRunner
    from paged_llm.engine.model.selector import load_model
    from paged_llm.kernels.cpu import forward as cpu_forward
    from tests.engine.test_cpu_runner import engine, engine_config, numpy_engine
    from tests.helpers.gguf_files import QK, write_gguf

    if cpu_forward.unavailable() is not None:
        pytest.skip(f"no C forward: {cpu_forward.unavailable()}")
    path = write_gguf(tmp_path / "m", "llama", {"*": QK.F32}, tmp_path / "cache")
    # A float32 pool: the default float16 one rounds K/V beyond the tolerance.
    exact = {"kv_cache_dtype": "float32"}
    ours = numpy_engine(path, engine(str(path), "torch", tmp_path / "cache", **exact))
    assert isinstance(ours.runner, CpuRunner)
    settings = engine_config(str(path), "torch", tmp_path / "cache")
    model = load_model(settings, native_model=False).model
    prompt = PROMPT * 5  # 95 tokens: chunks of the 64-token step budget
    params = SamplingParams(
        temperature=0, max_tokens=5, ignore_eos=True, logprobs=3, prompt_logprobs=2
    )
    others = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    got = run(ours, {"a": (prompt, params), "b": ([9] * 40, others)})
    check_generated(model, prompt, got["a"], 3)
    for rec in got["a"]["logprobs"]:
        assert rec.top[0][0] == rec.token_id
    check_prompt(model, prompt, got["a"]["prompt"], 0, 2)
    assert all(out.logprobs is None for out in got["b"]["outs"])


def test_max_tokens_zero_scores_without_generating(tiny: Any) -> None:
    """max_tokens=0 (with prompt_logprobs only): one output, no token, the prompt's values."""
    engine = tiny(max_num_batched_tokens=8)
    params = SamplingParams(max_tokens=0, prompt_logprobs=1, logprobs=2, prompt_logprobs_from=-4)
    got = run(engine, {"a": (PROMPT, params)})["a"]
    assert got["tokens"] == []
    assert got["logprobs"] == []
    [out] = got["outs"]
    assert out.finished
    assert out.completion_tokens == 0
    assert out.text == ""
    check_prompt(engine.loaded.model, PROMPT, got["prompt"], len(PROMPT) - 4, 1)
    assert engine.kv_manager.num_used_blocks == 0
    with pytest.raises(InvalidSamplingParams, match=r"^max_tokens "):
        SamplingParams(max_tokens=0)
