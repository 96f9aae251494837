"""A GGUF file as a model whose weights stay in the file, in its own block formats.

The file is memory-mapped; every linear layer (and the token embedding) whose tensor has
a kernel reads its blocks where they lie in the mapping (kernels/gguf_kernels.c), so
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

import contextlib
import copy
import hashlib
import logging
import os
import tempfile
import threading
from collections.abc import Callable, Container, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from paged_llm.kernels import gguf_kernels

from . import gguf_file, native_model
from .architectures import check_supported
from .errors import ModelLoadError
from .gguf_file import GGUFFile, TensorInfo
from .gguf_metadata import MetadataReader, Unreadable, passing_parsed
from .memory import RUNTIME_BYTES, available_memory

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


class GGUFLinear(torch.nn.Module):
    """A linear layer whose weight is a GGUF matrix read in place by the engine's kernels.

    Activations are multiplied in float32 after being rounded to 8 bits per block (as
    llama.cpp does); the output goes back to the input's dtype.
    """

    bias: torch.Tensor | None
    order: torch.Tensor | None

    def __init__(
        self,
        matrix: gguf_kernels.Matrix,
        bias: torch.Tensor | None = None,
        order: torch.Tensor | None = None,
    ) -> None:
        """Keep the matrix; ``order[i]`` is the file row that gives output ``i`` (or None)."""
        super().__init__()
        self.matrix = matrix
        self.in_features, self.out_features = matrix.k, matrix.n
        self.register_buffer("bias", bias)
        self.register_buffer("order", order)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ W.T + b`` for any leading shape."""
        flat = x.reshape(-1, self.in_features)
        out = self.matrix.linear(flat if flat.dtype == torch.float32 else flat.float())
        if self.order is not None:
            out = out.index_select(1, self.order)
        if self.bias is not None:
            out = out + self.bias
        return out.to(x.dtype).reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        """Shown by print(model)."""
        kind = gguf_kernels.type_name(self.matrix.type_id)
        return f"in={self.in_features}, out={self.out_features}, {kind} in place"


class GGUFEmbedding(torch.nn.Module):
    """A token embedding read in place from a GGUF matrix: looked-up rows are dequantized."""

    def __init__(self, matrix: gguf_kernels.Matrix, dtype: torch.dtype) -> None:
        """Keep the ``[vocab, dim]`` matrix; rows come out in ``dtype``."""
        super().__init__()
        self.matrix = matrix
        self.num_embeddings, self.embedding_dim = matrix.n, matrix.k
        self.dtype = dtype

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """The embeddings of ``ids`` (int64 or int32, as torch.nn.Embedding takes), any shape."""
        # transformers' continuous batching passes int32 ids; the kernel reads int64.
        rows = self.matrix.rows(ids.reshape(-1).to(torch.int64))
        return rows.to(self.dtype).reshape(*ids.shape, self.embedding_dim)

    def extra_repr(self) -> str:
        """Shown by print(model)."""
        kind = gguf_kernels.type_name(self.matrix.type_id)
        return f"{self.num_embeddings}, {self.embedding_dim}, {kind} in place"


def cache_folder(gguf: Path, cache_dir: Path) -> Path:
    """Where the file's config and tokenizer are kept, keyed by the file's identity."""
    stat = gguf.stat()
    key = f"{gguf.resolve()}:{stat.st_size}:{stat.st_mtime_ns}:config+tokenizer"
    return cache_dir / f"{gguf.stem}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def config_and_tokenizer(gguf: Path, cache_dir: Path | None) -> tuple[Any, Any]:
    """The model config and tokenizer of a GGUF file, kept in ``cache_dir`` when given."""
    from transformers import AutoConfig, AutoTokenizer

    folder = cache_folder(gguf, cache_dir) if cache_dir is not None else None
    if folder is not None and (folder / "config.json").is_file():
        return (
            AutoConfig.from_pretrained(folder, local_files_only=True),
            AutoTokenizer.from_pretrained(folder, local_files_only=True),
        )
    with _metadata_parsed_once():
        config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
        check_supported(config)  # before the slower tokenizer
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    if folder is not None:
        from .loader import publish_folder

        folder.parent.mkdir(parents=True, exist_ok=True)
        # A folder of this process's own: two processes may read the same file at once.
        tmp = Path(tempfile.mkdtemp(prefix=folder.name + ".partial-", dir=folder.parent))
        config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        publish_folder(tmp, folder)
    return config, tokenizer


# One first-time conversion at a time: two at once could each restore the other's patch.
_PARSE_LOCK = threading.Lock()
# Arrays this long go to load_gguf_checkpoint parsed whole: a vocabulary's, never a
# config's (whose one-item arrays would parse to their item, not a list).
_LONG_ARRAY = 1024
_ATOMS = (str, int, float, bool, type(None))


