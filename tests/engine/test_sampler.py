"""Batched sampling: greedy, temperature, top-k, top-p and per-request seeds."""

from __future__ import annotations

import torch

from paged_llm.engine.sampler import Sampler
from paged_llm.engine.sequence import Priority, SamplingParams, Sequence


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
