"""The torch-free GGUF config and rotary tables equal what transformers makes of the same file."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
import torch
from transformers import AutoConfig, LlamaConfig
from transformers.models.gemma3 import Gemma3TextConfig

from paged_llm.engine.errors import ModelLoadError, UnsupportedModelError
from paged_llm.engine.model import native_model
from paged_llm.engine.model.gguf_config import GGUFConfig, read_config
from paged_llm.engine.model.gguf_transformers import with_file_rope
from paged_llm.engine.model.loader import bundled_gguf_path
from paged_llm.engine.model.rope import Rope, cos_sin, inverse_frequencies, tables
from tests.helpers.gguf_files import converter_llama3_table, write_gguf
from tests.helpers.without_torch import BLOCKED, run_without_torch

ROOT = Path(__file__).resolve().parents[2]
QK = gguf.GGMLQuantizationType
# Positions the rotary tables are compared over.
POSITIONS = 32768
# Measured bounds against torch 2.15's CPU kernels (AVX2), positions 0..32767:
# - inverse frequencies: bit-equal, except torch's vectorized pow (SLEEF, 1-ulp accurate)
#   rounds 10 ** 3.46875 the other way (one entry when theta 1e6 / head_dim 128 or 256, or
#   theta 1e4 / head_dim 256): at most 1 ulp, in at most one entry;
# - cos/sin of the same products: float64 evaluation rounded to float32 is within 1 ulp of
#   torch's float32 kernels everywhere (about 5% of the entries differ by that ulp; numpy's
#   float32 cos/sin would be 2 ulp off, 15% of entries);
# - whole tables: 5.96e-8 apart at most, or 9.61e-7 where an inverse frequency is 1 ulp off
#   (that ulp times a position near 32767).
TABLE_ATOL = 1.0e-6

# Metadata as llama.cpp's converter writes it for real models of each family (shapes only).
_LLAMA32 = {
    "general.name": "Llama 3.2 1B Instruct",
    "llama.block_count": 16,
    "llama.context_length": 131072,
    "llama.embedding_length": 2048,
    "llama.feed_forward_length": 8192,
    "llama.attention.head_count": 32,
    "llama.attention.head_count_kv": 8,
    "llama.rope.freq_base": 500000.0,
    "llama.attention.layer_norm_rms_epsilon": 1e-5,
    "llama.attention.key_length": 64,
    "llama.rope.dimension_count": 64,
    "llama.vocab_size": 128256,
    "tokenizer.ggml.bos_token_id": 128000,
    "tokenizer.ggml.eos_token_id": 128009,
}
_MISTRAL = {
    "general.name": "mistral",
    "llama.block_count": 32,
    "llama.context_length": 32768,
    "llama.embedding_length": 4096,
    "llama.feed_forward_length": 14336,
    "llama.attention.head_count": 32,
    "llama.attention.head_count_kv": 8,
    "llama.rope.freq_base": 1000000.0,
    "llama.attention.layer_norm_rms_epsilon": 1e-5,
    "llama.rope.dimension_count": 128,
    "llama.vocab_size": 32768,
    "tokenizer.ggml.bos_token_id": 1,
    "tokenizer.ggml.eos_token_id": 2,
}
_QWEN2 = {
    "qwen2.block_count": 28,
    "qwen2.context_length": 32768,
    "qwen2.embedding_length": 1536,
    "qwen2.feed_forward_length": 8960,
    "qwen2.attention.head_count": 12,
    "qwen2.attention.head_count_kv": 2,
    "qwen2.rope.freq_base": 1000000.0,
    "qwen2.attention.layer_norm_rms_epsilon": 1e-6,
    "tokenizer.ggml.eos_token_id": 151645,
    "tokenizer.ggml.padding_token_id": 151643,
    "tokenizer.ggml.bos_token_id": 151643,
}
_QWEN3 = {
    "qwen3.block_count": 28,
    "qwen3.context_length": 40960,
    "qwen3.embedding_length": 1024,
    "qwen3.feed_forward_length": 3072,
    "qwen3.attention.head_count": 16,
    "qwen3.attention.head_count_kv": 8,
    "qwen3.rope.freq_base": 1000000.0,
    "qwen3.attention.layer_norm_rms_epsilon": 1e-6,
    "qwen3.attention.key_length": 128,
    "qwen3.attention.value_length": 128,
    "tokenizer.ggml.eos_token_id": 151645,
}
_GEMMA2 = {
    "gemma2.context_length": 8192,
    "gemma2.embedding_length": 2304,
    "gemma2.block_count": 26,
    "gemma2.feed_forward_length": 9216,
    "gemma2.attention.head_count": 8,
    "gemma2.attention.head_count_kv": 4,
    "gemma2.attention.layer_norm_rms_epsilon": 1e-6,
    "gemma2.attention.key_length": 256,
    "gemma2.attention.value_length": 256,
    "gemma2.attn_logit_softcapping": 50.0,
    "gemma2.final_logit_softcapping": 30.0,
    "gemma2.attention.sliding_window": 4096,
    "tokenizer.ggml.bos_token_id": 2,
    "tokenizer.ggml.eos_token_id": 1,
    "tokenizer.ggml.padding_token_id": 0,
}
_GEMMA3 = {
    "gemma3.context_length": 32768,
    "gemma3.embedding_length": 1152,
    "gemma3.block_count": 26,
    "gemma3.feed_forward_length": 6912,
    "gemma3.attention.head_count": 4,
    "gemma3.attention.layer_norm_rms_epsilon": 1e-6,
    "gemma3.attention.key_length": 256,
    "gemma3.attention.value_length": 256,
    "gemma3.rope.freq_base": 1000000.0,
    "gemma3.attention.sliding_window": 512,
    "gemma3.attention.head_count_kv": 1,
    "tokenizer.ggml.bos_token_id": 2,
    "tokenizer.ggml.eos_token_id": 106,
    "tokenizer.ggml.padding_token_id": 0,
}
_SCALED = {"rope.scaling.type": "linear", "rope.scaling.factor": 8.0}


# Tensors write_metadata_gguf writes with these values (others: ones)
TENSORS = {"rope_freqs.weight": converter_llama3_table(500000.0, 64, 32.0)}
# The rope scaling of the model each scaled case stands for, as its config.json states it
# (transformers' GGUF loader skips it; both engine paths apply it): Llama 3.2 1B's, and
# linear factor 8 as Gemma 3 4B has it on its global layers.
SCALINGS: dict[str, dict[str, Any]] = {
    "llama3.2": {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 32.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
    "llama-linear": {"rope_type": "linear", "rope_theta": 500000.0, "factor": 8.0},
    "gemma3-scaled": {"rope_type": "linear", "rope_theta": 1000000.0, "factor": 8.0},
}

# name -> (architecture, metadata, tied, extra tensors, the keys transformers ignores)
CASES: dict[str, tuple[str, dict[str, Any], bool, tuple[str, ...], tuple[str, ...]]] = {
    # llama.cpp writes Llama 3's rope scaling as a tensor of factors
    "llama3.2": ("llama", _LLAMA32, True, ("rope_freqs.weight",), ()),
    "llama-linear": (
        "llama",
        _LLAMA32 | {f"llama.{k}": v for k, v in _SCALED.items()},
        False,
        (),
        (),
    ),
    # the window transformers' MistralConfig has anyway (4096): nothing ignored
    "mistral": ("llama", _MISTRAL | {"llama.attention.sliding_window": 4096}, False, (), ()),
    # transformers runs a llama file as Mistral only when its name is exactly "mistral"
    "mistral-named": (
        "llama",
        _MISTRAL | {"general.name": "Mistral 7B Instruct v0.3"},
        False,
        (),
        (),
    ),
    "qwen2": ("qwen2", _QWEN2, True, (), ()),
    "qwen3": ("qwen3", _QWEN3, True, (), ()),
    # transformers keeps Qwen3Config's head_dim of 128 whatever the file says
    "qwen3-head64": (
        "qwen3",
        _QWEN3 | {"qwen3.attention.key_length": 64},
        False,
        (),
        ("qwen3.attention.key_length",),
    ),
    "gemma2": ("gemma2", _GEMMA2, True, (), ()),
    # soft-caps transformers does not read: its defaults (50, 30) stay
    "gemma2-caps": (
        "gemma2",
        _GEMMA2
        | {"gemma2.attn_logit_softcapping": 40.0, "gemma2.rope.freq_base": 20000.0}
        | {"gemma2.attention.sliding_window": 1024},
        True,
        (),
        ("gemma2.attn_logit_softcapping",),
    ),
    "gemma3": ("gemma3", _GEMMA3, True, (), ()),
    "gemma3-scaled": (
        "gemma3",
        _GEMMA3 | {f"gemma3.{k}": v for k, v in _SCALED.items()},
        True,
        (),
        (),
    ),
    # nothing but the shape's essentials: the config classes' defaults fill the rest
    "llama-bare": ("llama", {"llama.block_count": 2}, False, (), ()),
    "gemma3-bare": ("gemma3", {"gemma3.block_count": 7}, True, (), ()),
}


def write_metadata_gguf(
    path: Path,
    arch: str,
    metadata: dict[str, Any],
    tied: bool = True,
    tensors: tuple[str, ...] = (),
    vocab: int = 300,
) -> Path:
    """A GGUF file with these fields (ints as uint32, floats as float32) and tiny tensors."""
    writer = gguf.GGUFWriter(path, arch)
    for key, value in metadata.items():
        if isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        else:
            writer.add_string(key, value)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([f"t{i}" for i in range(vocab)])
    writer.add_tensor("token_embd.weight", np.zeros((vocab, 8), np.float32))
    for name in tensors if tied else ("output.weight", *tensors):
        shape = (vocab if name == "output.weight" else 4, 8)
        writer.add_tensor(name, TENSORS.get(name, np.ones(shape, np.float32)))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def transformers_config(path: Path) -> Any:
    """transformers' config of a GGUF file: the oracle."""
    return AutoConfig.from_pretrained(path.parent, gguf_file=path.name)


