"""Incremental detokenization with stop strings, safe for multi-byte characters."""

from __future__ import annotations

from typing import Any

# A decode ending in U+FFFD means a multi-byte character is still incomplete.
_REPLACEMENT = "\ufffd"


class Detokenizer:
    """Turns one sequence's output ids into text deltas as they arrive.

    Decodes a short window of recent tokens (so each step costs O(1), not O(length)) and
    holds back text that might be the start of a stop string, so a stop string never
    reaches the consumer.
    """

    __slots__ = ("_emitted", "_prefix_offset", "_read_offset", "_stop", "_text", "_tokenizer")

    def __init__(self, tokenizer: Any, stop: tuple[str, ...]) -> None:
        """Prepare for a new output."""
        self._tokenizer = tokenizer
        self._stop = stop
        self._prefix_offset = 0
        self._read_offset = 0
        self._text = ""
        self._emitted = 0

    @property
    def text(self) -> str:
        """All text decoded so far (stop string excluded once found)."""
        return self._text

    def add(self, token_ids: list[int], base: int) -> tuple[str, bool]:
        """Decode the newest output token; return (new text, stop string hit).

        The output is ``token_ids[base:]``; only a window of it is sliced, never all of it.
        """
        decode = self._tokenizer.decode
        start, read = base + self._prefix_offset, base + self._read_offset
        prefix = decode(token_ids[start:read], skip_special_tokens=True)
        full = decode(token_ids[start:], skip_special_tokens=True)
        if len(full) > len(prefix) and not full.endswith(_REPLACEMENT):
            self._text += full[len(prefix) :]
            self._prefix_offset = self._read_offset
            self._read_offset = len(token_ids) - base
        hit = False
        if self._stop:
            # Only the new tail (plus the longest stop's overlap) can hold a new match.
            search_from = max(0, self._emitted - max(len(s) for s in self._stop))
            cut = min(
                (i for s in self._stop if (i := self._text.find(s, search_from)) >= 0),
                default=-1,
            )
            if cut >= 0:
                self._text = self._text[:cut]
                hit = True
        return self._release(final=hit), hit

    def flush(self) -> str:
        """Release any text held back; call when the sequence ends."""
        return self._release(final=True)

    def _release(self, final: bool) -> str:
        """Return text not yet emitted, keeping back a possible stop-string prefix."""
        end = len(self._text)
        if not final and self._stop:
            for stop in self._stop:
                for n in range(min(len(stop) - 1, end), 0, -1):
                    if self._text.endswith(stop[:n]):
                        end = min(end, len(self._text) - n)
                        break
        end = max(end, self._emitted)
        delta = self._text[self._emitted : end]
        self._emitted = end
        return delta
