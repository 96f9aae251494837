"""Min-p in both samplers: transformers' MinPLogitsWarper's kept set, the same in each."""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
)

from paged_llm.engine.core.sequence import InvalidSamplingParams, Priority, SamplingParams, Sequence
from paged_llm.engine.sample.numpy_sampler import NumpySampler
from paged_llm.engine.sample.sampler import Sampler, _floors

CPU = torch.device("cpu")
QWEN_VOCAB = 151_936
# transformers compares float32 probabilities (min_p * the top's), the samplers float32
# logits (the top's plus log(min_p)): tokens this close to the cut may fall either side.
EDGE = 1e-4


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    """torch's pool on a shared 2-core machine spins; one thread keeps the oracle quick."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def seq(rid: str, **params: object) -> Sequence:
    return Sequence(rid, [1], SamplingParams(**params), Priority.INTERACTIVE, 0.0)  # type: ignore[arg-type]


def rows(count: int, vocab: int, spread: float, seed: int) -> np.ndarray:
    """Random float32 logits from flat (small spread) to peaked (large spread)."""
    return (np.random.default_rng(seed).standard_normal((count, vocab)) * spread).astype(np.float32)


def torch_kept(row: np.ndarray, params: SamplingParams) -> np.ndarray:
    """The torch sampler's kept set for one row: its scaling and its floors."""
    scaled = torch.from_numpy(row).unsqueeze(0) / torch.tensor([params.temperature])
    s = Sequence("t", [1], params, Priority.INTERACTIVE, 0.0)
    floor = _floors(scaled, [s])
    if floor is None:
        return np.ones(row.shape[0], np.bool_)
    kept: np.ndarray = (scaled[0] >= floor[0]).numpy()
    return kept


def transformers_kept(row: np.ndarray, params: SamplingParams) -> np.ndarray:
    """transformers' kept set: temperature, top-k, then MinPLogitsWarper, generate's order."""
    scores = torch.from_numpy(row).unsqueeze(0).clone()
    ids = torch.zeros((1, 1), dtype=torch.long)
    if params.temperature != 1.0:
        scores = TemperatureLogitsWarper(params.temperature)(ids, scores)
    if params.top_k:
        scores = TopKLogitsWarper(params.top_k)(ids, scores)
    scores = MinPLogitsWarper(params.min_p)(ids, scores)
    kept: np.ndarray = (scores[0] > float("-inf")).numpy()
    return kept


@pytest.mark.parametrize("vocab", [50, 3000, QWEN_VOCAB])
@pytest.mark.parametrize("spread", [0.3, 1.0, 3.0, 12.0])
@pytest.mark.parametrize(
    "params",
    [
        {"min_p": 0.05},
        {"min_p": 0.3},
        {"min_p": 0.9},
        {"min_p": 1e-4},
        {"min_p": 0.1, "temperature": 0.7},
        {"min_p": 0.1, "temperature": 1.5},
        {"min_p": 0.02, "top_k": 40},
        {"min_p": 0.2, "top_k": 2000, "temperature": 0.8},
    ],
)
def test_kept_sets_are_transformers_and_the_same_in_both_samplers(
    vocab: int, spread: float, params: dict[str, object]
) -> None:
    logits = rows(2, vocab, spread, int(spread * 10) + vocab)
    sampler = NumpySampler(0)
    for row in logits:
        s = seq("x", **params)
        ours = sampler._kept(row, s)
        assert np.array_equal(ours, torch_kept(row, s.params)), params
        theirs = transformers_kept(row, s.params)
        scaled = (row / np.float32(s.params.temperature)).astype(np.float64)
        gap = np.abs(scaled - scaled.max() - math.log(s.params.min_p))
        differ = np.flatnonzero(ours != theirs)
        assert (gap[differ] < EDGE).all(), (params, differ, gap[differ])
        assert ours[int(row.argmax())]


@pytest.mark.parametrize("spread", [1.0, 6.0])
@pytest.mark.parametrize("params", [{"top_p": 0.9, "min_p": 0.05}, {"top_p": 0.5, "min_p": 0.2}])
def test_with_top_p_the_kept_set_is_both_sets(spread: float, params: dict[str, object]) -> None:
    """Min-p after top-p (transformers' order) keeps the tokens both keep, in both samplers."""
    row = rows(1, QWEN_VOCAB, spread, 3)[0]
    sampler = NumpySampler(0)
    both = seq("b", **params)
    top_p = sampler._kept(row, seq("p", top_p=params["top_p"])).copy()
    min_p = sampler._kept(row, seq("m", min_p=params["min_p"])).copy()
    kept = sampler._kept(row, both)
    assert np.array_equal(kept, top_p & min_p)
    assert np.array_equal(kept, torch_kept(row, both.params))