def rope_dict(rope: Rope) -> dict[str, Any]:
    """Our rotary settings as transformers' ``rope_parameters`` dict of one layer type."""
    out: dict[str, Any] = {"rope_type": rope.rope_type, "rope_theta": rope.rope_theta}
    if rope.rope_type != "default":
        out["factor"] = rope.factor
    if rope.rope_type == "llama3":
        out["low_freq_factor"] = rope.low_freq_factor
        out["high_freq_factor"] = rope.high_freq_factor
        out["original_max_position_embeddings"] = rope.original_max_position_embeddings
    return out


def assert_same(ours: GGUFConfig, theirs: Any) -> None:
    """Every field of ours equals transformers' config (and what the C forward derives of it)."""
    for name in (
        "model_type",
        "num_hidden_layers",
        "hidden_size",
        "intermediate_size",
        "num_attention_heads",
        "num_key_value_heads",
        "vocab_size",
        "rms_norm_eps",
        "max_position_embeddings",
        "tie_word_embeddings",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
    ):
        assert getattr(ours, name) == getattr(theirs, name), name
        assert type(getattr(ours, name)) is type(getattr(theirs, name)), name
    for name in (
        "sliding_window",
        "attn_logit_softcapping",
        "final_logit_softcapping",
        "query_pre_attn_scalar",
    ):
        assert getattr(ours, name) == getattr(theirs, name, None), name
    assert ours.head_dim == native_model.head_dim(theirs)
    # Llama and Mistral configs have no layer types: Mistral's window is on every layer
    kinds = (
        getattr(theirs, "layer_types", None)
        or ["sliding_attention" if theirs.model_type == "mistral" else "full_attention"]
        * theirs.num_hidden_layers
    )
    assert list(ours.layer_types) == list(kinds)
    ropes = native_model.rope_kinds(theirs)
    if None in ropes:
        assert ours.local_rope is None
        assert rope_dict(ours.rope) == ropes[None]
    else:
        assert ours.local_rope is not None
        assert rope_dict(ours.rope) == ropes["full_attention"]
        assert rope_dict(ours.local_rope) == ropes["sliding_attention"]
    with torch.device("meta"):
        for i in range(theirs.num_hidden_layers):
            attention = native_model.Attention(theirs, i)
            assert ours.window(i) == attention.sliding_window, i
            assert ours.attention_scale == attention.scaling
            assert ours.layer_rope(i).head_dim == attention.head_dim
    if ours.local_rope is not None:
        sliding = [i for i, t in enumerate(theirs.layer_types) if t == "sliding_attention"]
        assert all(ours.layer_rope(i) is ours.local_rope for i in sliding)
    assert native_model.refusal(theirs) is None  # the C forward runs every case here


