"""A GGUF file's tensor table and architecture, read without parsing its vocabulary.

``gguf``'s GGUFReader builds a numpy view of every item of every metadata array: for a
vocabulary that takes seconds before one tensor is found. Loading needs only the
architecture name and the tensor table, so this reader walks the metadata by lengths
alone, over a read-only map with a cursor (reading each length from a file object is
several times slower), and maps the file once.
The format is GGUF v2/v3 as the ``gguf`` package documents it; types and block sizes
are ``ggml_types``' copy of that package's (which costs a tenth of a first load to import).
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from paged_llm.engine.errors import ModelLoadError
from paged_llm.engine.model.ggml_types import BLOCK_SIZES, GGMLType
from paged_llm.engine.model.gguf_metadata import MetadataReader

_MAGIC = b"GGUF"
# Metadata value types: fixed sizes of the scalar ones (GGUF's numbering).
_SCALAR_SIZE = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9
_ALIGNMENT_KEY = "general.alignment"
_U32, _U64 = struct.Struct("<I"), struct.Struct("<Q")


@dataclass(slots=True, frozen=True)
class TensorInfo:
    """One tensor of the file: where its bytes lie and how to read them."""

    name: str
    type: GGMLType
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


def read(path: Path, metadata: MetadataReader | None = None) -> GGUFFile:
    """Read the file's table and map it; a damaged or truncated file is a ModelLoadError.

    With the file's ``metadata`` already read, the walk starts at its tensor table.
    """
    try:
        with path.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as m:
            if metadata is None:
                architecture, tensors, data_start = _read_header(m)
            else:
                architecture, tensors, data_start = _read_after(m, metadata)
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


def _read_header(buf: mmap.mmap) -> tuple[str, list[TensorInfo], int]:
    """(architecture, tensors with offsets relative to the data, data start)."""
    if buf[:4] != _MAGIC:
        raise ValueError("not a GGUF file (no GGUF magic at its start)")
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
    if version not in (2, 3):
        raise ValueError(f"GGUF version {version} is not supported (2 or 3 are)")
    at = 24
    architecture = ""
    alignment = 32
    for _ in range(n_kv):
        key, at = _string(buf, at)
        (kind,) = _U32.unpack_from(buf, at)
        at += 4
        if key == "general.architecture" and kind == _STRING:
            architecture, at = _string(buf, at)
        elif key == _ALIGNMENT_KEY and kind == 4:
            (alignment,) = _U32.unpack_from(buf, at)
            at += 4
        else:
            at = _skip(buf, at, kind)
    return _read_table(buf, at, n_tensors, architecture, alignment)


def _read_after(buf: mmap.mmap, metadata: MetadataReader) -> tuple[str, list[TensorInfo], int]:
    """As ``_read_header``, the metadata taken from a reader that walked it already."""
    values = metadata.fields
    architecture = values.get("general.architecture")
    alignment = values.get(_ALIGNMENT_KEY)
    name = ""
    if architecture is not None and architecture.types == [_STRING]:
        name = bytes(architecture.parts[0]).decode()
    align = int(alignment.parts[0][0]) if alignment is not None and alignment.types == [4] else 32
    return _read_table(buf, metadata.table_at, len(metadata.tensors), name, align)


def _read_table(
    buf: mmap.mmap, at: int, n_tensors: int, architecture: str, alignment: int
) -> tuple[str, list[TensorInfo], int]:
    """The tensor table at ``at``: (architecture, tensors, data start)."""
    if not architecture:
        raise ValueError("the file names no general.architecture")
    tensors = []
    for _ in range(n_tensors):
        name, at = _string(buf, at)
        (dims,) = _U32.unpack_from(buf, at)
        shape = struct.unpack_from(f"<{dims}Q", buf, at + 4)
        kind, offset = struct.unpack_from("<IQ", buf, at + 4 + 8 * dims)
        at += 4 + 8 * dims + 12
        try:
            kind = GGMLType(kind)
        except ValueError:
            raise ValueError(f"tensor {name} has GGML type {kind}, unknown here") from None
        tensors.append(TensorInfo(name, kind, shape, offset, 0))
    return architecture, tensors, -(-at // alignment) * alignment


def _placed(tensor: TensorInfo, data_start: int) -> TensorInfo:
    """The tensor with its absolute offset and byte count, checked against its blocks."""
    block, size = BLOCK_SIZES[tensor.type]
    count = int(np.prod(tensor.shape))
    if tensor.shape[0] % block:
        raise ValueError(
            f"tensor {tensor.name} has rows of {tensor.shape[0]} values, not a multiple of "
            f"{tensor.type_name}'s blocks of {block}"
        )
    return TensorInfo(
        tensor.name, tensor.type, tensor.shape, data_start + tensor.offset, count // block * size
    )


def _string(buf: mmap.mmap, at: int) -> tuple[str, int]:
    """A length-prefixed UTF-8 string at ``at``, and where the next value starts."""
    (length,) = _U64.unpack_from(buf, at)
    end = at + 8 + length
    if end > len(buf):
        raise ValueError("the metadata runs past the end of the file")
    return buf[at + 8 : end].decode(), end


def _skip(buf: mmap.mmap, at: int, kind: int) -> int:
    """Where the metadata value of this type at ``at`` ends, without building it."""
    if kind in _SCALAR_SIZE:
        return at + _SCALAR_SIZE[kind]
    if kind == _STRING:
        (length,) = _U64.unpack_from(buf, at)
        return at + 8 + int(length)
    if kind != _ARRAY:
        raise ValueError(f"unknown metadata value type {kind}")
    item, count = struct.unpack_from("<IQ", buf, at)
    at += 12
    if item in _SCALAR_SIZE:
        return at + _SCALAR_SIZE[item] * int(count)
    if item == _STRING:  # a vocabulary (Gemma's: 262,144 strings): by their lengths alone
        unpack = _U64.unpack_from
        for _ in range(count):
            at += 8 + unpack(buf, at)[0]
        return at
    for _ in range(count):
        at = _skip(buf, at, item)
    return at
