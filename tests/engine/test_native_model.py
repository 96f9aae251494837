"""NativeModel, the C forward's model without transformers' classes, against transformers' model.

A GGUF file the C forward runs is loaded as a NativeModel; the same file loaded into
transformers' model (with the same matrices in place) must give the same logits bit for
bit, as both hand the same weights to the same kernels. Architectures and settings the
tiny GGUF writer does not cover (q/k norms, sliding windows, biases, scaled rotary
embeddings) are checked by filling a NativeModel with a transformers model's own modules.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from paged_llm.engine.config import EngineConfig
from paged_llm.engine.llm_engine import LLMEngine
from paged_llm.engine.model.loader import load_model
from paged_llm.engine.model.native_model import NativeModel, Rotary, can_build
from paged_llm.kernels.cpu import forward as cpu_forward
from tests.helpers.gguf_files import QK, write_gguf
from tests.helpers.support import (
    greedy_together,
    in_place_f32,
    make_loaded,
    recorded_logits,
    tiny_config,
)

pytestmark = pytest.mark.skipif(
    cpu_forward.unavailable() is not None, reason=f"no C forward: {cpu_forward.unavailable()}"
)

PROMPTS = [list(range(3, 90)), [5, 17, 300, 41], [9] * 40]
LIKE_FOR_LIKE = EngineConfig(device="cpu", kv_cache_dtype="float32", max_num_batched_tokens=32)


def _run(loaded: Any, config: EngineConfig) -> tuple[list[list[int]], list[torch.Tensor]]:
    """Greedy tokens of PROMPTS run together, and the logits of every step."""
    engine = LLMEngine(loaded, config)
    assert engine.runner.native is not None
    with recorded_logits() as seen:
        tokens = greedy_together(engine, PROMPTS, 10)
    return tokens, seen


def _same(a: Any, b: Any, config: EngineConfig = LIKE_FOR_LIKE) -> None:
    """Two loaded models give the same tokens and bit-identical logits at every step."""
    tokens_a, logits_a = _run(a, config)
    tokens_b, logits_b = _run(b, config)
    assert tokens_a == tokens_b
    assert len(logits_a) == len(logits_b)
    for x, y in zip(logits_a, logits_b, strict=True):
        assert torch.equal(x, y)


@pytest.mark.parametrize(
    ("arch", "kinds"),
    [
        ("llama", {"*": QK.Q4_0}),
        ("qwen2", {"attn_v": QK.Q6_K, "*": QK.Q4_K}),
        ("gemma3", {"ffn_down": QK.Q6_K, "*": QK.Q4_K}),
    ],
)
def test_a_gguf_file_runs_as_transformers_model_of_it_does(
    tmp_path: Path, arch: str, kinds: dict[str, QK]
) -> None:
    """Llama (rows reordered, tied head), Qwen2 (biases, untied head), Gemma 3 (norms stored
    as 1 + w, a scaled embedding kept in place): the same logits."""
    path = write_gguf(tmp_path / "m", arch, kinds, tmp_path / "cache")
    settings = EngineConfig(model=str(path), device="cpu", cache_dir=tmp_path / "cache")
    native = load_model(settings)
    assert isinstance(native.model, NativeModel)
    theirs = load_model(settings, native_model=False)
    assert not isinstance(theirs.model, NativeModel)
    if arch.startswith("gemma"):
        # transformers' Gemma embedding scales its rows, so its model holds the table dense;
        # the NativeModel keeps it in place and the C forward scales the rows it reads
        assert native.weights.endswith(" F32 in memory)")
        assert native.weights != theirs.weights
        dense_only = {"model.embed_tokens.weight"}
    else:
        assert native.weights == theirs.weights
        dense_only = set()
    assert native.eos_token_ids == theirs.eos_token_ids
    assert native.max_model_len == theirs.max_model_len
    assert native.repetition_penalty == theirs.repetition_penalty
    names, their_names = set(native.model.state_dict()), set(theirs.model.state_dict())
    assert names <= their_names
    assert their_names - names == dense_only
    _same(native, theirs)


def test_a_tied_gemma_file_runs_natively_with_transformers_tokens(tmp_path: Path) -> None:
    """Gemma's files tie the head to the embedding: both stay in place, one matrix.

    transformers' Gemma model holds that embedding dense (it scales its rows), so its head
    is no GGUF matrix and the C forward does not run it: here it is the oracle through its
    own forward. The same tokens; logits within the rounding of the head's inputs to 8 bits
    per block, which the in-place head does and transformers' dense head does not (0.3% of
    the logits' spread here).
    """
    path = write_gguf(tmp_path / "m", "gemma2", {"*": QK.Q8_0}, tmp_path / "cache", tied=True)
    settings = EngineConfig(model=str(path), device="cpu", cache_dir=tmp_path / "cache")
    native = load_model(settings)
    assert isinstance(native.model, NativeModel)
    assert native.model.lm_head.matrix is native.model.model.embed_tokens.matrix
    got, ours = _run(native, LIKE_FOR_LIKE)
    theirs = load_model(settings, native_model=False)
    engine = LLMEngine(theirs, LIKE_FOR_LIKE)
    assert engine.runner.native is None
    with recorded_logits() as seen:
        want = greedy_together(engine, PROMPTS, 10)
    assert got == want
    for a, b in zip(ours, seen, strict=True):
        assert (a - b).abs().max() <= 1e-2 * (b.max() - b.min())


def _native_of(loaded: Any) -> Any:
    """``loaded`` with its model's matrices made GGUF in place, shared with a NativeModel."""
    model = loaded.model
    with torch.device("meta"):
        native = NativeModel(model.config)
    # The same names, biases and norms as transformers' model.
    assert set(native.state_dict()) == set(model.state_dict())
    in_place_f32(model)
    for name, module in list(native.named_modules()):
        if isinstance(module, torch.nn.Linear | torch.nn.Embedding):
            parent, _, child = name.rpartition(".")
            setattr(
                native.get_submodule(parent) if parent else native, child, model.get_submodule(name)
            )
    names = native.state_dict().keys()
    native.load_state_dict({n: p for n, p in model.state_dict().items() if n in names}, assign=True)
    assert not any(p.is_meta for p in native.parameters())
    return dataclasses.replace(loaded, model=native)


