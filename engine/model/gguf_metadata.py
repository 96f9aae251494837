"""A GGUF file's metadata fields as gguf's GGUFReader shows them, without its per-item views.

transformers builds a GGUF model's config and tokenizer from ``GGUFReader(path).fields``,
and the reader makes a numpy view of every item of every metadata array: 352k of them for
a 151k-token vocabulary, the larger part of a first start. ``MetadataReader``
gives the same fields (``name``, ``types``, ``parts``, ``data``: ``parts[i]`` for each
``i`` in ``data`` is one value, as transformers reads them) and the tensors' names, from
one walk over the header: arrays of numbers as one numpy array each, strings as bytes. It
does not read tensors. ``values`` gives the same fields as plain values, the form of
transformers' newer ``read_gguf_metadata`` (its tokenizer's path, whose numpy map reads a
vocabulary a string at a time). What it does not know (a big-endian
file, arrays of arrays) raises ``Unreadable``, and the caller falls back to gguf's or
transformers' reader, the authorities the tests compare against.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

# GGUF's metadata value types (gguf.GGUFValueType): the numbers' numpy types.
_NUMBERS = {
    0: np.uint8,
    1: np.int8,
    2: np.uint16,
    3: np.int16,
    4: np.uint32,
    5: np.int32,
    6: np.float32,
    7: np.bool_,
    10: np.uint64,
    11: np.int64,
    12: np.float64,
}
_STRING, _ARRAY = 8, 9
_U64 = struct.Struct("<Q")


class Unreadable(ValueError):
    """The file holds something this reader leaves to gguf's GGUFReader."""


@dataclass(slots=True)
class Field:
    """One metadata key: its value types and its values' parts, as gguf's ReaderField."""

    name: str
    types: list[int]
    parts: Sequence[Any] | np.ndarray  # an array of numbers: one row per value
    data: Sequence[int]


@dataclass(slots=True, frozen=True)
class ParsedArray:
    """An array field's values already parsed: what transformers' parse of each item gives."""

    values: list[Any]


