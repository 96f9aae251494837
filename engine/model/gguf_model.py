"""A GGUF file as a model whose weights stay in the file, in its own block formats.

The file is memory-mapped; every linear layer (and the token embedding) whose tensor has
a kernel reads its blocks where they lie in the mapping (kernels/cpu/src/gguf_kernels.c), so
nothing the size of the model is copied or written to disk. The small float tensors
(norms, biases) and any tensor no kernel reads are dequantized into memory with ``gguf``'s
own ``dequantize``, and transformers' tensor processor is applied to them as its GGUF
loader does. The only files kept are the model's config and tokenizer (parsing them out
of the file's metadata takes seconds; the kept copy loads in well under one). The model
is transformers' own, or, where the engine's C forward runs the architecture, a
native_model.NativeModel under the same names (no transformers model class imported).

llama.cpp stores Llama's query and key rows in its own order; transformers' processor
undoes that by moving rows. A kept matrix cannot move its rows, so its layer reorders
its outputs instead (the same values in the same places).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from paged_llm.engine.errors import ModelLoadError
from paged_llm.engine.model import gguf_file, native_model
from paged_llm.engine.model.architectures import check_supported
from paged_llm.engine.model.gguf_file import GGUFFile, TensorInfo
from paged_llm.engine.model.gguf_layers import GGUFEmbedding, GGUFLinear
from paged_llm.engine.model.gguf_transformers import config_and_tokenizer
from paged_llm.engine.model.memory import RUNTIME_BYTES, available_memory
from paged_llm.kernels.cpu import gguf_matmul as gguf_kernels

_LOGGER = logging.getLogger(__name__)


@dataclass(slots=True)
class GGUFModel:
    """What loading a GGUF file gives: the model, its tokenizer and how its weights are held."""

    model: Any
    tokenizer: Any
    dtype: torch.dtype
    # Tensor count per GGUF type name kept in place, and those dequantized into memory.
    kept: dict[str, int]
    dense: dict[str, int]


def check_memory(file: GGUFFile) -> None:
    """Refuse a file whose tensors cannot be held in the memory that is free."""
    need = file.n_bytes + RUNTIME_BYTES
    free = available_memory(torch.device("cpu"))
    if need > free:
        raise ModelLoadError(
            f"GGUF file {file.path} needs {need / 2**30:.1f} GiB with the runtime but only "
            f"{free / 2**30:.1f} GiB of memory is free; choose a smaller model or quantization"
        )


def load_gguf_model(
    gguf: Path,
    fit: Callable[[Any], torch.dtype],
    in_place: bool,
    cache_dir: Path | None,
    progress: Callable[[float], None] | None = None,
    native: bool = False,
) -> GGUFModel:
    """Build the model of a GGUF file; ``in_place`` keeps its quantized tensors where they lie.

    ``fit(config)`` gives the dtype of what is held in memory (and refuses a dense model
    that memory cannot hold). Without ``in_place`` every tensor is dequantized into memory
    (the exact float path). ``native`` (in place only) builds a NativeModel instead of
    transformers' model where the C forward runs the architecture: the caller has made
    sure the C forward is available. Every failure is a ModelLoadError naming the file
    and tensor. ``progress`` gets the done fraction of the tensors, 1.0 once they are all
    placed.
    """
    file = gguf_file.read(gguf)
    check_memory(file)
    config, tokenizer = config_and_tokenizer(gguf, cache_dir)
    check_supported(config)
    dtype = fit(config) if not in_place else torch.float32
    model = _skeleton(config, dtype, native=in_place and native)
    processor, names = _name_map(file, model)
    if in_place:
        refuse_unsupported(file, names)
    embedding = model.get_input_embeddings()
    embedding_name = next(n for n, m in model.named_modules() if m is embedding)
    plain_embedding = type(embedding) is torch.nn.Embedding and embedding.max_norm is None
    kept: dict[str, gguf_kernels.Matrix] = {}
    orders: dict[str, torch.Tensor] = {}
    dense: dict[str, torch.Tensor] = {}
    counts: tuple[dict[str, int], dict[str, int]] = ({}, {})
    for done, tensor in enumerate(file.tensors, 1):
        if progress is not None and done % 32 == 0:
            progress(done / len(file.tensors))
        hf_name = names.get(tensor.name)
        if hf_name is None:
            continue
        kind = tensor.type_name
        owner, _, attr = hf_name.rpartition(".")
        module = model.get_submodule(owner)
        linear = isinstance(module, torch.nn.Linear) or (
            owner == embedding_name and plain_embedding
        )
        if in_place and attr == "weight" and linear and kind in gguf_kernels.TYPES:
            kept[owner] = _matrix(file, tensor)
            order = _row_order(processor, tensor)
            if order is not None:
                orders[owner] = order
            counts[0][kind] = counts[0].get(kind, 0) + 1
        else:
            dense[hf_name] = _dequantized(file, processor, tensor, dtype)
            counts[1][kind] = counts[1].get(kind, 0) + 1
    if progress is not None:
        progress(1.0)
    for owner, matrix in kept.items():
        if owner == embedding_name:
            new: torch.nn.Module = GGUFEmbedding(matrix, dtype)
        else:
            new = GGUFLinear(matrix, dense.pop(f"{owner}.bias", None), orders.get(owner))
        _set_module(model, owner, new)
    model.load_state_dict(dense, strict=False, assign=True)
    if embedding_name in kept:
        _tie_head(model, kept[embedding_name])
    else:
        model.tie_weights()
    missing = [n for n, p in model.named_parameters() if p.is_meta]
    if missing:
        raise ModelLoadError(f"GGUF file {gguf} lacks the tensor(s) {', '.join(missing[:5])}")
    return GGUFModel(model, tokenizer, dtype, kept=counts[0], dense=counts[1])


def _skeleton(config: Any, dtype: torch.dtype, native: bool) -> Any:
    """The model of ``config`` with its weights on the meta device, for the loader to fill.

    A NativeModel where ``native`` asks and the C forward runs the architecture (no
    transformers model class imported: seconds of a start), else transformers' model.
    """
    if native and native_model.can_build(config):
        with torch.device("meta"):
            return native_model.NativeModel(config)
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    with init_empty_weights(include_buffers=False):
        return AutoModelForCausalLM.from_config(config, dtype=dtype)  # type: ignore[no-untyped-call]


def refuse_unsupported(file: GGUFFile, names: dict[str, str]) -> None:
    """Refuse a file with a mapped matrix in a type no kernel reads, naming the type."""
    for tensor in file.tensors:
        kind = tensor.type_name
        if tensor.name in names and len(tensor.shape) == 2 and kind not in gguf_kernels.TYPES:
            supported = ", ".join(gguf_kernels.TYPES)
            raise ModelLoadError(
                f"GGUF file {file.path} holds {tensor.name} as {kind}, which the engine has "
                f"no kernel for; it keeps {supported} in place (or set weights to 'float' "
                "to load the model dense)"
            )


def _name_map(file: GGUFFile, model: Any) -> tuple[Any, dict[str, str]]:
    """The tensor processor transformers uses for this architecture, and GGUF → model names.

    The names come from gguf's table for the architecture, built once (transformers'
    own mapping builds it again for every submodule: seconds per load).
    """
    from gguf import MODEL_ARCH_NAMES, get_tensor_name_map
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

    cfg = model.config
    processor = TENSOR_PROCESSORS.get(file.architecture, TensorProcessor)(  # type: ignore[no-untyped-call]
        config={
            "num_attention_heads": getattr(cfg, "num_attention_heads", None),
            "num_key_value_heads": getattr(cfg, "num_key_value_heads", None),
        }
    )
    arch = next((a for a, name in MODEL_ARCH_NAMES.items() if name == file.architecture), None)
    if arch is None:
        raise ModelLoadError(f"GGUF file {file.path}: unknown architecture {file.architecture}")
    table = get_tensor_name_map(arch, int(cfg.num_hidden_layers))
    names: dict[str, str] = {}
    for hf_name in model.state_dict():
        base, _, suffix = hf_name.rpartition(".")
        gguf_name = table.get_name(base) if suffix in ("weight", "bias") else None
        if gguf_name is not None:
            names[f"{gguf_name}.{suffix}"] = hf_name
    return processor, names


def _matrix(file: GGUFFile, tensor: TensorInfo) -> gguf_kernels.Matrix:
    """The tensor's blocks as a kernel matrix over the mapping (no copy)."""
    k, n = tensor.shape
    data = file.data(tensor)
    try:
        return gguf_kernels.Matrix(data, gguf_kernels.TYPES[tensor.type_name], n, k)
    except ValueError as err:
        raise ModelLoadError(f"GGUF file {file.path}, tensor {tensor.name}: {err}") from err