@pytest.mark.parametrize("case", sorted(CASES))
def test_config_equals_transformers(tmp_path: Path, case: str) -> None:
    arch, metadata, tied, tensors, ignored = CASES[case]
    path = write_metadata_gguf(tmp_path / f"{case}.gguf", arch, metadata, tied, tensors)
    ours = read_config(path)
    theirs = transformers_config(path)
    if case in SCALINGS:
        scaled = "full_attention" if arch == "gemma3" else None
        assert native_model.rope_kinds(theirs)[scaled]["rope_type"] == "default"
        # the torch path's config: transformers' with the model's own scaling
        with_file_rope(theirs, path)
        assert native_model.rope_kinds(theirs)[scaled] == SCALINGS[case]
    assert_same(ours, theirs)
    assert ours.ignored == ignored


def test_bundled_smollm2_equals_transformers() -> None:
    path = bundled_gguf_path("SmolLM2-135M-Instruct")
    ours = read_config(path)
    assert_same(ours, transformers_config(path))
    assert (ours.model_type, ours.num_hidden_layers, ours.head_dim) == ("llama", 30, 64)
    assert ours.rope == Rope(100000.0, 64)
    assert ours.ignored == ()


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma2", "gemma3"])
def test_tiny_test_models_equal_transformers(tmp_path: Path, arch: str) -> None:
    """The loader tests' files (tensors and architecture only): the config classes' defaults."""
    path = write_gguf(tmp_path / arch, arch, {"*": QK.F32}, tmp_path / "cache", tied=True)
    assert_same(read_config(path), transformers_config(path))