def passing_parsed(parse: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """``parse`` (transformers' parse of one item) handing a ParsedArray's values back whole."""

    def parse_value(value: Any, types: Any) -> Any:
        """The item's value; a ParsedArray's values as they are."""
        return value.values if isinstance(value, ParsedArray) else parse(value, types)

    return parse_value


@dataclass(slots=True, frozen=True)
class ParsedView:
    """A reader's fields with its long arrays as one ParsedArray part each (see ``parsed``)."""

    fields: dict[str, Field]
    tensors: list[TensorName]


@dataclass(slots=True, frozen=True)
class TensorName:
    """A tensor of the file, by name only (what the config is built from)."""

    name: str


class MetadataReader:
    """The metadata fields and tensor names of a GGUF file (little-endian, v2 or v3)."""

    def __init__(self, path: str | Path) -> None:
        """Read the header; Unreadable where gguf's own reader is needed."""
        self.fields: dict[str, Field] = {}
        self.tensors: list[TensorName] = []
        # Where the tensor table starts: gguf_file reads it from here without a second walk.
        self.table_at = 0
        self._decoded: dict[str, list[Any]] = {}
        with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as m:
            self._buffer, self._at = m, 0
            try:
                self._read_header()
            except (struct.error, IndexError) as err:
                raise Unreadable(f"{path}: the header ends early ({err})") from err
            finally:
                del self._buffer

    def _read_header(self) -> None:
        """Every field, then the tensors' names."""
        if self._take(4) != b"GGUF":
            raise Unreadable("no GGUF magic")
        (version,) = self._unpack("<I")
        if version not in (2, 3):  # a byte-swapped version is a big-endian file
            raise Unreadable(f"GGUF version {version}")
        n_tensors, n_kv = self._unpack("<QQ")
        # gguf's reader shows the header's counts as fields of their own, first
        for name, kind, value in (
            ("GGUF.version", 4, version),
            ("GGUF.tensor_count", 10, n_tensors),
            ("GGUF.kv_count", 10, n_kv),
        ):
            self.fields[name] = Field(name, [kind], [np.array([value], _NUMBERS[kind])], [0])
        for _ in range(n_kv):
            name = self._string().decode()
            (kind,) = self._unpack("<I")
            self.fields[name] = self._field(name, kind)
        self.table_at = self._at
        for _ in range(n_tensors):
            name = self._string().decode()
            (dims,) = self._unpack("<I")
            self._at += 8 * dims + 12  # shape, type, offset
            self.tensors.append(TensorName(name))

    def values(self, keep_strings: Container[str] = ()) -> dict[str, Any]:
        """The fields as transformers' own ``read_gguf_metadata`` gives them: plain values.

        Numbers as Python numbers, strings as text, arrays of numbers as lists, arrays of
        strings as lists for the keys in ``keep_strings`` and as their length otherwise.
        """
        out: dict[str, Any] = {}
        for name, field in self.fields.items():
            if name.startswith("GGUF."):  # the header's counts, which gguf's reader adds
                continue
            kind = field.types[0]
            if kind in _NUMBERS:
                out[name] = field.parts[0][0].item()
            elif kind == _STRING:
                out[name] = bytes(field.parts[0]).decode("utf-8")
            elif field.types[1] in _NUMBERS or name in keep_strings:
                out[name] = self._items(field)
            else:
                out[name] = len(field.parts)
        return out

    def parsed(self, at_least: int) -> ParsedView:
        """The fields, each array of ``at_least`` items or more as one ParsedArray part.

        transformers' older ``load_gguf_checkpoint`` parses a field's items one call each
        (slow for a 151k-token vocabulary and its merges); given this view
        and a parse that hands a ParsedArray's values back whole, it gets the same values
        at once. Short arrays keep their parts: a one-item array parses to its item there.
        """
        fields = dict(self.fields)
        for name, field in self.fields.items():
            if field.types[0] == _ARRAY and len(field.data) >= max(at_least, 2):
                fields[name] = Field(name, field.types, [ParsedArray(self._items(field))], [0])
        return ParsedView(fields, self.tensors)

    def _items(self, field: Field) -> list[Any]:
        """An array field's items as plain values: numbers, or strings decoded from UTF-8.

        Worked out once per field (values and parsed both ask for a vocabulary); a copy
        each time, as the callers may change their lists.
        """
        items = self._decoded.get(field.name)
        if items is None:
            if field.types[1] in _NUMBERS:
                items = np.asarray(field.parts).reshape(-1).tolist()
            else:
                items = [bytes(part).decode("utf-8") for part in field.parts]
            self._decoded[field.name] = items
        return list(items)

    def _field(self, name: str, kind: int) -> Field:
        """One value, or one array, of the field's type."""
        if kind in _NUMBERS:
            return Field(name, [kind], [self._numbers(kind, 1)], [0])
        if kind == _STRING:
            return Field(name, [kind], [self._string()], [0])
        if kind != _ARRAY:
            raise Unreadable(f"field {name} has value type {kind}")
        item, count = self._unpack("<IQ")
        if item in _NUMBERS:
            values = self._numbers(item, count).reshape(count, 1)  # a part per value
            return Field(name, [kind, item], values, range(count))
        if item == _STRING:
            return Field(name, [kind, item], self._strings(count), range(count))
        raise Unreadable(f"field {name} is an array of type {item}")

    def _strings(self, count: int) -> list[bytes]:
        """``count`` length-prefixed strings' bytes: a vocabulary's, in one tight loop."""
        buffer, at, unpack = self._buffer, self._at, _U64.unpack_from
        items = []
        for _ in range(count):
            (length,) = unpack(buffer, at)
            items.append(buffer[at + 8 : at + 8 + length])
            at += 8 + length
        if at > len(buffer):
            raise Unreadable("the header runs past the end of the file")
        self._at = at
        return items

    def _numbers(self, kind: int, count: int) -> np.ndarray:
        """``count`` numbers of a type, copied out of the map."""
        dtype = np.dtype(_NUMBERS[kind]).newbyteorder("<")
        if self._at + dtype.itemsize * count > len(self._buffer):
            raise Unreadable("the header runs past the end of the file")
        values = np.frombuffer(self._buffer, dtype, count, self._at).copy()
        self._at += dtype.itemsize * count
        return values

    def _string(self) -> bytes:
        """A length-prefixed string's bytes."""
        (length,) = self._unpack("<Q")
        return self._take(length)

    def _unpack(self, layout: str) -> tuple[Any, ...]:
        """Fixed-size values at the cursor."""
        values = struct.unpack_from(layout, self._buffer, self._at)
        self._at += struct.calcsize(layout)
        return values

    def _take(self, n: int) -> bytes:
        """The next n bytes."""
        if self._at + n > len(self._buffer):
            raise Unreadable("the header runs past the end of the file")
        chunk = self._buffer[self._at : self._at + n]
        self._at += n
        return chunk
