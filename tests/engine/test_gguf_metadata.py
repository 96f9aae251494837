"""The engine's GGUF metadata reader gives the fields gguf's own GGUFReader gives."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from transformers import modeling_gguf_pytorch_utils
from transformers.integrations.ggml import _gguf_parse_value
from transformers.integrations.gguf import reader as transformers_reader

from paged_llm.engine.config import DEFAULT_MODEL
from paged_llm.engine.model import gguf_file
from paged_llm.engine.model.gguf_metadata import (
    MetadataReader,
    ParsedArray,
    Unreadable,
    passing_parsed,
)
from paged_llm.engine.model.gguf_transformers import _metadata_parsed_once
from paged_llm.engine.model.loader import bundled_gguf_path


def every_kind(path: Path, endianess: gguf.GGUFEndian = gguf.GGUFEndian.LITTLE) -> Path:
    """A GGUF file with a field of every value type, arrays of each, and two tensors."""
    writer = gguf.GGUFWriter(path, "llama", endianess=endianess)
    writer.add_uint8("t.u8", 250)
    writer.add_int8("t.i8", -7)
    writer.add_uint16("t.u16", 65000)
    writer.add_int16("t.i16", -32000)
    writer.add_uint32("t.u32", 4_000_000_000)
    writer.add_int32("t.i32", -2_000_000_000)
    writer.add_float32("t.f32", 0.1)
    writer.add_uint64("t.u64", 2**63 + 5)
    writer.add_int64("t.i64", -(2**62))
    writer.add_float64("t.f64", 1 / 3)
    writer.add_bool("t.yes", True)
    writer.add_bool("t.no", False)
    writer.add_string("t.text", "Küche ✨ light")
    writer.add_string("t.empty", "")
    writer.add_array("t.ints", [1, -2, 3])
    writer.add_array("t.floats", [0.5, -1.25])
    writer.add_array("t.bools", [True, False, True])
    writer.add_array("t.strings", ["a", "", "ünï", "<|im_start|>"])
    writer.add_array("t.none", [])
    writer.add_array("t.one", [7])
    writer.add_tensor("token_embd.weight", np.ones((4, 32), dtype=np.float32))
    writer.add_tensor("output.weight", np.ones((4, 32), dtype=np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def values(reader: Any) -> dict[str, tuple[list[int], list[Any]]]:
    """Each field's types and values, as transformers reads them."""
    return {
        name: (
            [int(t) for t in field.types],
            [_gguf_parse_value(field.parts[i], field.types) for i in field.data],
        )
        for name, field in reader.fields.items()
    }


def assert_same_fields(path: Path) -> None:
    """The two readers agree on every field (types, values, their Python types) and tensor."""
    ours, theirs = MetadataReader(path), gguf.GGUFReader(path)
    got, want = values(ours), values(theirs)
    assert list(got) == list(want)
    for name in want:
        assert got[name] == want[name], name
        assert [type(v) for v in got[name][1]] == [type(v) for v in want[name][1]], name
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]


def assert_same_values(path: Path, keep: tuple[str, ...]) -> None:
    """values(keep) and the tensors' names are transformers' read_gguf_metadata(path, keep)."""
    ours = MetadataReader(path)
    want, names = transformers_reader.read_gguf_metadata(str(path), keep)
    got = ours.values(keep)
    assert list(got) == list(want)
    for name in want:
        assert got[name] == want[name], name
        assert type(got[name]) is type(want[name]), name
        if isinstance(want[name], list):
            assert [type(v) for v in got[name]] == [type(v) for v in want[name]], name
    assert tuple(t.name for t in ours.tensors) == names


def test_every_value_type_reads_as_gguf_reads_it(tmp_path: Path) -> None:
    """Numbers of each width, bools, strings (UTF-8, empty) and arrays of each."""
    path = every_kind(tmp_path / "kinds.gguf")
    assert_same_fields(path)
    assert_same_values(path, ())
    assert_same_values(path, ("t.strings", "t.none", "t.text"))


