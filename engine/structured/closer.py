"""Closing a constrained answer in time: a short way to the grammar's end, forced near max_tokens.

A JSON answer cut off at ``max_tokens`` is useless to its caller. While a constrained
request still has room, :meth:`Closer.path` looks for a short run of tokens from the
matcher's state to a state where the grammar may end (on a fork of the matcher, so the
request's own matcher does not move): forced text as the grammar's jump-forward tokens, a
string closed where one is open, the closing bracket, quote, ``0`` or comma that the
grammar accepts, and where none fits the longest token it allows (``true``, an enum
value). When the path and the end token only just fit in what is left, the request is held
to that path, token by token.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from paged_llm.engine.structured import bitmask as bits
from paged_llm.engine.structured.matcher import Matcher

# What ends things soonest outside a string, best first: close an array or object, go on
# to the next required member, the shortest number, an empty string, array or object. Each
# also after a space (the grammar's separators are ", " and ": ").
_OUTSIDE = ("]", "}", ",", "0", '"', "[", "{")
# A character only a JSON string (or free text) accepts: where it is taken, a string is open.
_PROBE = "x"
# How many tokens a path may take before the search gives up on it.
_PATH_LIMIT = 256


class Closer:
    """Short paths to a grammar's end over one tokenizer's vocabulary."""

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        """Find the single tokens of the closing characters and every token's length."""
        self.quote = _single_token(tokenizer, '"')
        self._probe = _single_token(tokenizer, _PROBE)
        spelled = [text for c in _OUTSIDE for text in (c, " " + c)]
        self._outside = [t for t in (_single_token(tokenizer, c) for c in spelled) if t >= 0]
        # Every token's length, -1 where no token is (a vocabulary padded past the tokenizer).
        lengths = np.full(vocab_size, -1, dtype=np.int32)
        for token_id, text in enumerate(tokenizer.convert_ids_to_tokens(range(len(tokenizer)))):
            if token_id < vocab_size and text is not None:
                lengths[token_id] = len(text)
        self._lengths = lengths
        self._bitmask: npt.NDArray[np.int32] | None = None

    def path(self, matcher: Matcher, limit: int = _PATH_LIMIT) -> list[int] | None:
        """Tokens that bring ``matcher`` to a state where it may end (None if none is found)."""
        fork = matcher.fork()
        taken: list[int] = []
        while not fork.is_completed():
            if len(taken) >= limit:
                return None
            forced = fork.forced_tokens()
            if forced:
                for token in forced:
                    if not fork.accept_token(token):
                        return None
                taken.extend(forced)
                continue
            chosen = self._next(fork)
            if chosen is None:
                return None
            taken.append(chosen)
        return taken

    def _next(self, fork: Matcher) -> int | None:
        """Take, on ``fork``, the token that ends things soonest; None when nothing fits."""
        if self._probe >= 0 and fork.accept_token(self._probe):
            fork.rollback(1)
            if self.quote >= 0 and fork.accept_token(self.quote):
                return self.quote
        for token in self._outside:
            if fork.accept_token(token):
                return token
        return self._longest_allowed(fork)

    def _longest_allowed(self, fork: Matcher) -> int | None:
        """Take the longest token the grammar allows here (a literal such as ``true``)."""
        vocab_size = self._lengths.shape[0]
        if self._bitmask is None:
            self._bitmask = bits.allocate(1, vocab_size)
        fork.fill_mask(self._bitmask, 0)
        lengths = np.where(bits.allowed(self._bitmask, vocab_size)[0], self._lengths, -1)
        token = int(lengths.argmax())
        if lengths[token] < 0:
            return None
        return token if fork.accept_token(token) else None


def _single_token(tokenizer: Any, text: str) -> int:
    """The id of the one token that spells ``text`` alone, or -1 when it takes several."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    return int(ids[0]) if len(ids) == 1 else -1
