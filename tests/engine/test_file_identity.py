"""A mapped model file: deleted or renamed over is harmless, rewritten in place is noticed."""

from __future__ import annotations

import os
from pathlib import Path

from paged_llm.engine.model.file_identity import FileIdentity, model_file


def _file(tmp_path: Path) -> Path:
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF" + bytes(60))
    return path


def test_deleting_or_renaming_over_the_file_leaves_the_mapping_valid(tmp_path: Path) -> None:
    path = _file(tmp_path)
    identity = FileIdentity.of(path)
    assert not identity.changed_in_place()
    new = tmp_path / "new.part"
    new.write_bytes(b"GGUF" + bytes(100))
    new.replace(path)
    assert not identity.changed_in_place()
    path.unlink()
    assert not identity.changed_in_place()


def test_writing_into_the_same_inode_is_a_change(tmp_path: Path) -> None:
    path = _file(tmp_path)
    identity = FileIdentity.of(path)
    with path.open("r+b") as file:
        file.write(b"GGUF" + bytes(100))  # longer: a new size
    assert identity.changed_in_place()
    same_size = FileIdentity.of(path)
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))
    assert same_size.changed_in_place()


def test_only_a_gguf_file_on_disk_is_watched(tmp_path: Path) -> None:
    path = _file(tmp_path)
    assert model_file(str(path)) == path
    assert model_file(str(tmp_path)) is None  # a model folder
    assert model_file("HuggingFaceTB/SmolLM2-135M-Instruct") is None
    assert model_file(str(tmp_path / "missing.gguf")) is None
