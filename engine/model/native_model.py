"""A Llama- or Gemma-family GGUF model as the C forward reads it, without transformers' classes.

Importing a transformers model class imports its whole modeling stack (torch.compile's
tracer, accelerate, distributed tensors): seconds of every start, more than the rest of
loading a 1.5B GGUF file. The architectures kernels/cpu/src/cpu_forward.c runs need none of it:
for them the GGUF loader builds :class:`NativeModel`, the module tree transformers' model
has (``model.layers[i].self_attn.q_proj`` and so on, so the loader fills it by the same
names) holding the same weights, with no forward of its own. transformers' model of the
same file stays the oracle: tests/engine/test_native_model.py compares the two token for
token.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

# Model types whose decoder layer cpu_forward.c runs as transformers does.
MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3_text")
# Those with Gemma's layer: norms after attention and MLP too, GELU, a scaled embedding.
GEMMA = ("gemma2", "gemma3_text")
# Rotary kinds whose cos and sin at a position do not depend on the rest of the step, so a
# table worked out once serves every step (dynamic NTK and LongRoPE change with the length).
STATIC_ROPE = ("default", "linear", "llama3", "yarn")


def refusal(config: Any) -> str | None:
    """Why the C forward cannot run a model of this config, or None when it can."""
    model_type = getattr(config, "model_type", None)
    if model_type not in MODEL_TYPES:
        return f"model type {model_type!r} has no native forward"
    act, want = activation(config)
    if act != want:
        return f"activation {act!r}"
    if missing := missing_rope_types(config):
        return f"no rotary parameters for its {', '.join(map(repr, missing))} layers"
    for rope in rope_kinds(config).values():
        if float(rope.get("partial_rotary_factor", 1.0)) != 1.0:
            return "partial rotary embeddings"
    return None


def activation(config: Any) -> tuple[Any, str]:
    """The config's MLP activation, and the one the C forward runs for its model type."""
    if config.model_type in GEMMA:
        return getattr(config, "hidden_activation", None), "gelu_pytorch_tanh"
    return getattr(config, "hidden_act", None), "silu"


def rope_kinds(config: Any) -> dict[str | None, dict[str, Any]]:
    """The rotary parameters of each layer type (Gemma 3 has two), else of all (key None)."""
    rope = getattr(config, "rope_parameters", None) or {}
    if config.model_type == "gemma3_text":
        types = sorted(set(getattr(config, "layer_types", None) or ()))
        return {t: rope[t] for t in types if isinstance(rope.get(t), dict)}
    return {None: rope}


def missing_rope_types(config: Any) -> list[str]:
    """Gemma 3's layer types whose rotary parameters the config lacks (none elsewhere)."""
    if config.model_type != "gemma3_text":
        return []
    kinds = rope_kinds(config)
    return [t for t in sorted(set(getattr(config, "layer_types", None) or ())) if t not in kinds]


def can_build(config: Any) -> bool:
    """Whether a NativeModel of ``config`` runs: the C forward takes it, its rotary is static.

    Where not, transformers' model runs it (the C forward too, with a length-dependent
    rotary module computing cos and sin every step).
    """
    kinds = rope_kinds(config).values()
    return refusal(config) is None and all(
        rope.get("rope_type", "default") in STATIC_ROPE for rope in kinds
    )


def head_dim(config: Any) -> int:
    """The attention head size, as the four architectures' attention modules work it out."""
    return int(
        getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    )


class RMSNorm(nn.Module):
    """An RMS norm's weight and epsilon (cpu_forward.c applies it)."""

    def __init__(self, size: int, eps: float) -> None:
        """An empty weight of ``size``, filled by the loader."""
        super().__init__()
        self.weight = nn.Parameter(torch.empty(size))
        self.variance_epsilon = eps


class Rotary(nn.Module):
    """The rotary embedding's cos and sin, computed as transformers' rotary modules do."""

    inv_freq: torch.Tensor

    def __init__(self, config: Any, layer_type: str | None = None) -> None:
        """Inverse frequencies from the config's rope parameters (a static kind only).

        ``layer_type`` picks the parameters of one layer type (Gemma 3's, see rope_kinds).
        """
        super().__init__()
        rope = rope_kinds(config)[layer_type]
        self.rope_type = rope["rope_type"]
        if self.rope_type not in STATIC_ROPE:
            raise ValueError(f"rope type {self.rope_type!r} changes with the length")
        if self.rope_type == "default":
            base = rope["rope_theta"]
            dim = head_dim(config)
            inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
            self.attention_scaling = 1.0
        else:
            from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

            init = ROPE_INIT_FUNCTIONS[self.rope_type]
            by_type = {} if layer_type is None else {"layer_type": layer_type}
            inv_freq, self.attention_scaling = init(config, **by_type)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The cos and sin ``[batch, positions, head_dim]``, in ``x``'s dtype."""
        freqs = position_ids[..., None].float() * self.inv_freq.float()
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = emb.cos() * self.attention_scaling
        sin = emb.sin() * self.attention_scaling
        return cos.to(x.dtype), sin.to(x.dtype)


