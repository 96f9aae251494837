"""A GGUF file's model settings for the engine's C forward, read without transformers.

transformers builds a GGUF model's config from the file's metadata (``load_gguf_checkpoint``
with ``GGUF_CONFIG_MAPPING``, then the model's config class fills in its defaults for
whatever the file does not state). :func:`read_config` gives the same values for the
architectures the C forward runs (llama, with SmolLM2 and Llama 3.x; mistral, which
transformers takes from a llama file named exactly ``mistral``; qwen2; qwen3; gemma2;
gemma3 text), from the engine's own metadata reader: what the torch-free path (issue 57)
needs, equal to what the torch path gets. transformers reads only some of llama.cpp's keys.
The rope scaling it skips is applied on both paths (gguf_rope.py: the model's own config
is the oracle there); the other keys it ignores (Gemma 2's soft-caps, Qwen 3's key length,
a window other than the class's) are not used here either, so both paths run the same
model, and :attr:`GGUFConfig.ignored` names them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from paged_llm.engine.errors import ModelLoadError, UnsupportedModelError
from paged_llm.engine.model import gguf_rope
from paged_llm.engine.model.architectures import SUPPORTED_MODEL_TYPES
from paged_llm.engine.model.gguf_metadata import MetadataReader, Unreadable
from paged_llm.engine.model.rope import Rope

# GGUF architecture -> transformers' model type, for the architectures the C forward runs.
MODEL_TYPES = {
    "llama": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "gemma2": "gemma2",
    "gemma3": "gemma3_text",
}
GEMMA = ("gemma2", "gemma3_text")

# GGUF_CONFIG_MAPPING's keys (after the architecture's prefix) that these families share.
_COMMON_KEYS = {
    "context_length": "max_position_embeddings",
    "block_count": "num_hidden_layers",
    "feed_forward_length": "intermediate_size",
    "embedding_length": "hidden_size",
    "rope.freq_base": "rope_theta",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
    "vocab_size": "vocab_size",
}
# ...and the ones only some of them have: qwen2/qwen3 map rope.dimension_count to nothing,
# and Qwen 3's attention.key_length is not mapped at all (its head_dim stays 128).
_EXTRA_KEYS: dict[str, dict[str, str]] = {
    "llama": {"rope.dimension_count": "head_dim"},
    "mistral": {"rope.dimension_count": "head_dim"},
    "qwen2": {},
    "qwen3": {},
    "gemma2": {"attention.key_length": "head_dim", "attention.sliding_window": "sliding_window"},
    "gemma3_text": {
        "attention.key_length": "head_dim",
        "attention.sliding_window": "sliding_window",
    },
}
_TOKEN_KEYS = {
    "tokenizer.ggml.bos_token_id": "bos_token_id",
    "tokenizer.ggml.eos_token_id": "eos_token_id",
    "tokenizer.ggml.padding_token_id": "pad_token_id",
}
# The config classes' defaults (transformers 5: LlamaConfig, MistralConfig, Qwen2Config,
# Qwen3Config, Gemma2Config, Gemma3TextConfig) for what a file may leave out. None for
# head_dim and num_key_value_heads: worked out from the rest, as the classes do.
_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {
        "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": None,
        "head_dim": None, "max_position_embeddings": 2048, "rms_norm_eps": 1e-6,
        "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": None, "sliding_window": None,
    },
    "mistral": {
        "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
        "head_dim": None, "max_position_embeddings": 4096 * 32, "rms_norm_eps": 1e-6,
        "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": None, "sliding_window": 4096,
    },
    "qwen2": {
        "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
        "head_dim": None, "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
        # use_sliding_window is False and no GGUF key sets it: no window
        "bos_token_id": None, "eos_token_id": None, "pad_token_id": None, "sliding_window": None,
    },
    "qwen3": {
        "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
        "head_dim": 128, "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
        "bos_token_id": None, "eos_token_id": None, "pad_token_id": None, "sliding_window": None,
    },
    "gemma2": {
        "vocab_size": 256000, "hidden_size": 2304, "intermediate_size": 9216,
        "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4,
        "head_dim": 256, "max_position_embeddings": 8192, "rms_norm_eps": 1e-6,
        "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0, "sliding_window": 4096,
    },
    "gemma3_text": {
        "vocab_size": 262_208, "hidden_size": 2304, "intermediate_size": 9216,
        "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4,
        "head_dim": 256, "max_position_embeddings": 131_072, "rms_norm_eps": 1e-6,
        "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0, "sliding_window": 4096,
    },
}  # fmt: skip
_DEFAULT_THETA = 10_000.0
# Gemma 3: its full layers' base (the file's rope.freq_base), its sliding layers' (never in
# the file), and one full layer in every six (sliding_window_pattern, never in the file).
_GEMMA3_THETA, _GEMMA3_LOCAL_THETA, _GEMMA3_PATTERN = 1_000_000.0, 10_000.0, 6
# Gemma 2's soft-caps and query scalar, and Gemma 3's scalar: the classes' defaults, as
# transformers maps no GGUF key to them.
_GEMMA2_SOFTCAPS = (50.0, 30.0)
_QUERY_PRE_ATTN_SCALAR = 256
FULL, SLIDING = "full_attention", "sliding_attention"


@dataclasses.dataclass(frozen=True, slots=True)
class GGUFConfig:
    """What the C forward needs of a model, under transformers' config names."""

    architecture: str  # the file's general.architecture
    model_type: str  # transformers' model type
    num_hidden_layers: int
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float
    max_position_embeddings: int
    rope: Rope  # every layer's, but Gemma 3's sliding layers'
    local_rope: Rope | None  # Gemma 3's sliding layers'
    sliding_window: int | None  # as transformers' config holds it
    # Each layer's attention: sliding where the window applies (all of Mistral's layers)
    layer_types: tuple[str, ...]
    attn_logit_softcapping: float | None
    final_logit_softcapping: float | None
    query_pre_attn_scalar: int | None  # Gemma's query scale is this ** -0.5
    tie_word_embeddings: bool
    bos_token_id: int | None
    eos_token_id: int | None
    pad_token_id: int | None
    # Keys of the file that llama.cpp runs by but transformers ignores (and so do we)
    ignored: tuple[str, ...] = ()

    @property
    def gemma(self) -> bool:
        """Whether the layers are Gemma's: norms around attention and MLP, GELU, scaled input."""
        return self.model_type in GEMMA

    @property
    def attention_scale(self) -> float:
        """What attention scores are multiplied by, as transformers' attention modules set it."""
        if self.query_pre_attn_scalar is not None:
            return float(self.query_pre_attn_scalar**-0.5)
        return float(self.head_dim**-0.5)

    def window(self, layer: int) -> int | None:
        """The layer's sliding window (None: it attends to the whole sequence)."""
        return self.sliding_window if self.layer_types[layer] == SLIDING else None

    def layer_rope(self, layer: int) -> Rope:
        """The rotary embedding of a layer: Gemma 3's sliding layers have their own."""
        if self.local_rope is not None and self.layer_types[layer] == SLIDING:
            return self.local_rope
        return self.rope


