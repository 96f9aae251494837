"""Greedy equality with transformers generate for sliding-window and soft-capped models.

Gemma 2 (soft-capped scores, alternating sliding and full layers), Gemma 3 (alternating)
and Mistral with windows smaller than, equal to and larger than a block, prompts longer
than the window, chunked prefill whose chunks cross the window edge, block sizes 16 and 32
and a pool small enough to preempt.
"""

from __future__ import annotations

import random
from functools import cache

import pytest
import torch
from transformers import AutoModelForCausalLM

from paged_llm.engine.core.sequence import SamplingParams
from paged_llm.engine.llm_engine import LLMEngine
from paged_llm.engine.model.runner import kv_bytes_per_block
from tests.helpers.support import make_loaded, tiny_config

# (prompt length, max_tokens, arrival step): most prompts are longer than every window.
rng = random.Random(7)
REQUESTS = [(150, 20, 0), (3, 12, 0)] + [
    (rng.randint(20, 150), rng.randint(4, 20), rng.randint(0, 12)) for _ in range(5)
]
PROMPTS = [
    [random.Random(300 + i).randrange(3, 512) for _ in range(n)]
    for i, (n, _, _) in enumerate(REQUESTS)
]


def _engine(arch: str, window: int | None, **overrides: object) -> LLMEngine:
    """An engine over a tiny ``arch`` model; ``window`` replaces Mistral's sliding window."""
    loaded, config = make_loaded(arch, **overrides)
    if window is not None:
        model_config = tiny_config(arch, 512)
        model_config.sliding_window = window
        torch.manual_seed(0)
        loaded.model = AutoModelForCausalLM.from_config(model_config).eval()
    return LLMEngine(loaded, config)


@cache
def expected(arch: str, window: int | None) -> tuple[tuple[int, ...], ...]:
    """transformers' own greedy tokens (eager attention: the one Gemma 2 supports)."""
    model = _engine(arch, window).loaded.model
    model.set_attn_implementation("eager")
    out = []
    for prompt, (_, max_tokens, _) in zip(PROMPTS, REQUESTS, strict=True):
        ids = model.generate(
            torch.tensor([prompt]), max_new_tokens=max_tokens, do_sample=False, eos_token_id=None
        )
        out.append(tuple(ids[0, len(prompt) :].tolist()))
    return tuple(out)


def run_staggered(engine: LLMEngine) -> list[tuple[int, ...]]:
    """Add requests at their arrival steps while stepping; collect tokens per request."""
    tokens: list[list[int]] = [[] for _ in REQUESTS]
    pending = sorted(range(len(REQUESTS)), key=lambda i: REQUESTS[i][2])
    step = 0
    while pending or engine.has_unfinished():
        while pending and REQUESTS[pending[0]][2] <= step:
            i = pending.pop(0)
            params = SamplingParams(temperature=0, max_tokens=REQUESTS[i][1], ignore_eos=True)
            engine.add_request(PROMPTS[i], params, request_id=str(i))
        for out in engine.step():
            tokens[int(out.request_id)].extend(out.token_ids)
        step += 1
    return [tuple(t) for t in tokens]


CASES = [
    # (arch, Mistral window or None for the config's own, block size)
    ("gemma2", None, 16),  # window 20: larger than a block
    ("gemma2", None, 32),  # window 20: smaller than a block
    ("gemma3", None, 16),
    ("gemma3", None, 32),
    ("mistral_window", 5, 16),
    ("mistral_window", 16, 16),
    ("mistral_window", 40, 16),
    ("mistral_window", 32, 32),
    ("mistral_window", 11, 32),
    ("phi3_window", None, 16),  # window 24
    ("qwen3", None, 32),  # no window: Qwen3's own layers, on the allow-list
]


@pytest.mark.parametrize(("arch", "window", "block_size"), CASES)
def test_windowed_models_match_generate(arch: str, window: int | None, block_size: int) -> None:
    # 32-token chunks: long prompts are prefilled in chunks that start past the window.
    engine = _engine(arch, window, block_size=block_size, max_num_batched_tokens=32)
    assert run_staggered(engine) == list(expected(arch, window))
    assert engine.kv_manager.num_used_blocks == 0


@pytest.mark.parametrize(("arch", "window"), [("gemma2", None), ("mistral_window", 16)])
def test_windowed_models_match_generate_across_preemption(arch: str, window: int | None) -> None:
    per_block = kv_bytes_per_block(tiny_config(arch, 512), 16, torch.float32)
    # 12 blocks of 16 = 192 tokens: the longest request fits, the crowd does not.
    engine = _engine(
        arch,
        window,
        block_size=16,
        kv_budget=12 * per_block,
        max_model_len=192,
        max_num_batched_tokens=32,
    )
    assert run_staggered(engine) == list(expected(arch, window))
    assert engine.scheduler.num_preemptions > 0
    assert engine.kv_manager.num_used_blocks == 0


def test_without_the_soft_cap_the_tokens_would_differ() -> None:
    # Guards the cases above: the cap really changes this model's greedy tokens.
    model = _engine("gemma2", None).loaded.model
    model.set_attn_implementation("eager")
    for layer in model.model.layers:
        layer.self_attn.attn_logit_softcapping = None
    prompt = torch.tensor([PROMPTS[0]])
    ids = model.generate(prompt, max_new_tokens=20, do_sample=False, eos_token_id=None)
    assert tuple(ids[0, len(PROMPTS[0]) :].tolist()) != expected("gemma2", None)[0]