def rotary(config: Any) -> Any:
    """transformers' rotary module of the config's model type."""
    name = {"gemma3_text": "gemma3"}.get(config.model_type, config.model_type)
    module = importlib.import_module(f"transformers.models.{name}.modeling_{name}")
    prefix = {"qwen2": "Qwen2", "qwen3": "Qwen3", "gemma2": "Gemma2", "gemma3": "Gemma3"}
    return getattr(module, f"{prefix.get(name, name.capitalize())}RotaryEmbedding")(config)


def torch_tables(module: Any, layer_type: str | None) -> tuple[np.ndarray, ...]:
    """transformers' cos, sin ``[positions, head_dim]`` and inverse frequencies."""
    by_type = () if layer_type is None else (layer_type,)
    x = torch.empty(0, dtype=torch.float32)
    cos, sin = module(x, torch.arange(POSITIONS)[None], *by_type)
    prefix = "" if layer_type is None else f"{layer_type}_"
    inv_freq = getattr(module, f"{prefix}inv_freq")
    return cos[0].numpy(), sin[0].numpy(), inv_freq.numpy()


def ulps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """How many float32 steps apart each pair of entries is."""
    ia, ib = (x.astype(np.float32).view(np.int32).astype(np.int64) for x in (a, b))
    ia, ib = (np.where(i < 0, -(i & 0x7FFFFFFF), i) for i in (ia, ib))
    return np.abs(ia - ib)