def read_config(path: str | Path) -> GGUFConfig:
    """The config of a GGUF file; ModelLoadError when unreadable or not run without torch."""
    try:
        reader = MetadataReader(path)
    except Unreadable as err:
        raise ModelLoadError(f"{path}: cannot read its GGUF metadata ({err})") from err
    except OSError as err:
        raise ModelLoadError(f"{path}: {err}") from err
    names = [t.name for t in reader.tensors]
    return config_of(reader.values(), names, rope_factors(Path(path), reader))


def rope_factors(path: Path, reader: MetadataReader) -> np.ndarray | None:
    """The file's rope_freqs table (Llama 3's scaling) as float32, or None when it has none."""
    if not any(t.name == gguf_rope.FACTORS_TENSOR for t in reader.tensors):
        return None
    from paged_llm.engine.model import gguf_file

    file = gguf_file.read(path, reader)
    info = next(t for t in file.tensors if t.name == gguf_rope.FACTORS_TENSOR)
    if info.type_name not in ("F32", "F16"):
        raise ModelLoadError(f"{path}: its {info.name} is {info.type_name}, not F32 or F16")
    dtype = np.float32 if info.type_name == "F32" else np.float16
    return file.data(info).view(dtype).astype(np.float32)


def config_of(
    metadata: Mapping[str, Any],
    tensor_names: Collection[str],
    rope_factors: np.ndarray | None = None,
) -> GGUFConfig:
    """The config of a file with this metadata (MetadataReader.values()) and these tensors.

    ``rope_factors``: the file's rope_freqs tensor, which a file with one must pass.
    """
    architecture = str(metadata.get("general.architecture", ""))
    model_type = MODEL_TYPES.get(architecture)
    if model_type is None:
        raise _refusal(architecture)
    # transformers runs a llama file whose general.name is exactly "mistral" as Mistral
    if model_type == "llama" and metadata.get("general.name") == "mistral":
        model_type = "mistral"
    values = dict(_DEFAULTS[model_type])
    values["rope_theta"] = _GEMMA3_THETA if model_type == "gemma3_text" else _DEFAULT_THETA
    # Without {arch}.vocab_size transformers counts the vocabulary (values() gives its length)
    if "tokenizer.ggml.tokens" in metadata:
        values["vocab_size"] = metadata["tokenizer.ggml.tokens"]
    keys = {f"{architecture}.{k}": name for k, name in _COMMON_KEYS.items()}
    keys |= {f"{architecture}.{k}": name for k, name in _EXTRA_KEYS[model_type].items()}
    for key, name in (keys | _TOKEN_KEYS).items():
        if key in metadata:
            values[name] = metadata[key]
    eps, theta = (_number(name, values.pop(name)) for name in ("rms_norm_eps", "rope_theta"))
    ints = {name: _int(name, value) for name, value in values.items() if value is not None}
    heads = ints["num_attention_heads"]
    head_dim = ints.get("head_dim") or ints["hidden_size"] // heads
    layers = ints["num_hidden_layers"]
    if gguf_rope.FACTORS_TENSOR in tensor_names and rope_factors is None:
        raise ValueError(f"a file with {gguf_rope.FACTORS_TENSOR} needs its values passed")
    scaled = gguf_rope.scaling(metadata, architecture, theta, head_dim, rope_factors)
    rope = Rope(head_dim=head_dim, **scaled) if scaled is not None else Rope(theta, head_dim)
    local_rope = None
    window = ints.get("sliding_window")
    softcaps: tuple[float | None, float | None] = (None, None)
    if model_type == "mistral":
        types = (SLIDING,) * layers  # MistralConfig's window applies to every layer
    elif model_type == "gemma2":
        types = tuple(SLIDING if (i + 1) % 2 else FULL for i in range(layers))
        softcaps = _GEMMA2_SOFTCAPS
    elif model_type == "gemma3_text":
        types = tuple(SLIDING if (i + 1) % _GEMMA3_PATTERN else FULL for i in range(layers))
        local_rope = Rope(_GEMMA3_LOCAL_THETA, head_dim)
    else:
        types = (FULL,) * layers
    config = GGUFConfig(
        architecture=architecture,
        model_type=model_type,
        num_hidden_layers=layers,
        hidden_size=ints["hidden_size"],
        intermediate_size=ints["intermediate_size"],
        num_attention_heads=heads,
        num_key_value_heads=ints.get("num_key_value_heads", heads),
        head_dim=head_dim,
        vocab_size=ints["vocab_size"],
        rms_norm_eps=eps,
        max_position_embeddings=ints["max_position_embeddings"],
        rope=rope,
        local_rope=local_rope,
        sliding_window=window,
        layer_types=types,
        attn_logit_softcapping=softcaps[0],
        final_logit_softcapping=softcaps[1],
        query_pre_attn_scalar=_QUERY_PRE_ATTN_SCALAR if model_type in GEMMA else None,
        tie_word_embeddings="output.weight" not in tensor_names,
        bos_token_id=ints.get("bos_token_id"),
        eos_token_id=ints.get("eos_token_id"),
        pad_token_id=ints.get("pad_token_id"),
    )
    ignored = _ignored(metadata, config, set(keys))
    return dataclasses.replace(config, ignored=ignored) if ignored else config


