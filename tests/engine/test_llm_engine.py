"""The engine on real transformers models: token-for-token equal to plain generate."""

from __future__ import annotations

import random

import pytest
import torch

from paged_llm.engine.core.sequence import FinishReason, Priority, SamplingParams
from paged_llm.engine.errors import KVBudgetError, RequestRejected
from tests.helpers.support import make_engine


def reference_greedy(
    model: torch.nn.Module, prompt: list[int], n: int, attention: str = "sdpa"
) -> list[int]:
    """Greedy tokens from transformers' own generate with its stock attention."""
    impl = model.config._attn_implementation
    model.set_attn_implementation(attention)
    try:
        out = model.generate(
            torch.tensor([prompt]), max_new_tokens=n, do_sample=False, eos_token_id=None
        )
    finally:
        model.set_attn_implementation(impl)
    return out[0, len(prompt) :].tolist()


def run_all(engine, prompts, params, priorities=None) -> dict[str, list[int]]:
    """Add every prompt, step until done, and collect each request's tokens."""
    tokens: dict[str, list[int]] = {}
    for i, prompt in enumerate(prompts):
        prio = priorities[i] if priorities else Priority.INTERACTIVE
        engine.add_request(prompt, params, prio, request_id=f"r{i}")
        tokens[f"r{i}"] = []
    while engine.has_unfinished():
        for out in engine.step():
            tokens[out.request_id].extend(out.token_ids)
    return tokens


@pytest.mark.parametrize("arch", ["llama", "qwen2", "mistral"])
def test_packed_paged_steps_match_generate(arch: str) -> None:
    # Small token budget: long prompts are chunked while the short ones decode.
    engine = make_engine(arch, max_num_batched_tokens=48, block_size=16)
    rng = random.Random(1)
    lengths = [1, 15, 16, 17, 70, 130]
    prompts = [[rng.randrange(3, 512) for _ in range(n)] for n in lengths]
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    got = run_all(engine, prompts, params)
    for i, prompt in enumerate(prompts):
        assert got[f"r{i}"] == reference_greedy(engine.loaded.model, prompt, 10), lengths[i]
    assert engine.kv_manager.num_used_blocks == 0


@pytest.mark.parametrize("arch", ["llama", "gemma2"])
def test_contexts_over_several_attention_spans_match_generate(arch: str) -> None:
    # The float32 CPU decode kernel splits a context into spans of 256 keys and merges
    # them: contexts on both sides of a span's edge and over several spans, beside short ones.
    engine = make_engine(arch, max_num_batched_tokens=256, block_size=16)
    rng = random.Random(2)
    lengths = [3, 250, 256, 257, 700]
    prompts = [[rng.randrange(3, 512) for _ in range(n)] for n in lengths]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    got = run_all(engine, prompts, params)
    attention = "eager" if arch == "gemma2" else "sdpa"  # the one Gemma 2 supports
    for i, prompt in enumerate(prompts):
        want = reference_greedy(engine.loaded.model, prompt, 12, attention)
        assert got[f"r{i}"] == want, lengths[i]
    assert engine.kv_manager.num_used_blocks == 0


def test_shared_prefix_is_reused_and_still_exact() -> None:
    engine = make_engine(block_size=16)
    rng = random.Random(2)
    system = [rng.randrange(3, 512) for _ in range(64)]
    prompts = [system + [rng.randrange(3, 512) for _ in range(5)] for _ in range(3)]
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    # The first request fills the cache; the later ones must hit it.
    first = run_all(engine, prompts[:1], params)
    assert first["r0"] == reference_greedy(engine.loaded.model, prompts[0], 6)
    engine.add_request(prompts[1], params, request_id="b")
    engine.add_request(prompts[2], params, request_id="c")
    outs: dict[str, list[int]] = {"b": [], "c": []}
    cached = {}
    while engine.has_unfinished():
        for out in engine.step():
            outs[out.request_id].extend(out.token_ids)
            cached[out.request_id] = out.cached_tokens
    assert cached == {"b": 64, "c": 64}
    assert outs["b"] == reference_greedy(engine.loaded.model, prompts[1], 6)
    assert outs["c"] == reference_greedy(engine.loaded.model, prompts[2], 6)
    snap = engine.metrics()
    assert snap.prefix_cache_hits == 128
    assert snap.kv_blocks_used == 0


def test_preempted_request_recomputes_to_the_same_tokens() -> None:
    # A pool of 8 blocks of 16 cannot hold even two 40-token prompts growing to 80 tokens.
    # (K and V x 2 layers x 16 slots x 2 kv heads x head_dim 16 x 4 bytes = 8 KiB a block.)
    engine = make_engine(block_size=16, kv_budget=8 * 8192, max_model_len=128)
    assert engine.num_kv_blocks == 8
    rng = random.Random(3)
    prompts = [[rng.randrange(3, 512) for _ in range(40)] for _ in range(3)]
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    prios = [Priority.BACKGROUND, Priority.AUTOMATION, Priority.INTERACTIVE]
    got = run_all(engine, prompts, params, prios)
    assert engine.scheduler.num_preemptions > 0
    for i, prompt in enumerate(prompts):
        assert got[f"r{i}"] == reference_greedy(engine.loaded.model, prompt, 40)
    assert engine.kv_manager.num_used_blocks == 0


