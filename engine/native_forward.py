"""The engine's own CPU forward for Llama-family models whose GGUF weights are read in place.

transformers' modules spend a Python call and a framework dispatch per operation, and at one
decoding sequence that is a large share of a step (55% on the bundled 135M model). For the
architectures whose layer is plain Llama (Llama/SmolLM2, Mistral, Qwen2, Qwen3) and whose
matrices are GGUF in place, :class:`NativeForward` hands the whole step to
kernels/cpu_forward.c: the same kernels, norms, rotary embedding and attention, in one call.
transformers' model stays what it is: the exactness oracle in the tests, the rotary module
that works out cos and sin (every rope scaling it knows), and the path for everything else.
"""

from __future__ import annotations

from typing import Any

import torch

from paged_llm.kernels import cpu_forward, gguf_kernels

from . import native_model
from .gguf_model import GGUFEmbedding, GGUFLinear


class NativeForward:
    """One model's layers and KV pools as the C forward reads them."""

    def __init__(self, model: Any, kv_caches: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Describe the model to the kernel; ValueError naming what it cannot run."""
        config = model.config
        reason = _refusal(model)
        if reason is not None:
            raise ValueError(reason)
        decoder = model.model
        self._rotary = decoder.rotary_emb
        self._static = getattr(self._rotary, "rope_type", None) in native_model.STATIC_ROPE
        self._table: tuple[torch.Tensor, torch.Tensor] | None = None
        first = decoder.layers[0].self_attn
        layers = [
            _layer(layer, keys, values, config, i)
            for i, (layer, (keys, values)) in enumerate(zip(decoder.layers, kv_caches, strict=True))
        ]
        self.decoder = cpu_forward.Decoder(
            _embedding(decoder.embed_tokens),
            layers,
            decoder.norm.weight,
            _linear(model.lm_head),
            heads=int(config.num_attention_heads),
            kv_heads=int(config.num_key_value_heads),
            head_dim=int(first.head_dim),
            eps=float(decoder.norm.variance_epsilon),
            scale=float(first.scaling),
        )

    @staticmethod
    def of(
        model: Any, kv_caches: list[tuple[torch.Tensor, torch.Tensor]]
    ) -> tuple[NativeForward | None, str]:
        """The native forward of a model (None when it cannot run it), and a line saying so."""
        # The model's own refusal first: asking for the library compiles it, which a model
        # the forward can never run should not pay for.
        reason = _refusal(model) or cpu_forward.unavailable()
        if reason is None:
            try:
                return NativeForward(model, kv_caches), "the engine's C forward"
            except ValueError as err:
                reason = str(err)
        return None, f"transformers' forward ({reason})"

    @staticmethod
    def max_threads() -> int:
        """The threads a step may run on (OMP_NUM_THREADS, else the usable cores)."""
        return cpu_forward.max_threads()

    def forward(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        seqs: torch.Tensor,
        slots: torch.Tensor,
        tables: torch.Tensor,
        keep: torch.Tensor,
        threads: int = 0,
    ) -> torch.Tensor:
        """Float32 logits of the kept rows of one packed step (see cpu_forward.Decoder)."""
        cos, sin = self._cos_sin(positions)
        return self.decoder.forward(ids, positions, seqs, slots, tables, cos, sin, keep, threads)

    def _cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The rotary cos and sin ``[rows, head_dim]`` of each position, from the model's module.

        A static kind is looked up in a table the module filled (each position's values are
        the same products whatever else is in the call), grown as positions grow.
        """
        if not self._static:
            cos, sin = self._rotary(_PROBE, positions.unsqueeze(0))
            return cos[0], sin[0]
        need = int(positions.max()) + 1 if positions.numel() else 1
        if self._table is None or self._table[0].shape[0] < need:
            size = max(1024, 1 << (need - 1).bit_length())
            cos, sin = self._rotary(_PROBE, torch.arange(size).unsqueeze(0))
            self._table = (cos[0].contiguous(), sin[0].contiguous())
        return self._table[0][positions], self._table[1][positions]


# What the rotary module reads of its input: the dtype and device of cos and sin.
_PROBE = torch.empty(0, dtype=torch.float32)


def _refusal(model: Any) -> str | None:
    """Why the C forward cannot run this model, or None when it can."""
    reason = native_model.refusal(model.config)
    if reason is not None:
        return reason
    if model.dtype != torch.float32 or model.device.type != "cpu":
        return f"a {model.dtype} model on {model.device.type}"
    if not isinstance(model.lm_head, GGUFLinear):
        return "the output head is not a GGUF matrix read in place"
    for layer in model.model.layers:
        if not all(isinstance(m, GGUFLinear) for m in _projections(layer)):
            return "a projection is not a GGUF matrix read in place"
    return None


def _projections(layer: Any) -> tuple[Any, ...]:
    """A layer's seven projections, in cf_layer's order."""
    attn, mlp = layer.self_attn, layer.mlp
    return (
        attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj,
        mlp.gate_proj, mlp.up_proj, mlp.down_proj,
    )  # fmt: skip


def _linear(module: GGUFLinear) -> cpu_forward.Linear:
    """A GGUF linear layer as the kernel takes it."""
    return cpu_forward.Linear(module.matrix, module.bias, module.order)


def _embedding(module: Any) -> gguf_kernels.Matrix:
    """The token embedding as a matrix: kept in place, or a float32 table viewed as F32."""
    if isinstance(module, GGUFEmbedding):
        return module.matrix
    weight = module.weight.detach()
    if weight.dtype != torch.float32 or not weight.is_contiguous():
        raise ValueError(f"a {weight.dtype} embedding table")
    n, k = weight.shape
    return gguf_kernels.Matrix(weight.view(torch.uint8).reshape(-1), 0, n, k)


def _layer(
    layer: Any, keys: torch.Tensor, values: torch.Tensor, config: Any, index: int
) -> cpu_forward.Layer:
    """One decoder layer's weights and pools."""
    attn = layer.self_attn
    q, k, v, o, gate, up, down = (_linear(m) for m in _projections(layer))
    return cpu_forward.Layer(
        layer.input_layernorm.weight,
        layer.post_attention_layernorm.weight,
        q, k, v, o, gate, up, down,
        keys, values,
        window=_window(attn, config, index),
        q_norm=attn.q_norm.weight if hasattr(attn, "q_norm") else None,
        k_norm=attn.k_norm.weight if hasattr(attn, "k_norm") else None,
    )  # fmt: skip


def _window(attn: Any, config: Any, index: int) -> int | None:
    """The layer's sliding window as transformers' attention passes it (None: full)."""
    if config.model_type == "mistral":
        window = getattr(config, "sliding_window", None)
    else:
        window = getattr(attn, "sliding_window", None)
    return int(window) if window else None
