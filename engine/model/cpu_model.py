"""A GGUF file loaded for the numpy runner: no torch, no transformers (issue 57).

The file is memory-mapped and its matrices are handed to the C forward in their own block
formats (kernels/cpu/forward.py), as the torch path's in-place GGUF load hands them; the
small tensors (norms, biases) are dequantized with gguf's numpy ``dequantize`` and prepared
as transformers' GGUF loader and NativeForward prepare them (Gemma's norms: ``w - 1`` on
load, ``1 + w`` for the kernel; Llama's Q and K rows in the order transformers undoes
llama.cpp's interleaving into), so both paths hand the kernel the same values. The config
comes from gguf_config.py, the tokenizer from gguf_tokenizer.py and the chat template from
chat_template.py, each equal to what transformers builds from the same file.

Whatever this path cannot run (an architecture, a tokenizer model or pre-tokenizer, a
template, a tensor type, no C compiler) is a ModelLoadError that names it and says that
``paged-llm[engine]`` (the torch path) runs the file.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from paged_llm.defaults import BUNDLED_PREFIX
from paged_llm.engine.config import DEFAULT_MODEL, EngineConfig
from paged_llm.engine.errors import ModelLoadError
from paged_llm.engine.model import gguf_file
from paged_llm.engine.model.bundled import bundled_file
from paged_llm.engine.model.ggml_types import GGMLType
from paged_llm.engine.model.gguf_config import GGUFConfig, config_of, rope_factors
from paged_llm.engine.model.gguf_metadata import MetadataReader, Unreadable
from paged_llm.engine.model.loaded import NUMPY, LoadedModel
from paged_llm.engine.model.memory import available_memory
from paged_llm.engine.model.progress import Progress, part
from paged_llm.engine.tokenizer import merges_cache
from paged_llm.extras import ENGINE_EXTRA
from paged_llm.kernels.cpu import forward as cpu_forward
from paged_llm.kernels.cpu import gguf_matmul as gguf_kernels

_LOGGER = logging.getLogger(__name__)

Floats = npt.NDArray[np.float32]
# Beside the mapped weights: Python, numpy, the tokenizer and a first KV pool.
RUNTIME_BYTES = 256 << 20
# The seven projections of a layer, by their GGUF names, in cpu_forward.Layer's order.
PROJECTIONS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


@dataclass(slots=True)
class LayerWeights:
    """One layer's weights as the C forward takes them (its pools come from the runner)."""

    attn_norm: Floats
    ffn_norm: Floats
    linears: tuple[cpu_forward.Linear, ...]  # PROJECTIONS' order: q, k, v, o, gate, up, down
    q_norm: Floats | None
    k_norm: Floats | None
    post_attn_norm: Floats | None
    post_ffn_norm: Floats | None


def _projections(
    weights: LayerWeights,
) -> tuple[
    cpu_forward.Linear,
    cpu_forward.Linear,
    cpu_forward.Linear,
    cpu_forward.Linear,
    cpu_forward.Linear,
    cpu_forward.Linear,
    cpu_forward.Linear,
]:
    """A layer's seven projections in cf_layer's order (q, k, v, o, gate, up, down)."""
    q, k, v, o, gate, up, down = weights.linears
    return q, k, v, o, gate, up, down


