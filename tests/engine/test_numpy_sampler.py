"""The numpy sampler and penalties against the torch ones: same argmax, kept sets, bits."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from paged_llm.engine.core.sequence import Priority, SamplingParams, Sequence
from paged_llm.engine.sample.numpy_penalties import apply_penalties as numpy_penalties
from paged_llm.engine.sample.numpy_sampler import NumpySampler
from paged_llm.engine.sample.penalties import apply_penalties as torch_penalties
from paged_llm.engine.sample.sampler import _TOPK_FAST_LIMIT, Sampler, _kept_floor, _whole_row_floor
from tests.helpers.without_torch import run_without_torch

ROOT = Path(__file__).resolve().parents[2]
CPU = torch.device("cpu")
QWEN_VOCAB = 151_936


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    """torch's pool on a shared 2-core machine spins; one thread keeps the oracle quick."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def seq(rid: str, prompt: list[int] | None = None, **params: object) -> Sequence:
    return Sequence(rid, prompt or [1], SamplingParams(**params), Priority.INTERACTIVE, 0.0)  # type: ignore[arg-type]


def rows(count: int, vocab: int, spread: float, seed: int) -> np.ndarray:
    """Random float32 logits from flat (small spread) to peaked (large spread)."""
    return (np.random.default_rng(seed).standard_normal((count, vocab)) * spread).astype(np.float32)


# --- greedy -----------------------------------------------------------------------------


def test_greedy_is_torch_argmax_with_ties_infinities_and_nan() -> None:
    logits = rows(8, 1000, 3.0, 0)
    logits[1, [5, 9, 700]] = 50.0  # a three-way tie: the first wins
    logits[2] = float("-inf")  # all -inf: token 0
    logits[3, 10:20] = float("-inf")
    logits[4, [3, 400]] = float("nan")  # NaN counts as largest: the first NaN
    logits[5, [8, 2]] = float("inf")
    logits[6] = 0.0
    logits[7, [999, 7]] = [float("inf"), float("nan")]
    seqs = [seq(str(i), temperature=0) for i in range(8)]
    expected = torch.from_numpy(logits).argmax(dim=-1).tolist()
    assert expected[1:5] == [5, 0, expected[3], 3]
    assert NumpySampler(0).sample(logits, seqs) == expected
    assert Sampler(CPU).sample(torch.from_numpy(logits), seqs) == expected
    # top_k 1 is greedy too, and a greedy row in a mixed batch keeps torch's argmax.
    mixed = [seq("k", top_k=1, temperature=2.0), seq("s", seed=1), *seqs[2:]]
    out = NumpySampler(0).sample(logits, mixed)
    assert out[0] == expected[0]
    assert out[2:] == expected[2:]


def test_half_logits_are_sampled_as_float32() -> None:
    logits = rows(3, 500, 2.0, 1).astype(np.float16)
    greedy = NumpySampler(0).sample(logits, [seq(str(i), temperature=0) for i in range(3)])
    assert greedy == torch.from_numpy(logits).argmax(dim=-1).tolist()
    a = NumpySampler().sample(logits, [seq(str(i), seed=i, top_k=20) for i in range(3)])
    b = NumpySampler().sample(
        logits.astype(np.float32), [seq(str(i), seed=i, top_k=20) for i in range(3)]
    )
    assert a == b


# --- kept sets ----------------------------------------------------------------------------


def torch_kept(row: np.ndarray, params: SamplingParams) -> np.ndarray:
    """The torch sampler's kept set for one row: its own floor functions, as it groups rows."""
    vocab = row.shape[0]
    scaled = torch.from_numpy(row).unsqueeze(0) / torch.tensor([params.temperature])
    k = params.top_k if 0 < params.top_k < vocab else vocab
    if k <= _TOPK_FAST_LIMIT and k < vocab:
        floor = _kept_floor(scaled.topk(k, dim=-1).values, [k], [params.top_p])
    else:
        floor = _whole_row_floor(scaled, [k], [params.top_p])
    kept: np.ndarray = (scaled[0] >= floor[0]).numpy()
    return kept


