"""Tiny GGUF files for the loader's tests: a real architecture's tensors in chosen formats.

The 32-value formats are quantized from the model's own weights with ``gguf``'s
quantizer; the K-quants (which ``gguf`` cannot quantize) are random, valid blocks. Either
way the file is the truth: tests compare the engine's in-place model with the same file
loaded dense. llama.cpp's query/key row order is applied as its converter does, so the
loader's reordering is exercised. The config and tokenizer are put where the loader keeps
them, so the file needs only its tensors and architecture.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch

from tests.helpers.support import tiny_config, tokenizer_dir

QK = gguf.GGMLQuantizationType


def gguf_config(arch: str = "llama") -> Any:
    """A tiny config whose rows divide into K-quant blocks of 256 (hidden 256, MLP 512).

    Its weights are nearer a trained model's scale than the other tests' (0.05, not 0.3):
    a model that wide amplifies any rounding as no real one does.
    """
    config = tiny_config(arch, vocab_size=512)
    config.initializer_range = 0.05
    config.hidden_size, config.intermediate_size = 256, 512
    config.num_attention_heads, config.num_key_value_heads = 4, 2
    config.head_dim = 64
    if arch == "gemma3":
        # What a Gemma 3 GGUF file implies, as it has no keys for these (transformers and
        # llama.cpp take Gemma3TextConfig's defaults): a full layer after every five sliding
        # ones and queries scaled by 256 ** -0.5. The tiny config's own (alternating layers,
        # a scalar of 16) could not be read back from the file by the torch-free path.
        config.num_hidden_layers = 6
        config.layer_types = ["sliding_attention"] * 5 + ["full_attention"]
        config.query_pre_attn_scalar = 256
    return config


# Where each K-quant block keeps its fp16 scale d (and dmin), and a size for them that
# gives weights of about 0.05, as a trained model's: the codes times the sub-block
# scales reach about 256 (Q4_K), 512 (Q5_K), 1000 (Q6_K) or 12 (Q2_K).
_SCALES = {
    QK.Q4_K: ((0, 2), 2e-4),
    QK.Q5_K: ((0, 2), 1e-4),
    QK.Q6_K: ((208,), 5e-5),
    QK.Q2_K: ((80, 82), 4e-3),
}


def converter_llama3_table(
    base: float, dim: int, factor: float, low: float = 1.0, high: float = 4.0, old: int = 8192
) -> np.ndarray:
    """The rope_freqs table llama.cpp's convert_hf_to_gguf.py writes for Llama 3's scaling.

    Its LlamaModel.generate_extra_tensors, step by step in torch as it computes it.
    """
    freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    table: list[Any] = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            table.append(1)
        elif wavelen > old / low:
            table.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            table.append(1 / ((1 - smooth) / factor + smooth))
    return torch.tensor(table, dtype=torch.float32).numpy()


def random_blocks(kind: QK, rows: int, k: int, seed: int) -> np.ndarray:
    """Valid random blocks of a type: random bytes with finite fp16 scales of a sane size."""
    block, size = gguf.GGML_QUANT_SIZES[kind]
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, (rows, k // block, size), dtype=np.uint8)
    offsets, scale = _SCALES[kind]
    for at in offsets:
        values = rng.uniform(-scale, scale, (rows, k // block)).astype(np.float16)
        data[:, :, at : at + 2] = values.view(np.uint8).reshape(rows, k // block, 2)
    return data.reshape(rows, -1)


def _llama_order(weights: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's query/key row order (its converter's permutation)."""
    rows = weights.shape[0]
    return (
        weights.reshape(heads, 2, rows // heads // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def write_gguf(
    folder: Path,
    arch: str,
    kinds: dict[str, QK],
    cache_dir: Path,
    tied: bool = False,
    metadata: Callable[[gguf.GGUFWriter, Any], None] | None = None,
    rope: dict[str, Any] | None = None,
) -> Path:
    """Write a tiny ``arch`` model as ``folder/model.gguf``; ``kinds`` maps name parts to types.

    A matrix takes the type of the first key of ``kinds`` found in its GGUF name (``"*"``
    for the rest); 1-D tensors stay F32. ``tied``: the head is the embedding (no output
    tensor), as in every Gemma 2 file. ``metadata(writer, config)`` adds keys (a config, a
    vocabulary) to the file, which otherwise holds tensors only. ``rope``: rope scaling
    parameters for the model's config (Gemma 3: its global layers'); a llama3 one is also
    written as llama.cpp's converter writes it, a rope_freqs tensor. Returns the file's path.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from paged_llm.engine.model.cache_folder import cache_folder

    torch.manual_seed(0)
    config = gguf_config(arch)
    config.tie_word_embeddings = tied or config.tie_word_embeddings
    if rope is not None:
        kinds = config.rope_parameters
        config.rope_parameters = (
            {**kinds, "full_attention": rope} if "full_attention" in kinds else rope
        )
    model = AutoModelForCausalLM.from_config(config)
    arch_name = {"llama": "llama", "qwen2": "qwen2", "gemma2": "gemma2", "gemma3": "gemma3"}[arch]
    table = gguf.get_tensor_name_map(
        next(a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == arch_name),
        config.num_hidden_layers,
    )
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "model.gguf"
    writer = gguf.GGUFWriter(path, arch_name)
    for seed, (hf_name, tensor) in enumerate(model.state_dict().items()):
        base, _, suffix = hf_name.rpartition(".")
        if hf_name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        name = f"{table.get_name(base)}.{suffix}"
        values = tensor.float().numpy()
        if arch.startswith("gemma") and "norm" in name:
            # llama.cpp's converter stores Gemma's norms as 1 + w (the loader takes 1 off);
            # each its own weights, as a trained model's, so a mix-up shows
            values = 1.0 + values + 0.3 * np.random.default_rng(seed).standard_normal(values.shape)
            values = values.astype(np.float32)
        if arch == "llama" and (".attn_q." in name or ".attn_k." in name):
            heads = config.num_attention_heads if ".attn_q." in name else config.num_key_value_heads
            values = _llama_order(values, heads)
        kind = next((t for part, t in kinds.items() if part in name), kinds.get("*", QK.F32))
        if values.ndim == 1 or kind == QK.F32:
            writer.add_tensor(name, np.ascontiguousarray(values))
        elif kind in (QK.Q4_K, QK.Q5_K, QK.Q6_K, QK.Q2_K):
            blocks = random_blocks(kind, values.shape[0], values.shape[1], seed)
            writer.add_tensor(name, blocks, raw_dtype=kind)
        else:
            writer.add_tensor(name, gguf.quants.quantize(values, kind), raw_dtype=kind)
    if rope is not None and rope["rope_type"] == "llama3":
        table = converter_llama3_table(rope["rope_theta"], config.head_dim, rope["factor"])
        writer.add_tensor("rope_freqs.weight", table)
    if metadata is not None:
        metadata(writer, config)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    kept = cache_folder(path, cache_dir)
    config.save_pretrained(kept)
    AutoTokenizer.from_pretrained(tokenizer_dir()).save_pretrained(kept)
    return path