@dataclass(slots=True)
class CpuModel:
    """A mapped GGUF file's weights and config; :meth:`decoder` binds them to KV pools."""

    config: GGUFConfig
    file: gguf_file.GGUFFile
    embed: gguf_kernels.Matrix
    head: cpu_forward.Linear
    final_norm: Floats
    layers: list[LayerWeights]

    def decoder(self, pools: list[tuple[np.ndarray, np.ndarray]], kv_dtype: str) -> Any:
        """The C forward over these weights and ``pools`` (one K and V array per layer)."""
        config = self.config
        gemma = config.gemma
        local = config.local_rope is not None  # Gemma 3: its sliding layers' own table
        layers = [
            cpu_forward.Layer(
                weights.attn_norm,
                weights.ffn_norm,
                *_projections(weights),
                keys,
                values,
                window=config.window(i),
                q_norm=weights.q_norm,
                k_norm=weights.k_norm,
                post_attn_norm=weights.post_attn_norm,
                post_ffn_norm=weights.post_ffn_norm,
                local_rope=local and config.layer_types[i] != "full_attention",
            )
            for i, (weights, (keys, values)) in enumerate(zip(self.layers, pools, strict=True))
        ]
        return cpu_forward.Decoder(
            self.embed,
            layers,
            self.final_norm,
            self.head,
            heads=config.num_attention_heads,
            kv_heads=config.num_key_value_heads,
            head_dim=config.head_dim,
            eps=config.rms_norm_eps,
            scale=config.attention_scale,
            activation="gelu_tanh" if gemma else "silu",
            # transformers multiplies by the float32 value of sqrt(hidden)
            embed_scale=float(np.float32(config.hidden_size**0.5)) if gemma else None,
            softcap=config.attn_logit_softcapping if gemma else None,
            final_softcap=config.final_logit_softcapping if gemma else None,
            kv_dtype=kv_dtype,
        )


def gguf_path(model: str, cache_dir: Path | None = None) -> Path:
    """The GGUF file a model setting names, a bundled one fetched if need be; ModelLoadError."""
    source = model.strip() or DEFAULT_MODEL
    if source.startswith(BUNDLED_PREFIX):
        return bundled_file(source.removeprefix(BUNDLED_PREFIX), cache_dir)
    path = Path(source).expanduser()
    if not path.is_file():
        raise ModelLoadError(f"GGUF file {source} does not exist")
    return path


def _refusal(path: Path, what: str) -> ModelLoadError:
    """The error for a file this path cannot run, naming what and the path that can."""
    return ModelLoadError(
        f"GGUF file {path.name}: {what}, which the CPU runner without torch does not run; "
        f"{ENGINE_EXTRA} (the torch path) runs it"
    )


def kernels_dir(config: EngineConfig) -> Path | None:
    """Where the C kernels are built: the cache folder's kernels/, else their default."""
    return None if config.cache_dir is None else config.cache_dir / "kernels"


def tokenizers_dir(config: EngineConfig) -> Path | None:
    """Where derived tokenizer merges are kept: the cache folder's tokenizers/, else nowhere."""
    return None if config.cache_dir is None else config.cache_dir / merges_cache.FOLDER