def definition(row: np.ndarray, params: SamplingParams) -> tuple[np.ndarray, np.ndarray, float]:
    """The kept set by the definition, the mass before each token, in float64, and p.

    Both samplers divide by the temperature in float32; from there it is float64: the
    top k while the probability mass before them (softmax over the top k) is below p, and
    every token at or above the last one kept. A token's mass is its tie group's first.
    """
    scaled = (row / np.float32(params.temperature)).astype(np.float64)
    vocab = row.shape[0]
    k = params.top_k if 0 < params.top_k < vocab else vocab
    order = np.argsort(-scaled, kind="stable")
    top = scaled[order[:k]]
    probs = np.exp(top - top[0])
    probs /= probs.sum()
    before_ranked = np.cumsum(probs) - probs
    p = float(np.float32(params.top_p))
    kept_count = k if p >= 1.0 else int(np.count_nonzero(before_ranked < p))
    before = np.full(vocab, 1.0)
    before[order[:k]] = before_ranked[np.searchsorted(-top, -top, side="left")]
    return scaled >= top[kept_count - 1], before, p


# How far from p the torch sampler's float32 mass (a float32 softmax over up to 151,936
# tokens) puts its edge, as measured: up to 2.2e-5 at Qwen's vocabulary.
TORCH_ROUNDING = 5e-5

PARAMS = [
    {"top_k": 40},
    {"top_k": 1000},
    {"top_k": 5000, "top_p": 0.9},
    {"top_p": 0.9},
    {"top_p": 0.5},
    {"top_p": 0.99},
    {"top_k": 40, "top_p": 0.8},
    {"top_p": 0.05, "temperature": 0.7},
    {"top_p": 0.9, "temperature": 0.7, "top_k": 200},
]


@pytest.mark.parametrize("vocab", [QWEN_VOCAB, 50, 3000])
@pytest.mark.parametrize("spread", [0.3, 1.0, 3.0, 6.0, 12.0, 30.0])
def test_kept_sets_are_the_definitions_and_the_torch_samplers(vocab: int, spread: float) -> None:
    """Flat to peaked rows: the numpy kept set is the float64 definition; the torch
    sampler's equals it except tokens whose mass before lies within float32 rounding of p
    (its float32 softmax over the row; for top-k alone, its running mass reaching 1.0)."""
    logits = rows(2, vocab, spread, int(spread * 10) + vocab)
    sampler = NumpySampler(0)
    exact = 0
    for params in PARAMS:
        for row in logits:
            s = seq("x", **params)
            ours = sampler._kept(row, s)
            expected, before, p = definition(row, s.params)
            assert np.array_equal(ours, expected), (params, spread)
            theirs = torch_kept(row, s.params)
            differ = np.flatnonzero(ours != theirs)
            assert (np.abs(before[differ] - p) < TORCH_ROUNDING).all(), (params, spread)
            exact += differ.size == 0
    # Most rows agree token for token; the rest only at the rounding edge.
    assert exact >= len(PARAMS) * len(logits) * 2 // 3


def test_ties_across_the_edge_are_kept_whole() -> None:
    logits = rows(1, 20_000, 1.0, 5)[0]
    logits[:500] = 9.0  # 500 tokens share the top: the nucleus ends among them
    sampler = NumpySampler(0)
    for p in (0.3, 0.6):
        s = seq("t", top_p=p)
        assert sampler._kept(logits, s).sum() == 500
        assert np.array_equal(sampler._kept(logits, s), torch_kept(logits, s.params))
    four = np.array([[1.0, 1.0, 1.0, 1.0, -9.0]], np.float32)
    s = seq("k", top_k=2)
    assert np.array_equal(sampler._kept(four[0], s), torch_kept(four[0], s.params))
    assert {sampler.sample(four, [seq(f"s{i}", top_k=2)])[0] for i in range(300)} == {0, 1, 2, 3}


