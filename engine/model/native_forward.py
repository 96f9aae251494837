"""The engine's own CPU forward for Llama- and Gemma-family models with GGUF weights in place.

transformers' modules spend a Python call and a framework dispatch per operation, and at one
decoding sequence that is a large share of a step (55% on the bundled 135M model). For the
architectures whose layer is plain Llama (Llama/SmolLM2, Mistral, Qwen2, Qwen3) or Gemma's
(Gemma 2, Gemma 3 text) and whose matrices are GGUF in place, :class:`NativeForward` hands
the whole step to kernels/cpu/src/cpu_forward.c: the same kernels, norms, rotary embedding and
attention, in one call.
transformers' model stays what it is: the exactness oracle in the tests, the rotary module
that works out cos and sin (every rope scaling it knows), and the path for everything else.
The C forward's binding takes numpy arrays; this class is the torch path's edge to it and
hands over views of its tensors (``Tensor.numpy()``, ``torch.from_numpy``): the C call
reads and writes the same memory as before, so the bits are the same.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from paged_llm.engine.errors import UnsupportedModelError
from paged_llm.engine.model import native_model, rope
from paged_llm.engine.model.gguf_layers import GGUFEmbedding, GGUFLinear
from paged_llm.kernels.cpu import forward as cpu_forward
from paged_llm.kernels.cpu import gguf_matmul as gguf_kernels


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
        # Gemma 3's module takes a layer type: its full layers' table, then its sliding ones'.
        kinds = list(native_model.rope_kinds(config))
        self._types = (
            sorted(kinds, key=lambda t: t != "full_attention") if None not in kinds else []
        )
        rope_types = getattr(self._rotary, "rope_type", None)
        types = rope_types.values() if isinstance(rope_types, dict) else [rope_types]
        self._static = all(t in native_model.STATIC_ROPE for t in types)
        self._tables: dict[str | None, tuple[torch.Tensor, torch.Tensor]] = {}
        # rope.py's tables where it computes the kind: the numpy runner's own, so the two
        # CPU paths hand the C forward the same bits (transformers' module may differ by an
        # ulp in places, see rope.py); else the model's rotary module.
        self._numpy = _numpy_tables(config, self._types)
        first = decoder.layers[0].self_attn
        gemma = config.model_type in native_model.GEMMA
        main = self._types[0] if self._types else None
        pool = kv_caches[0][0] if kv_caches else None
        layers = [
            _layer(layer, keys, values, config, i, main)
            for i, (layer, (keys, values)) in enumerate(zip(decoder.layers, kv_caches, strict=True))
        ]
        self.decoder = cpu_forward.Decoder(
            _embedding(decoder.embed_tokens),
            layers,
            _norm(decoder.norm, config),
            _linear(model.lm_head),
            heads=int(config.num_attention_heads),
            kv_heads=int(config.num_key_value_heads),
            head_dim=int(first.head_dim),
            eps=float(_eps(decoder.norm)),
            scale=float(first.scaling),
            activation="gelu_tanh" if gemma else "silu",
            # transformers multiplies by the float32 value of sqrt(hidden)
            embed_scale=float(torch.tensor(config.hidden_size**0.5)) if gemma else None,
            softcap=getattr(config, "attn_logit_softcapping", None) if gemma else None,
            final_softcap=getattr(config, "final_logit_softcapping", None) if gemma else None,
            kv_dtype=str(pool.dtype).removeprefix("torch.") if pool is not None else None,
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
        # Views of the tensors: the C call reads and writes the same memory.
        ids_, positions_, seqs_, slots_, tables_, keep_ = (
            t.numpy() for t in (ids, positions, seqs, slots, tables, keep)
        )
        # Gemma 3: the full layers' table, then the sliding layers' one; else one for all
        rotary = [self._cos_sin(positions, t) for t in self._types]
        (cos, sin), *rest = rotary or [self._cos_sin(positions, None)]
        local = (rest[0][0].numpy(), rest[0][1].numpy()) if rest else None
        logits = self.decoder.forward(
            ids_, positions_, seqs_, slots_, tables_, cos.numpy(), sin.numpy(), keep_, threads,
            local,
        )  # fmt: skip
        return torch.from_numpy(logits)

    def _cos_sin(
        self, positions: torch.Tensor, layer_type: str | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The rotary cos and sin ``[rows, head_dim]`` of each position, from the model's module.

        A static kind is looked up in a table the module filled (each position's values are
        the same products whatever else is in the call), grown as positions grow.
        """
        if self._numpy is not None:
            cos_np, sin_np = self._numpy[layer_type].lookup(positions.numpy())
            return torch.from_numpy(cos_np), torch.from_numpy(sin_np)
        by_type = () if layer_type is None else (layer_type,)
        if not self._static:
            cos, sin = self._rotary(_PROBE, positions.unsqueeze(0), *by_type)
            return cos[0], sin[0]
        need = int(positions.max()) + 1 if positions.numel() else 1
        table = self._tables.get(layer_type)
        if table is None or table[0].shape[0] < need:
            size = max(1024, 1 << (need - 1).bit_length())
            cos, sin = self._rotary(_PROBE, torch.arange(size).unsqueeze(0), *by_type)
            table = self._tables[layer_type] = (cos[0].contiguous(), sin[0].contiguous())
        return table[0][positions], table[1][positions]