def read_weights(
    path: Path,
    config: GGUFConfig,
    progress: Progress | None = None,
    metadata: MetadataReader | None = None,
) -> CpuModel:
    """Map the file and prepare every tensor the C forward reads (``metadata``: its header)."""
    file = gguf_file.read(path, metadata)
    need = file.n_bytes + RUNTIME_BYTES
    free = available_memory("cpu")
    if need > free:
        raise ModelLoadError(
            f"GGUF file {path} needs {need / 2**30:.1f} GiB with the runtime but only "
            f"{free / 2**30:.1f} GiB of memory is free; choose a smaller model or quantization"
        )
    tensors = {t.name: t for t in file.tensors}
    # llama.cpp interleaves each head's rotary halves of a llama file's Q and K rows;
    # transformers' loader undoes it (LlamaTensorProcessor), so output i is file row order[i].
    permuted = file.architecture == "llama"

    def matrix(name: str) -> gguf_kernels.Matrix:
        info = tensors.get(name)
        if info is None:
            raise ModelLoadError(f"GGUF file {path} lacks the tensor {name}")
        if info.type_name not in gguf_kernels.TYPES:
            raise _refusal(path, f"{name} is {info.type_name}")
        k, n = info.shape
        try:
            return gguf_kernels.Matrix(file.data(info), gguf_kernels.TYPES[info.type_name], n, k)
        except ValueError as err:
            raise ModelLoadError(f"GGUF file {path}, tensor {name}: {err}") from err

    def vector(name: str, norm: bool = False) -> Floats:
        info = tensors.get(name)
        if info is None:
            raise ModelLoadError(f"GGUF file {path} lacks the tensor {name}")
        values = _dequantized(file, info)
        if norm and config.gemma:
            # transformers loads w - 1 (Gemma2TensorProcessor); its norm multiplies by 1 + that
            values = np.float32(1.0) + (values - np.float32(1.0))
        return np.ascontiguousarray(values, dtype=np.float32)

    def linear(name: str, heads: int | None = None) -> cpu_forward.Linear:
        order = _interleave_order(tensors[f"{name}.weight"].shape[1], heads) if heads else None
        bias = vector(f"{name}.bias") if f"{name}.bias" in tensors else None
        if bias is not None and order is not None:
            bias = np.ascontiguousarray(bias[order])
        return cpu_forward.Linear(matrix(f"{name}.weight"), bias, order)

    def optional(name: str) -> Floats | None:
        return vector(name, norm=True) if name in tensors else None

    layers = []
    count = config.num_hidden_layers
    for i in range(count):
        blk = f"blk.{i}."
        heads = {
            "attn_q": config.num_attention_heads if permuted else None,
            "attn_k": config.num_key_value_heads if permuted else None,
        }
        linears = tuple(linear(blk + part, heads.get(part)) for part in PROJECTIONS)
        gemma = config.gemma
        layers.append(
            LayerWeights(
                attn_norm=vector(blk + "attn_norm.weight", norm=True),
                # Llama's norm before the MLP is ffn_norm; Gemma's too (pre_feedforward)
                ffn_norm=vector(blk + "ffn_norm.weight", norm=True),
                linears=linears,
                q_norm=optional(blk + "attn_q_norm.weight"),
                k_norm=optional(blk + "attn_k_norm.weight"),
                post_attn_norm=vector(blk + "post_attention_norm.weight", norm=True)
                if gemma
                else None,
                post_ffn_norm=vector(blk + "post_ffw_norm.weight", norm=True) if gemma else None,
            )
        )
        if progress is not None:
            progress((i + 1) / count)
    embed_info = tensors.get("token_embd.weight")
    if embed_info is None:
        raise ModelLoadError(f"GGUF file {path} lacks the tensor token_embd.weight")
    if embed_info.type_name in gguf_kernels.TYPES:
        embed = matrix("token_embd.weight")
    else:  # a type no kernel reads: a float32 table, as the torch path holds it
        table = _dequantized(file, embed_info).astype(np.float32)
        k, n = embed_info.shape
        embed = gguf_kernels.Matrix(table.view(np.uint8).reshape(-1), 0, n, k)
    head = (
        cpu_forward.Linear(embed)
        if config.tie_word_embeddings
        else cpu_forward.Linear(matrix("output.weight"))
    )
    final_norm = vector("output_norm.weight", norm=True)
    return CpuModel(config, file, embed, head, final_norm, layers)