def test_top_p_keeps_only_the_nucleus_and_temperature_sharpens() -> None:
    logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05]], np.float32))
    sampler = NumpySampler(0)
    assert {sampler.sample(logits, [seq(f"x{i}", top_p=0.7)])[0] for i in range(300)} == {0, 1}
    wide = np.array([[2.0, 1.0, 0.0]], np.float32)
    cold = [sampler.sample(wide, [seq("c", temperature=0.1)])[0] for _ in range(300)]
    hot = [sampler.sample(wide, [seq("h", temperature=5.0)])[0] for _ in range(300)]
    assert cold.count(0) > 295
    assert 50 < hot.count(0) < 200


@pytest.mark.parametrize("params", [{}, {"top_k": 3}, {"top_p": 0.5}, {"top_k": 40, "top_p": 0.9}])
def test_draws_follow_the_kept_distribution(params: dict[str, object]) -> None:
    """Frequencies over many draws match the kept softmax (the inverse CDF is unbiased)."""
    vocab = 3000
    logits = rows(1, vocab, 1.0, 9)
    logits[0, :6] = [6.0, 5.5, 5.0, 4.0, 3.0, 2.0]  # mass enough in few tokens to count
    s = seq("d", **params)
    sampler = NumpySampler(3)
    kept = sampler._kept(logits[0], s)
    weights = np.where(kept, np.exp(logits[0].astype(np.float64) - 6.0), 0.0)
    probs = weights / weights.sum()
    draws = np.bincount([sampler.sample(logits, [s])[0] for _ in range(20_000)], minlength=vocab)
    assert kept[np.flatnonzero(draws)].all()
    for token in range(4):
        assert abs(draws[token] / 20_000 - probs[token]) < 0.015, token


@pytest.mark.parametrize("spread", [0.5, 6.0])
@pytest.mark.parametrize("params", [{"top_p": 0.5}, {"top_p": 0.9}, {"top_k": 6000, "top_p": 0.95}])
def test_draws_land_in_the_kept_set_at_qwens_vocabulary(
    spread: float, params: dict[str, object]
) -> None:
    """Large kept sets (flat rows) are drawn from masked weights, small ones by index."""
    logits = rows(1, QWEN_VOCAB, spread, 12)
    s = seq("q", **params)
    sampler = NumpySampler(5)
    kept = sampler._kept(logits[0], s)
    draws = [sampler.sample(logits, [s])[0] for _ in range(100)]
    assert kept[draws].all()
    if kept.sum() > 1000:
        assert len(set(draws)) > 10


@pytest.mark.parametrize("params", [{}, {"top_k": 2}, {"top_p": 0.5}])
def test_undefined_rows_give_the_last_token_as_the_torch_sampler_does(
    params: dict[str, object],
) -> None:
    bad = np.zeros((4, 6), np.float32)
    bad[0, 1] = float("nan")
    bad[1] = float("-inf")
    bad[2, [1, 3]] = float("inf")
    bad[3, :] = [float("-inf")] * 2 + [1.0] + [float("-inf")] * 3  # defined: token 2
    seqs = [seq(str(i), **params) for i in range(4)]
    expected = Sampler(CPU).sample(torch.from_numpy(bad.copy()), seqs)
    assert expected == [5, 5, 5, 2]
    assert NumpySampler(0).sample(bad, seqs) == expected


# --- seeds and batch invariance -----------------------------------------------------------


def test_seeded_requests_are_reproducible_and_seeds_differ() -> None:
    logits = rows(1, 1000, 1.0, 2)
    a = [NumpySampler().sample(logits, [seq("a", seed=7)])[0] for _ in range(1)]
    first, second = NumpySampler(), NumpySampler()
    run1 = [first.sample(logits, [seq("a", seed=7)])[0] for _ in range(20)]
    run2 = [second.sample(logits, [seq("a", seed=7)])[0] for _ in range(20)]
    assert run1 == run2
    assert run1[0] == a[0]
    assert len(set(run1)) > 5
    other = NumpySampler()
    assert [other.sample(logits, [seq("b", seed=8)])[0] for _ in range(20)] != run1
    # release() drops the generator: the same id starts its stream again.
    first.release("a")
    assert first.sample(logits, [seq("a", seed=7)])[0] == run1[0]


