"""Merges derived from a SentencePiece vocabulary, kept in the cache folder after the first load.

A SentencePiece GGUF file stores no merges (llama.cpp ranks pairs by score at run time), so
``gguf_tokenizer.generate_merges`` derives them in pure Python, as transformers does: seconds
for Gemma's 262,144 tokens, on every load. Only those merges are kept, not the whole
serialized tokenizer: ``Tokenizer.from_str`` of a whole tokenizer was measured no faster than
building it from a vocabulary and merges. The key is a sha256 over everything the derivation
reads (the tokens in order, the ranks, which ranking) and ``ALGORITHM_VERSION``, so a file
with other tokens or scores, or a changed derivation, never meets a stale entry.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from array import array
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Final

_LOGGER = logging.getLogger(__name__)

# Raised whenever generate_merges would give other merges for the same inputs (its ranking,
# tie order or splitting): entries written by an older derivation are then never read.
ALGORITHM_VERSION: Final = 1
FOLDER: Final = "tokenizers"  # under the engine's cache folder

Merges = list[tuple[str, str]]


def merges_key(tokens: Sequence[str], ranks: Sequence[float], ranking: str) -> str:
    """The sha256 naming the merges of these tokens ranked by ``ranks`` under ``ranking``."""
    digest = hashlib.sha256(f"merges v{ALGORITHM_VERSION} {ranking}\n".encode())
    # JSON spells each token unambiguously (a token holding a separator cannot shift the
    # boundaries); the ranks as doubles, exactly as the derivation compares them.
    digest.update(json.dumps(list(tokens), ensure_ascii=False).encode("utf-8", "surrogatepass"))
    digest.update(array("d", ranks).tobytes())
    return digest.hexdigest()


def _read(path: Path, vocab: Mapping[str, int]) -> Merges | None:
    """The merges kept at ``path``; None (logged at debug) when missing, unreadable or corrupt."""
    try:
        flat = json.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:  # ValueError: not JSON, or not UTF-8
        _LOGGER.debug("tokenizer cache %s unreadable, rebuilding: %s", path, err)
        return None
    # A damaged entry must not reach BPE(), which would refuse the model: every item must
    # be a token of this vocabulary, paired. One set comparison checks them all (a number
    # is no vocabulary key; a list is unhashable): a Python loop would cost most of a read.
    try:
        valid = isinstance(flat, list) and not len(flat) % 2 and vocab.keys() >= set(flat)
    except TypeError:
        valid = False
    if not valid:
        _LOGGER.debug("tokenizer cache %s is not this vocabulary's merges, rebuilding", path)
        return None
    pairs = iter(flat)
    return list(zip(pairs, pairs, strict=True))


def _write(path: Path, merges: Merges) -> None:
    """Keep ``merges`` at ``path`` whole or not at all; a folder that refuses is no error."""
    flat = [token for pair in merges for token in pair]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
    except OSError as err:
        _LOGGER.debug("tokenizer cache folder %s not writable: %s", path.parent, err)
        return
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(json.dumps(flat, ensure_ascii=False).encode("utf-8", "surrogatepass"))
        # rename is atomic: a reader sees no entry or a whole one, never a partial write
        os.replace(tmp, path)
    except OSError as err:
        _LOGGER.debug("tokenizer cache %s not written: %s", path, err)
        Path(tmp).unlink(missing_ok=True)


def cached_merges(
    folder: Path | None,
    key: str,
    vocab: Mapping[str, int],
    derive: Callable[[], Merges],
) -> Merges:
    """The merges under ``key`` in ``folder``, else ``derive()``'s, kept there for next time.

    ``folder`` None means no cache: ``derive()`` every time. ``vocab`` (token -> id) is what a kept
    entry's tokens are checked against.
    """
    if folder is None:
        return derive()
    path = folder / f"{key}.json"
    merges = _read(path, vocab)
    if merges is None:
        merges = derive()
        _write(path, merges)
    return merges