def test_ties_with_the_top_are_kept_and_min_p_one_keeps_only_them() -> None:
    row = np.array([3.0, 1.0, 3.0, 2.9, -1.0], np.float32)
    s = seq("t", min_p=1.0)
    assert NumpySampler(0)._kept(row, s).tolist() == [True, False, True, False, False]
    assert torch_kept(row, s.params).tolist() == [True, False, True, False, False]
    assert transformers_kept(row, s.params).tolist() == [True, False, True, False, False]
    draws = {NumpySampler(i).sample(row[None], [seq(f"d{i}", min_p=1.0)])[0] for i in range(40)}
    assert draws == {0, 2}
    torch_draws = {Sampler(CPU).sample(torch.from_numpy(row[None]), [s])[0] for _ in range(40)}
    assert torch_draws == {0, 2}


def test_min_p_zero_is_off() -> None:
    logits = rows(1, 3000, 1.0, 4)
    assert NumpySampler(0)._kept(logits[0], seq("z", min_p=0.0)).all()
    assert torch_kept(logits[0], SamplingParams(min_p=0.0)).all()
    off = [NumpySampler().sample(logits, [seq("a", seed=5)])[0] for _ in range(5)]
    zero = [NumpySampler().sample(logits, [seq("a", seed=5, min_p=0.0)])[0] for _ in range(5)]
    assert off == zero


@pytest.mark.parametrize("spread", [0.5, 4.0])
@pytest.mark.parametrize("params", [{"min_p": 0.1}, {"min_p": 0.01, "top_k": 50}, {"min_p": 0.001}])
def test_draws_land_in_the_kept_set_in_both_samplers(
    spread: float, params: dict[str, object]
) -> None:
    logits = rows(1, QWEN_VOCAB, spread, 12)
    s = seq("q", **params)
    kept = NumpySampler(0)._kept(logits[0], s)
    sampler = NumpySampler(5)
    draws = [sampler.sample(logits, [s])[0] for _ in range(100)]
    assert kept[draws].all()
    torch_sampler = Sampler(CPU)
    tensor = torch.from_numpy(logits)
    assert kept[[torch_sampler.sample(tensor, [s])[0] for _ in range(100)]].all()
    if kept.sum() > 1000:
        assert len(set(draws)) > 10


def test_draws_follow_the_renormalised_kept_distribution() -> None:
    logits = np.log(np.array([[0.4, 0.3, 0.2, 0.06, 0.04]], np.float32))
    s = seq("d", min_p=0.4)  # keeps 0.4, 0.3, 0.2: each token's share of 0.9
    numpy_sampler, torch_sampler = NumpySampler(2), Sampler(CPU)
    tensor = torch.from_numpy(logits)
    numpy_draws = [numpy_sampler.sample(logits, [s])[0] for _ in range(20_000)]
    torch_draws = [torch_sampler.sample(tensor, [s])[0] for _ in range(20_000)]
    for draws in (numpy_draws, torch_draws):
        counts = np.bincount(draws, minlength=5)
        assert counts[3:].sum() == 0
        shares = counts[:3] / counts.sum()
        assert np.allclose(shares, [4 / 9, 3 / 9, 2 / 9], atol=0.015), shares


@pytest.mark.parametrize("params", [{"min_p": 0.05}, {"min_p": 0.1, "top_p": 0.9, "top_k": 100}])
def test_seeded_min_p_is_reproducible_and_batch_invariant(params: dict[str, object]) -> None:
    """Seeded tokens repeat run to run and alone or among other requests, in both samplers."""
    logits = rows(6, QWEN_VOCAB, 2.0, 21)
    others = [{"min_p": 0.5}, {}, {"top_k": 5}, {"temperature": 0}, {"min_p": 0.01, "seed": 3}]
    for use_torch in (False, True):
        runs = []
        for place in (None, None, 0, 3):
            sampler = Sampler(CPU) if use_torch else NumpySampler()
            tokens = []
            for step in range(logits.shape[0]):
                seqs = [] if place is None else [seq(f"n{i}", **n) for i, n in enumerate(others)]
                seqs.insert(place or 0, seq("target", seed=77, temperature=0.9, **params))
                batch = np.repeat(logits[step : step + 1], len(seqs), axis=0)
                rows_in = torch.from_numpy(batch) if use_torch else batch
                tokens.append(sampler.sample(rows_in, seqs)[place or 0])  # type: ignore[arg-type]
            runs.append(tokens)
        assert all(run == runs[0] for run in runs), (use_torch, runs)
        assert len(set(runs[0])) > 1


@pytest.mark.parametrize("value", [-0.1, 1.5, float("nan"), float("inf"), True, "0.1", None])
def test_out_of_range_min_p_is_refused(value: object) -> None:
    with pytest.raises(InvalidSamplingParams, match="min_p"):
        SamplingParams(min_p=value)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [0, 0.0, 0.05, 1, 1.0])
def test_min_p_in_range_is_accepted(value: float) -> None:
    assert SamplingParams(min_p=value).min_p == value