@pytest.mark.parametrize(("seed", "twin"), [(-1, 2**64 - 1), (-(2**63), 2**63)])
def test_negative_seeds_are_their_twos_complement(seed: int, twin: int) -> None:
    logits = rows(1, 500, 1.0, 4)
    a, b = NumpySampler(), NumpySampler()
    assert [a.sample(logits, [seq("x", seed=seed)])[0] for _ in range(10)] == [
        b.sample(logits, [seq("x", seed=twin)])[0] for _ in range(10)
    ]


def test_unseeded_requests_share_the_samplers_generator() -> None:
    logits = rows(1, 1000, 1.0, 6)
    a, b = NumpySampler(42), NumpySampler(42)
    assert [a.sample(logits, [seq(f"u{i}")])[0] for i in range(10)] == [
        b.sample(logits, [seq(f"v{i}")])[0] for i in range(10)
    ]


NEIGHBOURS: list[dict[str, object]] = [
    {},
    {"top_k": 5},
    {"top_p": 0.5},
    {"temperature": 0},
    {"top_k": 2000, "top_p": 0.9, "seed": 3},
    {"temperature": 0.3, "top_k": 1},
    {"seed": 99},
    {"top_k": 40, "temperature": 0.7},
    {"top_p": 0.2, "temperature": 2.0},
    {"top_p": 0.95, "top_k": 7000},
]


@pytest.mark.parametrize(
    "target",
    [{}, {"top_k": 40}, {"top_p": 0.9}, {"top_k": 30, "top_p": 0.8}, {"top_p": 0.95}],
)
def test_a_seeded_row_is_the_same_alone_and_in_a_batch_of_32(target: dict[str, object]) -> None:
    """Qwen's vocabulary, peaked and flat rows: the target's tokens alone, then at three
    places in a batch of 32 with every kind of neighbour, step after step."""
    steps = 6
    logits = rows(steps, QWEN_VOCAB, 1.0, 11)
    logits[::2] *= 6.0  # every other step peaked
    runs = []
    for where in (None, 0, 17, 31):
        sampler = NumpySampler()
        tokens = []
        for step in range(steps):
            seqs = [seq(f"n{i}", **NEIGHBOURS[i % len(NEIGHBOURS)]) for i in range(31)]
            batch = np.repeat(logits[step : step + 1], 32, axis=0)
            if where is None:
                seqs, batch, place = [], batch[:1], 0
            else:
                place = where
            seqs.insert(place, seq("target", seed=1234, temperature=0.9, **target))
            tokens.append(sampler.sample(np.ascontiguousarray(batch), seqs)[place])
        runs.append(tokens)
    assert all(run == runs[0] for run in runs), runs
    assert len(set(runs[0])) > 2


class _Broken:
    """Parameters whose top-k cannot be read: sampling that row raises."""

    greedy = False
    temperature = 1.0
    seed = None

    @property
    def top_k(self) -> int:
        raise RuntimeError("broken parameters")


def test_sample_each_keeps_a_failure_to_its_row() -> None:
    logits = rows(3, 2000, 2.0, 8)
    broken = seq("b")
    broken.params = _Broken()  # type: ignore[assignment]
    seqs = [seq("a", seed=5, top_p=0.9), broken, seq("c", temperature=0)]
    with pytest.raises(RuntimeError, match="broken"):
        NumpySampler().sample(logits, seqs)
    out = NumpySampler().sample_each(logits, seqs)
    assert isinstance(out[1], RuntimeError)
    assert out[0] == NumpySampler().sample(logits[:1], seqs[:1])[0]
    assert out[2] == int(logits[2].argmax())