def test_the_bundled_model_reads_as_gguf_reads_it_into_the_same_checkpoint() -> None:
    """A real vocabulary, merges and chat template: transformers builds the same dicts."""
    path = bundled_gguf_path(DEFAULT_MODEL.split(":")[1])
    assert_same_fields(path)
    assert_same_values(path, ())
    assert_same_values(path, ("tokenizer.ggml.tokens", "tokenizer.ggml.merges"))
    alone = modeling_gguf_pytorch_utils.load_gguf_checkpoint(str(path))
    with _metadata_parsed_once():
        first = modeling_gguf_pytorch_utils.load_gguf_checkpoint(str(path))
        assert first == alone
        # Each call gets its own copy: what one caller changes, the next does not see.
        first["config"].clear()
        first["tokenizer"]["tokens"][0] = "changed"
        assert modeling_gguf_pytorch_utils.load_gguf_checkpoint(str(path)) == alone


def test_parsed_arrays_are_transformers_item_by_item_parse(tmp_path: Path) -> None:
    """parsed(n): arrays of n items or more parse at once to what each item parses to."""
    path = every_kind(tmp_path / "kinds.gguf")
    ours = MetadataReader(path)
    want = values(ours)
    parse = passing_parsed(_gguf_parse_value)
    for at_least in (1, 3, 4):
        view = ours.parsed(at_least)
        assert view.tensors == ours.tensors
        for name, field in view.fields.items():
            got = [parse(field.parts[i], field.types) for i in field.data]
            whole = isinstance(field.parts[0], ParsedArray) if len(field.parts) else False
            # One-item arrays keep their part: a list of one item would parse to its item.
            assert whole == (field.types[0] == 9 and len(want[name][1]) >= max(at_least, 2))
            if whole:
                got = got[0]
            else:
                assert field is ours.fields[name]
            assert got == want[name][1], name
            assert [type(v) for v in got] == [type(v) for v in want[name][1]], name


def test_what_it_cannot_read_goes_to_gguf_s_reader(tmp_path: Path) -> None:
    """A big-endian file is left to gguf's reader; a cut header and a non-GGUF too."""
    big = every_kind(tmp_path / "big.gguf", gguf.GGUFEndian.BIG)
    with pytest.raises(Unreadable, match="version"):
        MetadataReader(big)
    alone = modeling_gguf_pytorch_utils.load_gguf_checkpoint(str(big))
    with pytest.raises(ValueError, match="GGUF v") as own_error:
        transformers_reader.read_gguf_metadata(str(big))
    with _metadata_parsed_once():
        assert modeling_gguf_pytorch_utils.load_gguf_checkpoint(str(big)) == alone
        with pytest.raises(ValueError, match="GGUF v") as error:
            transformers_reader.read_gguf_metadata(str(big))
    assert str(error.value) == str(own_error.value)
    whole = every_kind(tmp_path / "whole.gguf").read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole[:200])
    with pytest.raises(Unreadable, match="end"):
        MetadataReader(cut)
    other = tmp_path / "other.gguf"
    other.write_bytes(b"PK\x03\x04" + whole[4:])
    with pytest.raises(Unreadable, match="magic"):
        MetadataReader(other)


@pytest.mark.parametrize("alignment", [None, 64])
def test_the_tensor_table_reads_the_same_from_the_metadata_reader(
    tmp_path: Path, alignment: int | None
) -> None:
    """gguf_file.read starting at the reader's table agrees with its own walk and gguf's."""
    path = tmp_path / "aligned.gguf"
    writer = gguf.GGUFWriter(path, "qwen2")
    if alignment is not None:
        writer.add_custom_alignment(alignment)
    writer.add_array("tokenizer.ggml.tokens", ["a", "bc", "ünï"] * 50)
    writer.add_tensor("token_embd.weight", np.arange(96, dtype=np.float32).reshape(3, 32))
    writer.add_tensor("output_norm.weight", np.ones(32, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    for file in (path, bundled_gguf_path(DEFAULT_MODEL)):
        walked, given = gguf_file.read(file), gguf_file.read(file, MetadataReader(file))
        assert (given.architecture, given.tensors) == (walked.architecture, walked.tensors)
        theirs = {t.name: int(t.data_offset) for t in gguf.GGUFReader(file).tensors}
        assert {t.name: t.offset for t in given.tensors} == theirs
