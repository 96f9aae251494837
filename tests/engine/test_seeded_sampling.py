"""Batch-invariant seeded sampling: a seeded request's tokens depend on nothing else."""

from __future__ import annotations

import pytest
import torch

from paged_llm.engine.core.sequence import Priority, SamplingParams, Sequence
from paged_llm.engine.errors import InvalidSamplingParams
from paged_llm.engine.model.runner import kv_bytes_per_block
from paged_llm.engine.sample.sampler import Sampler
from tests.helpers.support import make_engine, tiny_config

CPU = torch.device("cpu")


def seq(rid: str, **params: object) -> Sequence:
    return Sequence(rid, [1], SamplingParams(**params), Priority.INTERACTIVE, 0.0)  # type: ignore[arg-type]


NEIGHBOURS = [
    [],
    [{"top_k": 5}],
    [{"top_p": 0.5}],
    [{"temperature": 0}],
    [{"top_k": 2000, "top_p": 0.9, "seed": 3}, {"temperature": 0.3, "top_k": 1}],
    [{"seed": 99}, {"top_k": 40}, {"top_p": 0.2, "temperature": 2.0}, {"top_k": 7}],
]


@pytest.mark.parametrize("target", [{}, {"top_k": 50}, {"top_p": 0.8}, {"top_k": 30, "top_p": 0.9}])
def test_a_seeded_row_ignores_its_neighbours(target: dict[str, object]) -> None:
    logits = torch.randn(30, 4096, generator=torch.Generator().manual_seed(0)) * 3
    runs = []
    for neighbours in NEIGHBOURS:
        sampler = Sampler(CPU)
        tokens = []
        for step in range(logits.shape[0]):
            seqs = [seq(f"n{i}", **n) for i, n in enumerate(neighbours)]
            where = len(seqs) // 2
            seqs.insert(where, seq("target", seed=1234, temperature=0.9, **target))
            batch = logits[step].repeat(len(seqs), 1)
            tokens.append(sampler.sample(batch, seqs)[where])
        runs.append(tokens)
    assert all(run == runs[0] for run in runs), runs
    assert len(set(runs[0])) > 5


@pytest.mark.parametrize("temperature", [1e-38, 1e-30, 1e-6, 5e-324])
def test_tiny_temperatures_are_greedy(temperature: float) -> None:
    logits = torch.randn(4, 300, generator=torch.Generator().manual_seed(1))
    out = Sampler(CPU).sample(logits, [seq(str(i), temperature=temperature) for i in range(4)])
    assert out == logits.argmax(-1).tolist()


def test_tied_logits_at_the_top_k_edge_are_all_kept() -> None:
    # Four tokens tie for the top two places: which two a sort puts first must not matter.
    logits = torch.tensor([[1.0, 1.0, 1.0, 1.0, -9.0]])
    sampler = Sampler(CPU)
    seen = {sampler.sample(logits, [seq(f"s{i}", top_k=2)])[0] for i in range(300)}
    assert seen == {0, 1, 2, 3}


@pytest.mark.parametrize("seed", [0, -1, -(2**63), 2**63, 2**64 - 1])
def test_every_accepted_seed_works(seed: int) -> None:
    out = Sampler(CPU).sample(torch.zeros(1, 100), [seq("s", seed=seed)])
    assert 0 <= out[0] < 100


@pytest.mark.parametrize("seed", [2**64, -(2**63) - 1, 10**30])
def test_out_of_range_seeds_are_refused_at_submission(seed: int) -> None:
    with pytest.raises(InvalidSamplingParams, match="seed"):
        SamplingParams(seed=seed)


TARGET_PROMPT = [(7 * i + 5) % 500 + 3 for i in range(60)]
TARGET = SamplingParams(temperature=0.8, seed=2024, max_tokens=24, ignore_eos=True)


def _run(
    engine, neighbours: list[SamplingParams], target_priority: Priority
) -> tuple[list[int], int]:
    """Serve the seeded target beside ``neighbours``; its tokens and preemption count."""
    engine.add_request(TARGET_PROMPT, TARGET, target_priority, request_id="target")
    tokens: list[int] = []
    preemptions = 0
    added = False
    while engine.has_unfinished():
        for out in engine.step():
            if out.request_id == "target":
                tokens.extend(out.token_ids)
                if out.finished:
                    preemptions = out.timing.num_preemptions
        if not added:
            # Neighbours arrive after the target started, so preemption picks the target.
            for i, params in enumerate(neighbours):
                prompt = [(11 * i + 3 * j) % 500 + 3 for j in range(40 + 20 * i)]
                engine.add_request(prompt, params, request_id=f"n{i}")
            added = True
    assert engine.kv_manager.num_used_blocks == 0
    return tokens, preemptions


def test_a_seeded_request_gives_the_same_tokens_alone_beside_others_and_preempted() -> None:
    neighbours = [
        SamplingParams(temperature=0.7, top_k=5, max_tokens=20, ignore_eos=True),
        SamplingParams(temperature=1.0, top_p=0.5, max_tokens=20, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=20, ignore_eos=True),
        SamplingParams(temperature=1.3, seed=5, max_tokens=20, ignore_eos=True),
    ]
    alone, _ = _run(make_engine("llama"), [], Priority.INTERACTIVE)
    assert len(set(alone)) > 3
    beside, _ = _run(make_engine("llama"), neighbours, Priority.INTERACTIVE)
    per_block = kv_bytes_per_block(tiny_config("llama", 512), 16, torch.float32)
    small = make_engine("llama", block_size=16, kv_budget=10 * per_block, max_model_len=160)
    preempted, count = _run(small, neighbours, Priority.BACKGROUND)
    assert count > 0
    assert alone == beside == preempted
