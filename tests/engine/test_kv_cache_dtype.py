"""A 16-bit KV cache on the CPU: its setting, what auto picks, the pool it buys, its answers.

The greedy rule for a float16 cache against the float32 one, over the first 16 tokens of
each of test_greedy_equality's prompts: the tokens are equal, or a request's first
differing token comes where the float32 run's top two logits were less than
``MARGIN_BOUND`` apart. A flip needs the two logits to move towards each other by their
margin, and each moves by at most ``LOGIT_BOUND`` (checked on every row of both runs
before its request's tokens differ), so ``MARGIN_BOUND`` is twice ``LOGIT_BOUND``. The
bounds are about 3x what float16 gives on these models (at most 0.036 on logits of up to
11); a pool rounded to 8 bits breaks both, which the last test checks.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from paged_llm.engine.config import EngineConfig
from paged_llm.engine.core.sequence import SamplingParams
from paged_llm.engine.model import runner as model_runner
from paged_llm.engine.model.runner import (
    ModelRunner,
    config_kv_dtype,
    kv_bytes_per_block,
    resolve_kv_dtype,
)
from paged_llm.kernels.cpu import attention as cpu_attention
from tests.helpers.support import make_engine, make_loaded, tiny_config

CPU = torch.device("cpu")
CUDA = torch.device("cuda")
TOKENS = 16
# Largest |logit difference| of one step between the float16 and float32 caches.
LOGIT_BOUND = 0.1
# A greedy token may differ first only where the float32 run's top-2 margin is below this.
MARGIN_BOUND = 2 * LOGIT_BOUND
ARCHS = ["llama_mha", "llama", "qwen2", "mistral_window", "gemma2"]

# test_greedy_equality.py's 16 prompts (lengths 1..300, some sharing a 48-token prefix).
_rng = random.Random(11)
# (prompt length, max_tokens, arrival step) there; only the lengths matter here.
_REQUESTS = [(1, 1, 0), (300, 64, 0)] + [
    (_rng.randint(1, 300), _rng.randint(1, 64), _rng.randint(0, 40)) for _ in range(14)
]
PROMPTS = [
    [random.Random(100 + i).randrange(3, 512) for _ in range(n)]
    for i, (n, _, _) in enumerate(_REQUESTS)
]
for _i in range(3, 16, 3):
    PROMPTS[_i] = PROMPTS[1][:48] + PROMPTS[_i]


def engine_with_pool(arch: str, kv_dtype: torch.dtype, **overrides: Any) -> Any:
    """A tiny engine whose runner holds its KV pool in ``kv_dtype``."""
    engine = make_engine(arch, **overrides)
    runner = ModelRunner(
        engine.loaded,
        engine.num_kv_blocks,
        engine.config.block_size,
        engine.config.attention_backend,
        kv_dtype=kv_dtype,
    )
    runner.structured = engine.structured
    engine.runner = runner
    return engine


@dataclass
class Run:
    """Each prompt's greedy tokens, and the logits each of them was sampled from."""

    tokens: list[list[int]]
    # (prompt, output index) -> the logits row that token was sampled from.
    logits: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict)


def greedy_run(engine: Any) -> Run:
    """Every prompt at once, TOKENS greedy tokens each, recording the sampled logits."""
    run = Run([[] for _ in PROMPTS])
    sample = engine.runner.sampler.sample

    def recording(logits: torch.Tensor, seqs: list[Any]) -> list[int]:
        """Keep each row before sampling it."""
        for row, seq in zip(logits, seqs, strict=True):
            run.logits[int(seq.request_id), seq.num_output_tokens] = row.clone()
        tokens: list[int] = sample(logits, seqs)
        return tokens

    engine.runner.sampler.sample = recording
    params = SamplingParams(temperature=0, max_tokens=TOKENS, ignore_eos=True)
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(prompt, params, request_id=str(i))
    while engine.has_unfinished():
        for out in engine.step():
            run.tokens[int(out.request_id)].extend(out.token_ids)
    assert engine.kv_manager.num_used_blocks == 0
    return run


def logit_gap(ref: Run, got: Run) -> float:
    """Largest |logit difference| over the rows whose request has the same tokens so far."""
    gaps = [
        float((got.logits[i, j] - row).abs().max())
        for (i, j), row in ref.logits.items()
        if got.tokens[i][:j] == ref.tokens[i][:j]
    ]
    return max(gaps)


