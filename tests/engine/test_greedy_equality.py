"""Greedy equality with transformers generate over staggered arrivals, layouts and pools."""

from __future__ import annotations

import random
from functools import cache

import pytest
import torch

from paged_llm.engine.core.sequence import SamplingParams
from tests.helpers.support import make_engine, tiny_config

# (prompt length, max_tokens, arrival step) for 16 requests: lengths 1..300, 1..64 tokens.
rng = random.Random(11)
REQUESTS = [(1, 1, 0), (300, 64, 0)] + [
    (rng.randint(1, 300), rng.randint(1, 64), rng.randint(0, 40)) for _ in range(14)
]
PROMPTS = [
    [random.Random(100 + i).randrange(3, 512) for _ in range(n)]
    for i, (n, _, _) in enumerate(REQUESTS)
]
# A shared 48-token prefix on some prompts, so prefix sharing has something to share.
for i in range(3, 16, 3):
    PROMPTS[i] = PROMPTS[1][:48] + PROMPTS[i]


@cache
def expected(arch: str) -> tuple[tuple[int, ...], ...]:
    """transformers' own greedy tokens for every request (sdpa attention, float32)."""
    engine = make_engine(arch)
    model = engine.loaded.model
    model.set_attn_implementation("sdpa")
    out = []
    for prompt, (_, max_tokens, _) in zip(PROMPTS, REQUESTS, strict=True):
        ids = model.generate(
            torch.tensor([prompt]), max_new_tokens=max_tokens, do_sample=False, eos_token_id=None
        )
        out.append(tuple(ids[0, len(prompt) :].tolist()))
    return tuple(out)


def run_staggered(engine) -> list[list[int]]:
    """Add requests at their arrival steps while stepping; collect tokens per request."""
    tokens: list[list[int]] = [[] for _ in REQUESTS]
    step = 0
    pending = sorted(range(len(REQUESTS)), key=lambda i: REQUESTS[i][2])
    while pending or engine.has_unfinished():
        while pending and REQUESTS[pending[0]][2] <= step:
            i = pending.pop(0)
            params = SamplingParams(temperature=0, max_tokens=REQUESTS[i][1], ignore_eos=True)
            engine.add_request(PROMPTS[i], params, request_id=str(i))
        for out in engine.step():
            tokens[int(out.request_id)].extend(out.token_ids)
        step += 1
    return tokens


@pytest.mark.parametrize("arch", ["llama_mha", "llama", "qwen2"])
@pytest.mark.parametrize("block_size", [1, 16, 32])
@pytest.mark.parametrize("prefix", [True, False])
def test_staggered_requests_match_generate(arch: str, block_size: int, prefix: bool) -> None:
    engine = make_engine(
        arch, block_size=block_size, enable_prefix_caching=prefix, max_num_batched_tokens=64
    )
    got = run_staggered(engine)
    assert [tuple(t) for t in got] == list(expected(arch))
    assert engine.kv_manager.num_used_blocks == 0
    if prefix and block_size <= 16:
        assert engine.kv_manager.prefix_cache_hits > 0


@pytest.mark.parametrize("arch", ["llama_mha", "llama", "qwen2"])
def test_with_a_pool_small_enough_to_preempt(arch: str) -> None:
    from paged_llm.engine.model.runner import kv_bytes_per_block

    per_block = kv_bytes_per_block(tiny_config(arch, 512), 16, torch.float32)
    # 24 blocks of 16 = 384 tokens: enough for the longest request, not for the crowd.
    engine = make_engine(arch, block_size=16, kv_budget=24 * per_block, max_model_len=384)
    got = run_staggered(engine)
    assert engine.scheduler.num_preemptions > 0
    assert [tuple(t) for t in got] == list(expected(arch))
    assert engine.kv_manager.num_used_blocks == 0