def assert_tables(rope: Rope, module: Any, layer_type: str | None = None) -> None:
    """Ours against the module's: within the measured bounds (see TABLE_ATOL)."""
    cos_t, sin_t, inv_t = torch_tables(module, layer_type)
    inv = inverse_frequencies(rope)
    assert inv.dtype == np.float32
    assert inv.shape == inv_t.shape
    apart = ulps(inv, inv_t)
    assert apart.max() <= 1, apart
    assert (apart > 0).sum() <= 1, apart
    # The evaluation alone, from torch's own inverse frequencies: within 1 ulp
    cos_e, sin_e = tables(inv_t, POSITIONS)
    assert ulps(cos_e, cos_t).max() <= 1
    assert ulps(sin_e, sin_t).max() <= 1
    cos, sin = cos_sin(rope, POSITIONS)
    assert cos.dtype == sin.dtype == np.float32
    assert cos.shape == cos_t.shape
    if not apart.any():
        np.testing.assert_array_equal(cos, cos_e)
    np.testing.assert_allclose(cos, cos_t, rtol=0, atol=TABLE_ATOL)
    np.testing.assert_allclose(sin, sin_t, rtol=0, atol=TABLE_ATOL)
    # Some positions given, not a count: the same rows
    rows = np.array([5, 0, 32767, 4096])
    some = cos_sin(rope, rows)
    np.testing.assert_array_equal(some[0], cos[rows])
    np.testing.assert_array_equal(some[1], sin[rows])


@pytest.mark.parametrize("case", ["llama3.2", "mistral", "qwen2", "qwen3", "gemma2", "gemma3"])
def test_rope_tables_equal_transformers(tmp_path: Path, case: str) -> None:
    arch, metadata, tied, tensors, _ = CASES[case]
    path = write_metadata_gguf(tmp_path / f"{case}.gguf", arch, metadata, tied, tensors)
    ours, theirs = read_config(path), transformers_config(path)
    with_file_rope(theirs, path)  # the torch path's config: Llama 3.2's scaling applied
    module = rotary(theirs)
    if ours.local_rope is None:
        assert_tables(ours.rope, module)
    else:
        assert_tables(ours.rope, module, "full_attention")
        assert_tables(ours.local_rope, module, "sliding_attention")


def test_bundled_smollm2_rope_table() -> None:
    ours = read_config(bundled_gguf_path("SmolLM2-135M-Instruct"))
    theirs = transformers_config(bundled_gguf_path("SmolLM2-135M-Instruct"))
    assert_tables(ours.rope, rotary(theirs))


# Scaled kinds, as transformers' configs of Llama 3.1/3.2 and a linear-scaled model hold them.
# Factors that are not powers of two too, where the order of float32 steps shows.
SCALED = {
    "llama3.2": (64, {"factor": 32.0, "rope_type": "llama3"}),
    "llama3.1": (128, {"factor": 8.0, "rope_type": "llama3"}),
    "llama3-odd": (128, {"factor": 6.0, "rope_type": "llama3", "high_freq_factor": 3.0}),
    "linear": (128, {"factor": 8.0, "rope_type": "linear", "rope_theta": 1e6}),
    "linear-odd": (64, {"factor": 3.0, "rope_type": "linear"}),
}


@pytest.mark.parametrize("case", sorted(SCALED))
def test_scaled_rope_tables_equal_transformers(case: str) -> None:
    head_dim, extra = SCALED[case]
    params: dict[str, Any] = {"rope_theta": 500000.0} | extra
    if params["rope_type"] == "llama3":
        params = {
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        } | params
    config = LlamaConfig(
        hidden_size=32 * head_dim,
        num_attention_heads=32,
        head_dim=head_dim,
        max_position_embeddings=131072,
        rope_parameters=dict(params),
    )
    rope = Rope(head_dim=head_dim, **params)
    assert rope_dict(rope) == config.rope_parameters
    assert_tables(rope, rotary(config))


def test_gemma3_linear_scaled_global_rope() -> None:
    """Gemma 3 4B's global layers (linear, factor 8), as a config.json carries them."""
    config = Gemma3TextConfig(
        rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        }
    )
    module = rotary(config)
    assert_tables(Rope(1e6, 256, "linear", 8.0), module, "full_attention")
    assert_tables(Rope(10000.0, 256), module, "sliding_attention")