def _int(name: str, value: Any) -> int:
    """An integer setting; ModelLoadError for another kind (a per-layer array, say)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ModelLoadError(f"the GGUF file's {name} is {value!r}, not one integer")
    return value


def _number(name: str, value: Any) -> float:
    """A real setting as a Python float (a float32 field's exact value, as transformers has it)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ModelLoadError(f"the GGUF file's {name} is {value!r}, not a number")
    return float(value)


# llama.cpp's keys that change the forward where transformers maps nothing to them (rope
# scaling aside: gguf_rope.py applies it on both paths).
_VALUED_KEYS = (
    "attention.key_length",
    "attention.sliding_window",
    "attn_logit_softcapping",
    "final_logit_softcapping",
)


def _ignored(metadata: Mapping[str, Any], config: GGUFConfig, mapped: set[str]) -> tuple[str, ...]:
    """The file's forward-changing keys transformers skips, where their value is not the one used.

    Gemma 2's usual soft-caps are the class's defaults anyway: only another value counts.
    """
    prefix = f"{config.architecture}."
    used = {
        "attention.key_length": config.head_dim,
        "attention.sliding_window": config.sliding_window,
        "attn_logit_softcapping": config.attn_logit_softcapping,
        "final_logit_softcapping": config.final_logit_softcapping,
    }
    return tuple(
        prefix + suffix
        for suffix in _VALUED_KEYS
        if prefix + suffix in metadata
        and prefix + suffix not in mapped
        and metadata[prefix + suffix] != used[suffix]
    )


def _refusal(architecture: str) -> UnsupportedModelError:
    """The error for a GGUF architecture the torch-free path does not run."""
    runs = ", ".join(["llama", "mistral", *list(MODEL_TYPES)[1:]])
    model_type = "gemma3_text" if architecture == "gemma3" else architecture
    if model_type in SUPPORTED_MODEL_TYPES:
        torch_path = "`paged-llm[engine]` (the torch path) runs it"
    else:
        supported = ", ".join(sorted(SUPPORTED_MODEL_TYPES))
        torch_path = f"`paged-llm[engine]` (the torch path) runs {supported}, not this one either"
    return UnsupportedModelError(
        f"GGUF architecture {architecture!r} is not run without torch (this path runs "
        f"{runs}); {torch_path}",
        f"the {architecture!r} architecture",
    )