def test_a_batch_of_the_wrong_shape_is_refused() -> None:
    with pytest.raises(ValueError, match="shape"):
        NumpySampler().sample(np.zeros((2, 10), np.float32), [seq("a")])


# --- penalties ----------------------------------------------------------------------------


def penalised(prompt: list[int], output: list[int], **params: object) -> Sequence:
    s = seq("r", prompt, **params)
    for token in output:
        s.append_token(token)
    return s


def assert_same_bits(ours: np.ndarray, theirs: torch.Tensor) -> None:
    assert ours.dtype.itemsize == theirs.element_size()
    width = {2: np.uint16, 4: np.uint32}[ours.dtype.itemsize]
    expected = theirs.view({2: torch.int16, 4: torch.int32}[ours.dtype.itemsize]).numpy()
    assert np.array_equal(ours.view(width), expected.view(width))


def penalty_cases(vocab: int) -> list[Sequence]:
    rng = random.Random(vocab)
    prompt = [rng.randrange(vocab) for _ in range(1500)] + [7] * 20
    output = [rng.choice(prompt) for _ in range(150)] + [rng.randrange(vocab) for _ in range(50)]
    return [
        penalised(prompt, output, repetition_penalty=1.1),
        penalised(prompt, output, repetition_penalty=0.8, frequency_penalty=0.3),
        penalised(prompt, output, frequency_penalty=-1.7, presence_penalty=0.4),
        penalised(prompt, output),  # none: untouched
        penalised([1, 2, 3], [4, 4, 5], repetition_penalty=1.5, presence_penalty=-1.2),
        penalised(prompt[:10], [], repetition_penalty=1.3, frequency_penalty=2),
        penalised(
            prompt, output, repetition_penalty=1.2, frequency_penalty=0.3, presence_penalty=2
        ),
    ]


@pytest.mark.parametrize("vocab", [QWEN_VOCAB, 40_000])
def test_penalties_are_the_torch_penalties_bit_for_bit(vocab: int) -> None:
    seqs = penalty_cases(vocab)
    logits = rows(len(seqs), vocab, 4.0, 3)
    logits[0, 7] = 0.0  # a zero logit: multiplied, as torch's where does
    logits[1, 7] = -0.0
    ours = logits.copy()
    numpy_penalties(ours, seqs)
    theirs = torch.from_numpy(logits.copy())
    torch_penalties(theirs, seqs)
    assert_same_bits(ours, theirs)
    assert not np.array_equal(ours[0], logits[0])
    assert np.array_equal(ours[3], logits[3])


def test_half_logits_are_penalised_in_float32_like_torch() -> None:
    seqs = penalty_cases(3000)
    logits = rows(len(seqs), 3000, 3.0, 4).astype(np.float16)
    ours = logits.copy()
    numpy_penalties(ours, seqs)
    theirs = torch.from_numpy(logits.copy())
    torch_penalties(theirs, seqs)
    assert ours.dtype == np.float16
    assert_same_bits(ours, theirs)


# --- no torch -------------------------------------------------------------------------------

PROBE = """
import numpy as np
from paged_llm.engine.core.sequence import Priority, SamplingParams, Sequence
from paged_llm.engine.sample.numpy_penalties import apply_penalties
from paged_llm.engine.sample.numpy_sampler import NumpySampler

s = Sequence("r", [1, 2], SamplingParams(top_p=0.9, seed=1, repetition_penalty=1.2),
             Priority.INTERACTIVE, 0.0)
logits = np.random.default_rng(0).standard_normal((1, 100)).astype(np.float32)
apply_penalties(logits, [s])
print(NumpySampler().sample(logits, [s])[0])
"""


def test_the_modules_import_neither_torch_nor_transformers() -> None:
    result = run_without_torch(PROBE)
    assert result.returncode == 0, result.stderr[-3000:]
    assert 0 <= int(result.stdout.strip()) < 100