def test_eos_stop_tokens_and_finish_reasons() -> None:
    engine = make_engine()
    prompt = [5, 6, 7, 8]
    ref = reference_greedy(engine.loaded.model, prompt, 8)
    stop_at = ref[3]
    engine.add_request(
        prompt,
        SamplingParams(temperature=0, max_tokens=8, stop_token_ids=(stop_at,)),
        request_id="s",
    )
    engine.add_request(
        prompt, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), request_id="l"
    )
    final = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                final[out.request_id] = out
    assert final["s"].finish_reason is FinishReason.STOP
    assert final["s"].completion_tokens == ref.index(stop_at) + 1
    assert final["l"].finish_reason is FinishReason.LENGTH
    assert final["l"].completion_tokens == 8


def test_stop_string_ends_the_text_before_it() -> None:
    engine = make_engine(vocab_size=49152)
    tok = engine.tokenizer
    prompt = tok("Hello")["input_ids"]
    ref = reference_greedy(engine.loaded.model, prompt, 12)
    full = tok.decode(ref, skip_special_tokens=True)
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    if not stop.strip():
        pytest.skip("random model produced whitespace where the stop string would go")
    engine.add_request(
        prompt,
        SamplingParams(temperature=0, max_tokens=12, stop=(stop,), ignore_eos=True),
        request_id="x",
    )
    text, last = "", None
    while engine.has_unfinished():
        for out in engine.step():
            text += out.text
            last = out
    assert last is not None
    assert last.finish_reason is FinishReason.STOP
    assert stop not in text
    assert text == full[: full.find(stop)]


def test_bad_requests_are_rejected_and_others_continue() -> None:
    engine = make_engine(max_model_len=256)
    good = engine.add_request(
        [5, 6, 7], SamplingParams(temperature=0, max_tokens=4), request_id="ok"
    )
    with pytest.raises(RequestRejected, match="empty"):
        engine.add_request([], SamplingParams())
    with pytest.raises(RequestRejected, match="outside"):
        engine.add_request([5, 10**6], SamplingParams())
    with pytest.raises(RequestRejected, match="context") as info:
        engine.add_request([5] * 200, SamplingParams(max_tokens=100))
    assert info.value.code == "context_too_long"
    with pytest.raises(RequestRejected, match="already in use"):
        engine.add_request([5], SamplingParams(), request_id="ok")
    while engine.has_unfinished():
        engine.step()
    assert good.finish_reason is FinishReason.LENGTH
    assert engine.kv_manager.num_used_blocks == 0


def test_kv_budget_too_small_for_one_sequence_is_an_error() -> None:
    with pytest.raises(KVBudgetError, match="less than one sequence"):
        make_engine(kv_budget=8192, max_model_len=1024)


def test_abort_frees_blocks_mid_generation() -> None:
    engine = make_engine()
    engine.add_request(list(range(3, 100)), SamplingParams(max_tokens=50), request_id="a")
    engine.step()
    engine.step()
    assert engine.kv_manager.num_used_blocks > 0
    assert engine.abort("a")
    assert engine.kv_manager.num_used_blocks == 0
    assert not engine.has_unfinished()
    assert not engine.abort("a")


def test_bf16_engine_runs_and_mostly_agrees() -> None:
    engine = make_engine(dtype="bfloat16")
    prompt = list(range(10, 40))
    got = run_all(engine, [prompt], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    assert len(got["r0"]) == 8
    assert got["r0"][0] == reference_greedy(engine.loaded.model, prompt, 1)[0]


def test_triton_path_gives_the_same_greedy_tokens_as_the_torch_path() -> None:
    # On the CPU the Triton kernels run under TRITON_INTERPRET=1 (scripts/test sets it).
    rng = random.Random(4)
    prompts = [[rng.randrange(3, 512) for _ in range(n)] for n in (5, 17, 40)]
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    results = {}
    for backend in ("torch", "triton"):
        engine = make_engine(attention_backend=backend, max_num_batched_tokens=32)
        results[backend] = run_all(engine, prompts, params)
        assert engine.kv_manager.num_used_blocks == 0
    assert results["triton"] == results["torch"]


def test_automatic_context_shrinks_to_the_pool_but_not_below_the_floor() -> None:
    from paged_llm.engine.core.kv.sizing import AUTO_MIN_MODEL_LEN

    # 8 KiB a block of 16 tokens: 300 blocks hold 4800 tokens, more than the 4096 context.
    assert make_engine(kv_budget=300 * 8192, max_model_len=None).max_model_len == 4096
    # 160 blocks hold 2560 tokens: the context shrinks to what fits.
    assert make_engine(kv_budget=160 * 8192, max_model_len=None).max_model_len == 2560
    with pytest.raises(KVBudgetError, match=f"max_model_len {AUTO_MIN_MODEL_LEN} tokens"):
        make_engine(kv_budget=100 * 8192, max_model_len=None)
