"""Folders kept beside a model: where a GGUF file's converted files go, published whole."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path


def cache_folder(gguf: Path, cache_dir: Path) -> Path:
    """Where the file's config and tokenizer are kept, keyed by the file's identity."""
    stat = gguf.stat()
    # "+rope": folders kept before the file's rope scaling was applied are not reused
    key = f"{gguf.resolve()}:{stat.st_size}:{stat.st_mtime_ns}:config+tokenizer+rope"
    return cache_dir / f"{gguf.stem}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def publish_folder(tmp: Path, folder: Path) -> None:
    """Move a finished folder into place; when another process got there first, keep theirs."""
    try:
        os.replace(tmp, folder)
    except OSError:
        if not folder.is_dir():
            raise
        shutil.rmtree(tmp)