def unexplained_flips(ref: Run, got: Run) -> list[tuple[int, int, float]]:
    """(prompt, position, float32 margin) of each first divergence at a margin >= the bound."""
    flips = []
    for i, (want, have) in enumerate(zip(ref.tokens, got.tokens, strict=True)):
        j = next((j for j, (a, b) in enumerate(zip(want, have, strict=True)) if a != b), None)
        if j is None:
            continue
        top = ref.logits[i, j].topk(2).values
        margin = float(top[0] - top[1])
        if margin >= MARGIN_BOUND:
            flips.append((i, j, margin))
    return flips


@pytest.fixture(scope="module")
def float32_runs() -> dict[str, Run]:
    """The float32-cache run of each architecture, computed once."""
    return {}


def float32_run(runs: dict[str, Run], arch: str) -> Run:
    """The float32-cache run of arch, from runs or made now."""
    if arch not in runs:
        runs[arch] = greedy_run(engine_with_pool(arch, torch.float32))
    return runs[arch]


@pytest.mark.parametrize("arch", ARCHS)
def test_a_float16_cache_keeps_greedy_tokens_and_logits_close(
    arch: str, float32_runs: dict[str, Run]
) -> None:
    ref = float32_run(float32_runs, arch)
    engine = engine_with_pool(arch, torch.float16)
    assert engine.runner.kv_caches[0][0].dtype == torch.float16
    got = greedy_run(engine)
    assert all(len(tokens) == TOKENS for tokens in got.tokens)
    assert logit_gap(ref, got) <= LOGIT_BOUND
    assert unexplained_flips(ref, got) == []
    # Not vacuous: the cache's rounding does reach the logits.
    assert logit_gap(ref, got) > 0