class RotaryByType(nn.Module):
    """Gemma 3's rotary embeddings, one per layer type, called as transformers' module is."""

    def __init__(self, config: Any) -> None:
        """A Rotary for each layer type."""
        super().__init__()
        kinds = rope_kinds(config)
        self.rope_type = {str(t): rope["rope_type"] for t, rope in kinds.items()}
        self.by_type = nn.ModuleDict({t: Rotary(config, t) for t in self.rope_type})

    def forward(
        self, x: torch.Tensor, position_ids: torch.Tensor, layer_type: str
    ) -> tuple[torch.Tensor, ...]:
        """The cos and sin of the layers of ``layer_type``."""
        rotary: Rotary = self.by_type[layer_type]  # type: ignore[assignment]
        cos_sin: tuple[torch.Tensor, ...] = rotary(x, position_ids)
        return cos_sin


class Attention(nn.Module):
    """A layer's four projections, optional per-head norms and its attention settings."""

    def __init__(self, config: Any, index: int) -> None:
        """Projections shaped and biased as the architecture's transformers module has them."""
        super().__init__()
        kind = config.model_type
        self.head_dim = head_dim(config)
        self.scaling = self.head_dim**-0.5
        if kind in GEMMA:
            self.scaling = config.query_pre_attn_scalar**-0.5
        heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
        hidden = config.hidden_size
        biased = ("llama", "qwen3", *GEMMA)
        bias = kind in biased and bool(getattr(config, "attention_bias", False))
        qkv_bias = bias or kind == "qwen2"
        self.q_proj = nn.Linear(hidden, heads * self.head_dim, bias=qkv_bias)
        self.k_proj = nn.Linear(hidden, kv_heads * self.head_dim, bias=qkv_bias)
        self.v_proj = nn.Linear(hidden, kv_heads * self.head_dim, bias=qkv_bias)
        self.o_proj = nn.Linear(heads * self.head_dim, hidden, bias=bias)
        if kind in ("qwen3", "gemma3_text"):
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.sliding_window = _window(config, index)


def _window(config: Any, index: int) -> int | None:
    """The layer's sliding window as transformers' attention module sets it (None: full)."""
    window = getattr(config, "sliding_window", None)
    if config.model_type == "mistral":
        return window
    if config.model_type in ("qwen2", "qwen3", *GEMMA):
        sliding = config.layer_types[index] == "sliding_attention"
        return window if sliding else None
    return None


class MLP(nn.Module):
    """A layer's gated MLP projections (SiLU, or Gemma's GELU)."""

    def __init__(self, config: Any) -> None:
        """gate, up and down, biased where a Llama config asks for it."""
        super().__init__()
        hidden, inner = config.hidden_size, config.intermediate_size
        bias = config.model_type == "llama" and bool(getattr(config, "mlp_bias", False))
        self.gate_proj = nn.Linear(hidden, inner, bias=bias)
        self.up_proj = nn.Linear(hidden, inner, bias=bias)
        self.down_proj = nn.Linear(inner, hidden, bias=bias)


class DecoderLayer(nn.Module):
    """One decoder layer's weights."""

    def __init__(self, config: Any, index: int) -> None:
        """Attention, MLP and the two norms (Gemma: four, around each)."""
        super().__init__()
        self.self_attn = Attention(config, index)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        if config.model_type in GEMMA:
            self.pre_feedforward_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
            self.post_feedforward_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class Decoder(nn.Module):
    """The embedding, the layers, the final norm and the rotary embedding."""

    def __init__(self, config: Any, rotary: Rotary | RotaryByType) -> None:
        """Modules for ``config.num_hidden_layers`` layers."""
        super().__init__()
        shape = (config.vocab_size, config.hidden_size)
        # Given its (empty) weight: initializing one on the meta device imports torch's
        # compiler, a second of a start.
        self.embed_tokens = nn.Embedding(*shape, _weight=torch.empty(shape))
        self.layers = nn.ModuleList(
            DecoderLayer(config, i) for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = rotary


class NativeModel(nn.Module):
    """A causal LM's weights under transformers' names, run only by the engine's C forward."""

    def __init__(self, config: Any) -> None:
        """The module tree of ``config`` (build it on the meta device: the loader fills it)."""
        super().__init__()
        reason = refusal(config)
        if reason is not None:
            raise ValueError(reason)
        from transformers import GenerationConfig

        self.config = config
        # What transformers' model carries (eos ids, a repetition penalty), from the config.
        self.generation_config = GenerationConfig.from_model_config(config)
        with torch.device("cpu"):  # real inverse frequencies, even built under meta
            rotary = RotaryByType(config) if None not in rope_kinds(config) else Rotary(config)
        self.model = Decoder(config, rotary)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    @property
    def dtype(self) -> torch.dtype:
        """The dtype activations run in: the C forward's float32."""
        return torch.float32

    @property
    def device(self) -> torch.device:
        """Where it runs: the CPU."""
        return torch.device("cpu")

    def get_input_embeddings(self) -> nn.Module:
        """The token embedding."""
        return self.model.embed_tokens

    def get_output_embeddings(self) -> nn.Module:
        """The output projection."""
        return self.lm_head

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Not callable: the engine's C forward (native_forward.NativeForward) runs it."""
        raise TypeError(
            "a NativeModel has no forward of its own; the engine's C forward runs it "
            "(load with weights 'float' for transformers' model)"
        )