def _row_order(processor: Any, tensor: TensorInfo) -> torch.Tensor | None:
    """Which file row gives each model row, when the processor only moves rows; else None.

    The processor is run on the row numbers: a permutation of them is a reordering.
    """
    rows = int(tensor.shape[1])
    ids = np.arange(rows, dtype=np.float64).reshape(rows, 1)
    moved = np.asarray(processor.process(weights=ids, name=tensor.name).weights).reshape(-1)
    if moved.shape == (rows,) and np.array_equal(moved, np.arange(rows)):
        return None
    if moved.shape != (rows,) or not np.array_equal(np.sort(moved), np.arange(rows)):
        raise ModelLoadError(
            f"tensor {tensor.name}: transformers changes its values on load, which a "
            "matrix kept in place cannot do; set weights to 'float'"
        )
    return torch.from_numpy(moved.astype(np.int64))


def _dequantized(
    file: GGUFFile, processor: Any, tensor: TensorInfo, dtype: torch.dtype
) -> torch.Tensor:
    """The tensor dequantized into memory and processed as transformers' loader does."""
    from gguf import GGMLQuantizationType, dequantize

    raw = file.data(tensor)
    if tensor.type_name == "F32":
        raw = raw.view(np.float32)
    elif tensor.type_name == "F16":
        raw = raw.view(np.float16)
    shape = tuple(reversed(tensor.shape))  # rows first, as numpy and torch hold them
    try:
        kind = GGMLQuantizationType(int(tensor.type))
        values = dequantize(raw.reshape(*shape[:-1], -1), kind).reshape(shape)
    except NotImplementedError as err:
        raise ModelLoadError(
            f"GGUF file {file.path}: {tensor.name} is {tensor.type_name}, which gguf "
            "cannot dequantize"
        ) from err
    values = processor.process(weights=values, name=tensor.name).weights
    return torch.from_numpy(np.ascontiguousarray(values)).to(dtype)


def _tie_head(model: Any, embedding: gguf_kernels.Matrix) -> None:
    """A tied output projection reads the kept embedding matrix too (held once)."""
    if not getattr(model.config, "tie_word_embeddings", False):
        return
    head = model.get_output_embeddings()
    if isinstance(head, torch.nn.Linear) and head.weight.is_meta:
        name = next(n for n, m in model.named_modules() if m is head)
        _set_module(model, name, GGUFLinear(embedding, head.bias))


def _set_module(model: Any, name: str, module: torch.nn.Module) -> None:
    """Replace the submodule at a dotted name."""
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, module)
