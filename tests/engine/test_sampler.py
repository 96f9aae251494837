"""Batched sampling: greedy, temperature, top-k, top-p and per-request seeds."""

from __future__ import annotations

import pytest
import torch

from paged_llm.engine.core.sequence import Priority, SamplingParams, Sequence
from paged_llm.engine.sample.sampler import Sampler, _kept_floor, _whole_row_floor


def seq(rid: str, **params: object) -> Sequence:
    return Sequence(rid, [1], SamplingParams(**params), Priority.INTERACTIVE, 0.0)  # type: ignore[arg-type]


def test_greedy_rows_take_the_argmax() -> None:
    logits = torch.randn(4, 100)
    out = Sampler(torch.device("cpu")).sample(
        logits, [seq(str(i), temperature=0) for i in range(4)]
    )
    assert out == logits.argmax(-1).tolist()


def test_top_k_one_is_greedy_even_with_temperature() -> None:
    logits = torch.randn(3, 50)
    out = Sampler(torch.device("cpu")).sample(
        logits, [seq(str(i), temperature=1.5, top_k=1) for i in range(3)]
    )
    assert out == logits.argmax(-1).tolist()


def test_mixed_batch_keeps_each_rows_parameters() -> None:
    logits = torch.randn(2, 50)
    s = Sampler(torch.device("cpu"))
    for _ in range(20):
        out = s.sample(logits, [seq("g", temperature=0), seq("r", temperature=1.0, top_k=3)])
        assert out[0] == int(logits[0].argmax())
        assert out[1] in logits[1].topk(3).indices.tolist()


def test_top_p_keeps_only_the_nucleus() -> None:
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    logits = probs.log()
    s = Sampler(torch.device("cpu"))
    seen = {s.sample(logits, [seq(f"x{i}", top_p=0.7)])[0] for i in range(200)}
    # 0.5 + 0.3 reaches 0.7: tokens 2 and 3 lie outside the nucleus.
    assert seen == {0, 1}


def test_seed_makes_a_request_reproducible_whatever_its_batch() -> None:
    logits = torch.zeros(1, 1000)
    a = Sampler(torch.device("cpu"))
    b = Sampler(torch.device("cpu"))
    first = [a.sample(logits, [seq("a", seed=7)])[0] for _ in range(5)]
    batched = [b.sample(logits.repeat(2, 1), [seq("u"), seq("a2", seed=7)])[1] for _ in range(5)]
    assert first == batched
    assert len(set(first)) > 1


def test_temperature_sharpens_the_distribution() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0]])
    s = Sampler(torch.device("cpu"))
    torch.manual_seed(0)
    cold = [s.sample(logits, [seq("c", temperature=0.1)])[0] for _ in range(200)]
    hot = [s.sample(logits, [seq("h", temperature=5.0)])[0] for _ in range(200)]
    assert cold.count(0) > 195
    assert hot.count(0) < 150


@pytest.mark.parametrize("spread", [0.3, 1.0, 3.0, 6.0, 12.0])
def test_a_nucleus_found_among_the_largest_logits_is_the_definitions(spread: float) -> None:
    """Top-p alone looks among the largest logits before sorting a whole row. The kept set
    is the definition's (the top tokens while the mass before them is below p), from flat
    rows (the nucleus beyond every candidate count: sorted whole) to peaked ones, with its
    edge where the mass computed in float64 crosses p within float32's rounding."""
    vocab = 20_000
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(12, vocab, generator=g) * spread
    ps = [0.05, 0.3, 0.5, 0.7, 0.9, 0.95, 0.99, 0.999, 0.9999, 0.2, 0.8, 0.6]
    ks = [vocab] * 11 + [3000]  # the last row's top-k takes the whole sort
    kept = (logits >= _whole_row_floor(logits, ks, ps).unsqueeze(1)).sum(dim=-1).tolist()
    ranked = logits.double().sort(dim=-1, descending=True).values
    ranked[-1, ks[-1] :] = float("-inf")
    probs = torch.softmax(ranked, dim=-1)
    before = probs.cumsum(dim=-1) - probs
    for row, (n, p) in enumerate(zip(kept, ps, strict=True)):
        assert before[row, n - 1] < p + 1e-5, (row, n)
        assert n == vocab or before[row, n] >= p - 1e-5, (row, n)
    assert kept[-1] <= ks[-1]


def test_a_tie_across_the_nucleus_edge_is_kept_whole() -> None:
    logits = torch.randn(2, 20_000, generator=torch.Generator().manual_seed(5))
    logits[:, :500] = 9.0  # 500 tokens share the top: the nucleus ends among them
    floor = _whole_row_floor(logits, [20_000, 20_000], [0.3, 0.6])
    assert ((logits >= floor.unsqueeze(1)).sum(dim=-1) == 500).all()
    assert torch.equal(
        floor, _kept_floor(logits.sort(dim=-1, descending=True).values, [20_000] * 2, [0.3, 0.6])
    )