def _numpy_tables(
    config: Any, types: list[str | None]
) -> dict[str | None, rope.RotaryTables] | None:
    """rope.py's tables of each layer type (``types``, else one for all), or None.

    None where rope.py does not compute a kind (YaRN, length-dependent ones): the model's
    rotary module gives the tables then.
    """
    kinds = native_model.rope_kinds(config)
    found: dict[str | None, rope.RotaryTables] = {}
    keys: list[str | None] = types or [None]
    for key in keys:
        params = kinds.get(key) or {}
        kind = params.get("rope_type", "default")
        if kind not in rope.KINDS or "rope_theta" not in params:
            return None
        try:
            settings = rope.Rope(
                rope_theta=float(params["rope_theta"]),
                head_dim=native_model.head_dim(config),
                rope_type=kind,
                factor=float(params.get("factor", 1.0)),
                low_freq_factor=params.get("low_freq_factor"),
                high_freq_factor=params.get("high_freq_factor"),
                original_max_position_embeddings=params.get("original_max_position_embeddings"),
            )
        except UnsupportedModelError:
            return None
        found[key] = rope.RotaryTables(settings)
    return found


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
    bias, order = module.bias, module.order
    return cpu_forward.Linear(
        module.matrix,
        _array(bias) if bias is not None else None,
        _array(order) if order is not None else None,
    )


def _array(tensor: torch.Tensor) -> np.ndarray:
    """A CPU tensor as a numpy array over the same memory (the binding keeps it referenced)."""
    return tensor.detach().numpy()


def _pool(tensor: torch.Tensor) -> np.ndarray:
    """A KV pool as the binding takes it: its own dtype, or bfloat16's bits as uint16.

    numpy has no bfloat16; the Decoder is told the pool's dtype (kv_dtype) instead.
    """
    if tensor.device.type != "cpu":
        raise ValueError(f"a KV pool on {tensor.device.type}")
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(np.uint16)
    return tensor.numpy()


def _embedding(module: Any) -> gguf_kernels.Matrix:
    """The token embedding as a matrix: kept in place, or a float32 table viewed as F32."""
    if isinstance(module, GGUFEmbedding):
        return module.matrix
    weight = module.weight.detach()
    if weight.dtype != torch.float32 or not weight.is_contiguous():
        raise ValueError(f"a {weight.dtype} embedding table")
    n, k = weight.shape
    return gguf_kernels.Matrix(weight.numpy().view(np.uint8).reshape(-1), 0, n, k)


def _layer(
    layer: Any, keys: torch.Tensor, values: torch.Tensor, config: Any, index: int, main: str | None
) -> cpu_forward.Layer:
    """One decoder layer's weights and pools.

    ``main`` is the layer type of the step's first rotary table; the others take its second.
    """
    attn = layer.self_attn
    q, k, v, o, gate, up, down = (_linear(m) for m in _projections(layer))
    gemma = config.model_type in native_model.GEMMA
    return cpu_forward.Layer(
        _norm(layer.input_layernorm, config),
        # Llama's norm before the MLP is post_attention_layernorm; Gemma's comes after it
        _norm(layer.pre_feedforward_layernorm if gemma else layer.post_attention_layernorm, config),
        q, k, v, o, gate, up, down,
        _pool(keys), _pool(values),
        window=_window(attn, config, index),
        q_norm=_norm(attn.q_norm, config) if hasattr(attn, "q_norm") else None,
        k_norm=_norm(attn.k_norm, config) if hasattr(attn, "k_norm") else None,
        post_attn_norm=_norm(layer.post_attention_layernorm, config) if gemma else None,
        post_ffn_norm=_norm(layer.post_feedforward_layernorm, config) if gemma else None,
        local_rope=main is not None and config.layer_types[index] != main,
    )  # fmt: skip


def _norm(module: Any, config: Any) -> np.ndarray:
    """An RMS norm's weight as the C forward multiplies by it: Gemma's as 1 + w, in float32."""
    weight: torch.Tensor = module.weight.detach()
    if config.model_type in native_model.GEMMA:
        return _array(1.0 + weight.float())  # what transformers' Gemma norm multiplies by
    return _array(weight.float())


def _eps(module: Any) -> float:
    """An RMS norm's epsilon (Gemma's modules call it eps)."""
    return float(getattr(module, "variance_epsilon", None) or module.eps)


def _window(attn: Any, config: Any, index: int) -> int | None:
    """The layer's sliding window as transformers' attention passes it (None: full)."""
    if config.model_type == "mistral":
        window = getattr(config, "sliding_window", None)
    else:
        window = getattr(attn, "sliding_window", None)
    return int(window) if window else None