@pytest.mark.parametrize("arch", ["phi2", "olmo2", "phi3", "bert"])
def test_unsupported_architecture_is_refused(tmp_path: Path, arch: str) -> None:
    path = write_metadata_gguf(tmp_path / "model.gguf", arch, {f"{arch}.block_count": 2})
    with pytest.raises(UnsupportedModelError) as raised:
        read_config(path)
    assert isinstance(raised.value, ModelLoadError)
    message = str(raised.value)
    assert repr(arch) in message
    assert "`paged-llm[engine]` (the torch path)" in message
    # phi3 the torch path runs; the others it refuses as well, and the message says so
    assert message.endswith("runs it") == (arch == "phi3"), message


@pytest.mark.parametrize("kind", ["yarn", "dynamic", "longrope", "proportional"])
def test_unsupported_rope_type_is_refused(kind: str) -> None:
    with pytest.raises(UnsupportedModelError, match=rf"'{kind}'.*`paged-llm\[engine\]`"):
        Rope(1e6, 128, kind, 4.0)


@pytest.mark.parametrize(
    ("fields", "table", "feature"),
    [
        ({"llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": 4.0}, None, "'yarn'"),
        ({"llama.rope.scaling.type": "longrope"}, None, "'longrope'"),
        # a table of other band limits (low 2, high 8, 4096 tokens) than Llama 3's
        ({}, converter_llama3_table(500000.0, 64, 32.0, 2.0, 8.0, 4096), "not Llama 3's"),
        ({}, np.full(16, 2.0, np.float32), "table of 16 values"),
        ({"llama.rope.scaling.type": "linear"}, TENSORS["rope_freqs.weight"], "beside 'linear'"),
    ],
    ids=["yarn", "longrope", "other-bands", "short-table", "both"],
)
def test_rope_scaling_neither_path_runs_exactly_is_refused(
    tmp_path: Path, fields: dict[str, Any], table: np.ndarray | None, feature: str
) -> None:
    """Refused by name on both paths, not run with rotary embeddings it was not trained on."""
    tensors = ("rope_freqs.weight",) if table is not None else ()
    path = tmp_path / "model.gguf"
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(TENSORS, "rope_freqs.weight", table)
        write_metadata_gguf(path, "llama", _LLAMA32 | fields, True, tensors)
    with pytest.raises(UnsupportedModelError, match=feature) as raised:
        read_config(path)
    assert "runs linear scaling and Llama 3's" in str(raised.value)
    with pytest.raises(UnsupportedModelError, match=feature):
        with_file_rope(transformers_config(path), path)


def test_llama3_rope_needs_its_parameters() -> None:
    with pytest.raises(UnsupportedModelError, match="low_freq_factor"):
        Rope(500000.0, 64, "llama3", 8.0)


def test_per_layer_arrays_and_unreadable_files_are_load_errors(tmp_path: Path) -> None:
    path = tmp_path / "model.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_uint32("llama.block_count", 2)
    writer.add_array("llama.attention.head_count_kv", [2, 0])  # one per layer (OpenELM-like)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelLoadError, match="num_key_value_heads"):
        read_config(path)
    (tmp_path / "bad.gguf").write_bytes(b"GGML" + bytes(64))
    with pytest.raises(ModelLoadError, match=r"bad\.gguf"):
        read_config(tmp_path / "bad.gguf")


# Uses the two modules where torch, transformers and even gguf cannot be imported.
PROBE = """
from paged_llm.engine.model import gguf_config, rope

read = gguf_config.read_config({path!r})
cos, sin = rope.cos_sin(read.rope, 16)
assert cos.shape == (16, 64), cos.shape
print(read.model_type, read.num_hidden_layers)
"""


def test_modules_import_neither_torch_nor_transformers() -> None:
    path = str(bundled_gguf_path("SmolLM2-135M-Instruct"))
    result = run_without_torch(PROBE.format(path=path), blocked=(*BLOCKED, "gguf"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["llama", "30"]
