"""A GGUF file's tensor table and architecture, read without parsing its vocabulary.

``gguf``'s GGUFReader builds a numpy view of every item of every metadata array: for a
49,152-token vocabulary that took 2.5-4 s, and more for 150k-token ones, before one
tensor is found. Loading needs only the architecture name and the tensor table, so this
reader walks the metadata by lengths alone (well under a second) and maps the file once.
The format is GGUF v2/v3 as the ``gguf`` package documents it; types and block sizes
come from that package.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from .errors import ModelLoadError

_MAGIC = b"GGUF"
# Metadata value types: fixed sizes of the scalar ones (GGUF's numbering).
_SCALAR_SIZE = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9
_ALIGNMENT_KEY = "general.alignment"


@dataclass(slots=True, frozen=True)
class TensorInfo:
    """One tensor of the file: where its bytes lie and how to read them."""

    name: str
    type: GGMLQuantizationType
    # GGUF's order: the row length first ([k, n] for a matrix of n rows of k values).
    shape: tuple[int, ...]
    offset: int
    n_bytes: int

    @property
    def type_name(self) -> str:
        """The GGUF type's name (Q4_K, F32, ...)."""
        return self.type.name


@dataclass(slots=True)
class GGUFFile:
    """A GGUF file mapped copy-on-write, with its architecture and tensor table."""

    path: Path
    architecture: str
    tensors: list[TensorInfo]
    mapping: np.memmap

    def data(self, tensor: TensorInfo) -> np.ndarray:
        """The tensor's bytes in the mapping (no copy)."""
        return self.mapping[tensor.offset : tensor.offset + tensor.n_bytes]

    @property
    def n_bytes(self) -> int:
        """Bytes of all tensors together."""
        return sum(t.n_bytes for t in self.tensors)


def read(path: Path) -> GGUFFile:
    """Read the file's table and map it; a damaged or truncated file is a ModelLoadError."""
    try:
        with path.open("rb") as file:
            architecture, tensors, data_start = _read_header(file)
        size = path.stat().st_size
        placed = [_placed(t, data_start) for t in tensors]
        for tensor in placed:
            if tensor.offset + tensor.n_bytes > size:
                raise ValueError(
                    f"tensor {tensor.name} ends at byte {tensor.offset + tensor.n_bytes} but "
                    f"the file has {size} (truncated?)"
                )
        # Copy-on-write: torch wants writable memory; nothing ever writes to it.
        mapping = np.memmap(path, dtype=np.uint8, mode="c")
    except (OSError, ValueError, struct.error, UnicodeDecodeError, KeyError) as err:
        raise ModelLoadError(f"GGUF file {path} cannot be read: {err}") from err
    return GGUFFile(path, architecture, placed, mapping)


def _read_header(file: BinaryIO) -> tuple[str, list[TensorInfo], int]:
    """(architecture, tensors with offsets relative to the data, data start)."""
    if file.read(4) != _MAGIC:
        raise ValueError("not a GGUF file (no GGUF magic at its start)")
    version, n_tensors, n_kv = struct.unpack("<IQQ", file.read(20))
    if version not in (2, 3):
        raise ValueError(f"GGUF version {version} is not supported (2 or 3 are)")
    architecture = ""
    alignment = 32
    for _ in range(n_kv):
        key = _string(file)
        (kind,) = struct.unpack("<I", file.read(4))
        if key == "general.architecture" and kind == _STRING:
            architecture = _string(file)
        elif key == _ALIGNMENT_KEY and kind == 4:
            (alignment,) = struct.unpack("<I", file.read(4))
        else:
            _skip(file, kind)
    if not architecture:
        raise ValueError("the file names no general.architecture")
    tensors = []
    for _ in range(n_tensors):
        name = _string(file)
        (dims,) = struct.unpack("<I", file.read(4))
        shape = struct.unpack(f"<{dims}Q", file.read(8 * dims))
        kind, offset = struct.unpack("<IQ", file.read(12))
        tensors.append(TensorInfo(name, GGMLQuantizationType(kind), shape, offset, 0))
    return architecture, tensors, -(-file.tell() // alignment) * alignment


def _placed(tensor: TensorInfo, data_start: int) -> TensorInfo:
    """The tensor with its absolute offset and byte count, checked against its blocks."""
    block, size = GGML_QUANT_SIZES[tensor.type]
    count = int(np.prod(tensor.shape))
    if tensor.shape[0] % block:
        raise ValueError(
            f"tensor {tensor.name} has rows of {tensor.shape[0]} values, not a multiple of "
            f"{tensor.type_name}'s blocks of {block}"
        )
    return TensorInfo(
        tensor.name, tensor.type, tensor.shape, data_start + tensor.offset, count // block * size
    )


def _string(file: BinaryIO) -> str:
    """A length-prefixed UTF-8 string."""
    (length,) = struct.unpack("<Q", file.read(8))
    return file.read(length).decode()


def _skip(file: BinaryIO, kind: int) -> None:
    """Move past one metadata value of this type without building it."""
    if kind in _SCALAR_SIZE:
        file.seek(_SCALAR_SIZE[kind], 1)
    elif kind == _STRING:
        (length,) = struct.unpack("<Q", file.read(8))
        file.seek(length, 1)
    elif kind == _ARRAY:
        item, count = struct.unpack("<IQ", file.read(12))
        if item in _SCALAR_SIZE:
            file.seek(_SCALAR_SIZE[item] * count, 1)
        else:
            for _ in range(count):
                _skip(file, item)
    else:
        raise ValueError(f"unknown metadata value type {kind}")