@pytest.mark.parametrize(
    "arch",
    [
        "llama",
        "qwen2",
        "qwen3",
        "mistral_window",
        "llama_biases",
        "qwen2_window",
        "gemma2",
        "gemma3",
    ],
)
def test_every_architecture_is_built_as_transformers_builds_it(arch: str) -> None:
    """q/k norms, sliding windows, biases and head sizes: transformers' logits exactly."""
    overrides: dict[str, Any] = {
        "llama_biases": {"attention_bias": True, "mlp_bias": True},
        "qwen2_window": {"use_sliding_window": True, "sliding_window": 24, "max_window_layers": 1},
    }.get(arch, {})
    base = arch.split("_")[0] if arch in ("llama_biases", "qwen2_window") else arch
    loaded, _ = make_loaded(base)
    if overrides:
        from transformers import AutoModelForCausalLM

        config = tiny_config(base, 512)
        for key, value in overrides.items():
            setattr(config, key, value)
        if base == "qwen2":  # its layer types follow the window settings
            config = type(config)(**config.to_dict())
        torch.manual_seed(0)
        loaded.model = AutoModelForCausalLM.from_config(config).eval()
    native = _native_of(loaded)
    _same(native, loaded)


@pytest.mark.parametrize(
    "rope",
    [
        {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
        {
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
        {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0},
    ],
    ids=lambda r: r["rope_type"],
)
def test_scaled_rotary_embeddings_are_transformers_own(rope: dict[str, Any]) -> None:
    """cos and sin of every position equal the Llama rotary module's."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    config = tiny_config("llama", 512)
    config.rope_parameters = rope
    positions = torch.arange(3000).unsqueeze(0)
    probe = torch.empty(0)
    ours = Rotary(config)(probe, positions)
    theirs = LlamaRotaryEmbedding(config)(probe, positions)
    for a, b in zip(ours, theirs, strict=True):
        assert torch.equal(a, b)


def test_what_it_cannot_run_is_refused_by_name() -> None:
    """Other types, activations and length-dependent rotary kinds stay transformers' model."""
    with pytest.raises(ValueError, match="model type 'phi3'"):
        NativeModel(tiny_config("phi3_window", 512))
    config = tiny_config("llama", 512)
    config.hidden_act = "gelu"
    with pytest.raises(ValueError, match="activation 'gelu'"):
        NativeModel(config)
    config = tiny_config("gemma3", 512)
    config.hidden_activation = "gelu"
    with pytest.raises(ValueError, match="activation 'gelu'"):
        NativeModel(config)
    config = tiny_config("gemma3", 512)
    del config.rope_parameters["sliding_attention"]
    assert not can_build(config)
    with pytest.raises(ValueError, match="no rotary parameters for its 'sliding_attention' layers"):
        NativeModel(config)
    config = tiny_config("llama", 512)
    config.rope_parameters = {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}
    assert not can_build(config)  # the loader keeps transformers' model for it
    with pytest.raises(ValueError, match="'dynamic' changes with the length"):
        NativeModel(config)
    assert can_build(tiny_config("qwen3", 512))
    with torch.device("meta"):
        model = NativeModel(tiny_config("llama", 512))
    with pytest.raises(TypeError, match="C forward runs it"):
        model(torch.tensor([[1, 2]]))


def test_a_bundled_model_start_imports_no_transformers_model_class(tmp_path: Path) -> None:
    """Loading and running the bundled GGUF leaves transformers' modeling stack unimported."""
    script = (
        "import sys\n"
        "from paged_llm.engine.config import EngineConfig\n"
        "from paged_llm.engine.llm_engine import LLMEngine\n"
        "from paged_llm.engine.model.loader import load_model\n"
        "from paged_llm.engine.core.sequence import SamplingParams\n"
        "config = EngineConfig(device='cpu', kv_budget=2**25, max_model_len=512)\n"
        "engine = LLMEngine(load_model(config), config)\n"
        "params = SamplingParams(temperature=0, max_tokens=3)\n"
        "engine.add_request([1, 2, 3], params, request_id='a')\n"
        "while engine.has_unfinished():\n"
        "    engine.step()\n"
        "print(type(engine.runner.model).__name__, engine.runner.forward_text)\n"
        "print(sorted(m for m in ('transformers.modeling_utils', 'torch._dynamo')"
        " if m in sys.modules))\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False
    )
    assert run.returncode == 0, run.stderr[-3000:]
    kind, imported = run.stdout.strip().splitlines()[-2:]
    assert kind == "NativeModel the engine's C forward"
    assert imported == "[]"