@pytest.mark.parametrize("arch", ["llama_mha", "qwen2"])
def test_the_rule_fails_a_cache_rounded_to_8_bits(
    arch: str, float32_runs: dict[str, Run], monkeypatch: pytest.MonkeyPatch
) -> None:
    store = model_runner.store_kv

    def rounded(key: torch.Tensor, value: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """Store K/V as float8 (e4m3) values would hold them."""
        coarse = torch.float8_e4m3fn
        store(key.to(coarse).float(), value.to(coarse).float(), *args, **kwargs)

    ref = float32_run(float32_runs, arch)
    monkeypatch.setattr(model_runner, "store_kv", rounded)
    got = greedy_run(engine_with_pool(arch, torch.float32))
    assert logit_gap(ref, got) > LOGIT_BOUND
    assert unexplained_flips(ref, got) != []


def test_auto_is_float16_for_quantized_weights_on_the_cpu_only() -> None:
    f32, f16, bf16 = torch.float32, torch.float16, torch.bfloat16
    q4 = "q4 (210 4-bit linear layers, float32 kernels, AVX2)"
    assert resolve_kv_dtype("auto", CPU, f32, "float") == f32
    assert resolve_kv_dtype("auto", CPU, f32, q4) == f16
    assert resolve_kv_dtype("auto", CPU, f32, "q8 (30 8-bit linear layers)") == f16
    # torch's bf16 int4 kernels: the model already runs in 16 bits, the cache follows it.
    assert resolve_kv_dtype("auto", CPU, bf16, q4) == bf16
    assert resolve_kv_dtype("auto", CUDA, f32, "float") == f32
    assert resolve_kv_dtype("auto", CUDA, bf16, "float") == bf16
    assert resolve_kv_dtype("auto", CUDA, f32, q4) == f32
    # Explicit: the model's own dtype anywhere, 16 bits under float32 on the CPU.
    assert resolve_kv_dtype("float32", CPU, f32, q4) == f32
    assert resolve_kv_dtype("float16", CPU, f32, "float") == f16
    assert resolve_kv_dtype("bfloat16", CPU, f32, "float") == bf16
    assert resolve_kv_dtype("bfloat16", CUDA, bf16, "float") == bf16


def test_the_engine_config_and_a_quantized_model_pick_the_runners_pool() -> None:
    loaded, config = make_loaded("llama")
    assert config.kv_cache_dtype == "auto"
    assert config_kv_dtype(config, loaded) == torch.float32
    runner = ModelRunner(loaded, 4, 16, kv_dtype=config_kv_dtype(config, loaded))
    assert runner.kv_caches[0][0].dtype == torch.float32
    assert runner.kv_cache_text == "float32 KV cache"
    loaded.weights = "q4 (14 4-bit linear layers, float32 kernels, AVX2)"
    assert config_kv_dtype(config, loaded) == torch.float16
    runner = ModelRunner(loaded, 4, 16, kv_dtype=config_kv_dtype(config, loaded))
    assert all(k.dtype == v.dtype == torch.float16 for k, v in runner.kv_caches)
    assert runner.kv_cache_text == "float16 KV cache, read as float32"
    # Without a dtype the runner keeps the model's (what the engine passed before).
    assert ModelRunner(loaded, 4, 16).kv_caches[0][0].dtype == torch.float32
    config.kv_cache_dtype = "float32"
    assert config_kv_dtype(config, loaded) == torch.float32


def test_a_16_bit_pool_holds_twice_the_blocks_of_a_budget() -> None:
    model_config = tiny_config("llama", 512)
    per_block = kv_bytes_per_block(model_config, 16, torch.float32)
    assert kv_bytes_per_block(model_config, 16, torch.float16) * 2 == per_block
    assert kv_bytes_per_block(model_config, 16, torch.bfloat16) * 2 == per_block
    budget = 100 * per_block
    loaded, _ = make_loaded("llama")
    for kv_dtype, blocks in ((torch.float32, 100), (torch.float16, 200)):
        assert budget // kv_bytes_per_block(model_config, 16, kv_dtype) == blocks
        runner = ModelRunner(loaded, blocks, 16, kv_dtype=kv_dtype)
        pool_bytes = sum(k.nbytes + v.nbytes for k, v in runner.kv_caches)
        assert pool_bytes == budget


def test_the_engine_sizes_and_allocates_its_pool_in_the_configured_dtype() -> None:
    per_block = kv_bytes_per_block(tiny_config("llama", 512), 16, torch.float32)
    wide = make_engine("llama", kv_budget=64 * per_block)
    narrow = make_engine("llama", kv_budget=64 * per_block, kv_cache_dtype="float16")
    assert wide.runner.kv_caches[0][0].dtype == torch.float32
    assert narrow.runner.kv_caches[0][0].dtype == torch.float16
    assert narrow.num_kv_blocks == 2 * wide.num_kv_blocks == 128
    loaded, config = make_loaded("llama", kv_budget=64 * per_block)
    loaded.weights = "q4 (14 4-bit linear layers, float32 kernels, AVX2)"
    from paged_llm.engine.llm_engine import LLMEngine

    fast = LLMEngine(loaded, config)  # auto: float16 under quantized weights on the CPU
    assert fast.runner.kv_caches[0][0].dtype == torch.float16
    assert fast.num_kv_blocks == 128


def test_bad_settings_are_clear_errors() -> None:
    with pytest.raises(
        ValueError, match="kv_cache_dtype must be one of auto, float32, float16, bfloat16"
    ):
        EngineConfig(kv_cache_dtype="float8")
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of"):
        resolve_kv_dtype("int8", CPU, torch.float32, "float")
    # Triton reads the model's dtype; a bf16 model's cache is never widened or narrowed.
    with pytest.raises(
        ValueError, match="kv_cache_dtype float16 cannot serve a float32 model on cuda"
    ):
        resolve_kv_dtype("float16", CUDA, torch.float32, "float")
    with pytest.raises(ValueError, match="cannot serve a bfloat16 model on cpu"):
        resolve_kv_dtype("float32", CPU, torch.bfloat16, "float")
    with pytest.raises(ValueError, match="cannot serve a bfloat16 model on cpu"):
        resolve_kv_dtype("float16", CPU, torch.bfloat16, "float")


def test_the_cli_passes_the_setting_and_refuses_others(capsys: pytest.CaptureFixture[str]) -> None:
    from paged_llm.server.cli import build_parser, engine_config

    parser = build_parser()
    args = parser.parse_args(["serve", "--kv-cache-dtype", "float16"])
    assert engine_config(args).kv_cache_dtype == "float16"
    assert engine_config(parser.parse_args(["generate"])).kv_cache_dtype == "auto"
    with pytest.raises(SystemExit):
        parser.parse_args(["chat", "--kv-cache-dtype", "int8"])
    assert "invalid choice: 'int8'" in capsys.readouterr().err


@pytest.mark.skipif(cpu_attention.unavailable() is not None, reason="no C attention kernel here")
def test_decodes_over_a_float16_pool_run_on_the_c_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[torch.dtype] = []
    decode = cpu_attention.decode

    def counting(query: torch.Tensor, key_cache: torch.Tensor, *args: Any) -> bool:
        """Note the pool's dtype of each call the kernel takes."""
        calls.append(key_cache.dtype)
        done: bool = decode(query, key_cache, *args)
        return done

    monkeypatch.setattr(cpu_attention, "decode", counting)
    engine = engine_with_pool("llama", torch.float16)
    engine.add_request(PROMPTS[1], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    assert calls
    assert set(calls) == {torch.float16}