@contextlib.contextmanager
def _metadata_parsed_once() -> Iterator[None]:
    """Within it, transformers takes a GGUF file's metadata from one parse however often it asks.

    AutoConfig and AutoTokenizer read the file's metadata four times: three through
    transformers' ``read_gguf_metadata`` (the config's and the tokenizer's architecture
    checks, then the vocabulary and merges, which its numpy map reads a string at a time:
    0.3 s of a first start for a 49k-token vocabulary) and, for the architectures its fast
    config reader does not cover (llama, qwen2), one ``load_gguf_checkpoint`` through gguf's
    GGUFReader. Here all of them take their fields from one parse by the engine's
    MetadataReader (the same fields, a tenth of the time), ``load_gguf_checkpoint`` gets
    the vocabulary's arrays already parsed (it would parse them an item per call: 0.6 s
    for a 151k-token vocabulary) and a second call gets a copy of the first's result, so
    config and tokenizer are exactly what transformers builds alone. What MetadataReader
    cannot read (a big-endian file), calls that read tensors, and a transformers without
    these functions go through unchanged.
    """
    from transformers import modeling_gguf_pytorch_utils

    gguf_utils: Any = modeling_gguf_pytorch_utils  # its function is replaced for a while
    original = getattr(gguf_utils, "load_gguf_checkpoint", None)
    parse_item = getattr(gguf_utils, "_gguf_parse_value", None)
    import gguf

    gguf_module: Any = gguf  # its reader class is replaced for one parse at a time
    reader = gguf_module.GGUFReader
    readers = _metadata_readers()
    parsed: dict[str, MetadataReader] = {}
    checkpoints: dict[str, Any] = {}

    def parse(path: Any) -> MetadataReader:
        """The file's one MetadataReader (Unreadable where it cannot read the file)."""
        key = os.path.realpath(path)
        if key not in parsed:
            parsed[key] = MetadataReader(path)
        return parsed[key]

    def parsed_fields(path: Any, *args: Any, **kwargs: Any) -> Any:
        """GGUFReader(path)'s fields from the one parse, long arrays parsed whole; else gguf's."""
        try:
            fields = parse(path)
            # Parsed whole only where the item parse that passes them on replaces its own.
            return fields.parsed(_LONG_ARRAY) if parse_item is not None else fields
        except Unreadable:
            return reader(path, *args, **kwargs)

    def load_once(path: Any, return_tensors: bool = False, *args: Any, **kwargs: Any) -> Any:
        """load_gguf_checkpoint, its metadata-only result kept per file; a copy per call."""
        assert original is not None  # put in place only where transformers has it
        if return_tensors or args or kwargs:
            return original(path, return_tensors, *args, **kwargs)
        key = os.path.realpath(path)
        if key not in checkpoints:
            gguf_module.GGUFReader = parsed_fields  # transformers imports it per call
            if parse_item is not None:
                gguf_utils._gguf_parse_value = passing_parsed(parse_item)
            try:
                checkpoints[key] = original(path, return_tensors=False)
            finally:
                gguf_module.GGUFReader = reader
                if parse_item is not None:
                    gguf_utils._gguf_parse_value = parse_item
        # A copy per caller, the first included: a caller may change the dicts it gets.
        return _copied(checkpoints[key])

    def read_metadata(path: Any, string_arrays: Container[str] = ()) -> Any:
        """What transformers' read_gguf_metadata(path, string_arrays) gives, from the one parse."""
        try:
            parsed_file = parse(path)
        except Unreadable:
            return readers[0][1](path, string_arrays)
        return parsed_file.values(string_arrays), tuple(t.name for t in parsed_file.tensors)

    with _PARSE_LOCK:
        if original is not None:
            gguf_utils.load_gguf_checkpoint = load_once
        for module, _ in readers:
            module.read_gguf_metadata = read_metadata
        try:
            yield
        finally:
            if original is not None:
                gguf_utils.load_gguf_checkpoint = original
            for module, function in readers:
                module.read_gguf_metadata = function


def _copied(value: Any) -> Any:
    """A deep copy of a checkpoint's dicts and lists of plain values (copy.deepcopy's result).

    deepcopy visits every item of a vocabulary and its merges (0.2 s of a first start); a
    list of only strings and numbers is copied whole here.
    """
    if type(value) is dict:
        return {key: _copied(item) for key, item in value.items()}
    if type(value) is list:
        if all(type(item) in _ATOMS for item in value):
            return list(value)
        return [_copied(item) for item in value]
    if type(value) in _ATOMS:
        return value
    return copy.deepcopy(value)


def _metadata_readers() -> list[tuple[Any, Callable[..., Any]]]:
    """The transformers modules that give ``read_gguf_metadata``, each with that function."""
    try:
        from transformers.integrations import gguf as package
        from transformers.integrations.gguf import reader
    except ImportError:
        return []
    # The package re-exports the reader's function: configuration_utils imports it from there.
    return [(module, module.read_gguf_metadata) for module in (reader, package)]


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
    data = torch.from_numpy(file.data(tensor))
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
    from gguf import dequantize

    raw = file.data(tensor)
    if tensor.type_name == "F32":
        raw = raw.view(np.float32)
    elif tensor.type_name == "F16":
        raw = raw.view(np.float16)
    shape = tuple(reversed(tensor.shape))  # rows first, as numpy and torch hold them
    try:
        values = dequantize(raw.reshape(*shape[:-1], -1), tensor.type).reshape(shape)
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