def _interleave_order(rows: int, heads: int) -> npt.NDArray[np.int64]:
    """Which file row gives each model row of a llama file's Q or K (``heads`` of them)."""
    ids = np.arange(rows).reshape(heads, rows // heads // 2, 2)
    return ids.swapaxes(2, 1).reshape(-1).astype(np.int64)


def _dequantized(file: gguf_file.GGUFFile, info: gguf_file.TensorInfo) -> Floats:
    """A small tensor (a norm, a bias) as float32 values, as gguf's dequantize gives them."""
    raw = file.data(info)
    shape = tuple(reversed(info.shape))
    if info.type is GGMLType.F32:
        values = raw.view(np.float32).reshape(shape)
    elif info.type is GGMLType.F16:
        values = raw.view(np.float16).astype(np.float32).reshape(shape)
    else:
        # Only now: importing gguf costs a tenth of a first load (ggml_types).
        from gguf import GGMLQuantizationType, dequantize

        try:
            kind = GGMLQuantizationType(int(info.type))
            values = dequantize(raw.reshape(*shape[:-1], -1), kind).reshape(shape)
        except NotImplementedError as err:
            raise _refusal(file.path, f"{info.name} is {info.type_name}") from err
    return np.asarray(values, dtype=np.float32).reshape(-1) if len(shape) == 1 else values


def load_cpu_model(config: EngineConfig, progress: Progress | None = None) -> LoadedModel:
    """Load the configured GGUF file for the numpy runner; ModelLoadError naming a failure.

    Everything that can refuse the file (kernels, architecture, tokenizer, template, tensor
    types) runs here, before the engine accepts a request.
    """
    from paged_llm.engine.tokenizer.chat_template import ChatTemplate
    from paged_llm.engine.tokenizer.gguf_tokenizer import GGUFTokenizer, read_vocabulary

    path = gguf_path(config.model, config.cache_dir)
    if config.device not in ("auto", "cpu"):
        raise ModelLoadError(
            f"the CPU runner without torch runs on the CPU, not {config.device}; "
            f"{ENGINE_EXTRA} (the torch path) runs {path.name} there"
        )
    if progress is not None:
        progress(0.01)
    reason = cpu_forward.unavailable(kernels_dir(config))
    if reason is not None:
        raise ModelLoadError(
            f"the engine's C kernels cannot run here ({reason}); {ENGINE_EXTRA} (the torch "
            f"path) runs {path.name} without them"
        )
    if progress is not None:
        progress(0.1)
    try:
        reader = MetadataReader(path)
    except Unreadable as err:
        raise ModelLoadError(f"{path}: cannot read its GGUF metadata ({err})") from err
    except OSError as err:
        raise ModelLoadError(f"{path}: {err}") from err
    names = [t.name for t in reader.tensors]
    model_config = config_of(reader.values(), names, rope_factors(path, reader))
    weights = read_weights(path, model_config, part(progress, 0.1), reader)
    vocab = read_vocabulary(path, reader)
    tokenizer = GGUFTokenizer(vocab, path, tokenizers_dir(config))
    if model_config.ignored:
        _LOGGER.info(
            "%s: keys transformers ignores are ignored here too: %s",
            path.name,
            ", ".join(model_config.ignored),
        )
    special = {
        name: vocab.tokens[index]
        for name, index in vocab.special_ids.items()
        if 0 <= index < len(vocab.tokens)
    }
    name = config.model.strip() or DEFAULT_MODEL
    template = ChatTemplate(vocab.chat_template, special_tokens=special, model=path.name)
    # As the torch path's GGUF model: the tokenizer's eos and the end-of-turn tokens.
    stops = set(tokenizer.end_of_turn_ids)
    if tokenizer.eos_token_id is not None:
        stops.add(int(tokenizer.eos_token_id))
    context = model_config.max_position_embeddings
    # Counted as the torch path counts them: matrices kept in place, the rest in memory.
    counts: tuple[dict[str, int], dict[str, int]] = ({}, {})
    for info in weights.file.tensors:
        held = counts[0 if len(info.shape) == 2 and info.type_name in gguf_kernels.TYPES else 1]
        held[info.type_name] = held.get(info.type_name, 0) + 1
    kept, dense = (", ".join(f"{n} {kind}" for kind, n in sorted(c.items())) for c in counts)
    text = f"gguf in place ({kept} tensors on {gguf_kernels.vector_path()} kernels"
    text += f"; {dense} in memory)" if dense else ")"
    return LoadedModel(
        model=weights,
        tokenizer=tokenizer,
        name=name,
        device="cpu",
        dtype="float32",
        max_model_len=context,
        context_limit=f"the model's context of {context} tokens",
        eos_token_ids=tuple(sorted(stops)),
        weights=text,
        attention="C kernels in place (decodes in spans, prompt rows in tiles)",
        runner=NUMPY,
        chat_template=template,
    )
