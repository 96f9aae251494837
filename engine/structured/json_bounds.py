"""Bounds on free JSON numbers and item counts in a grammar, so an answer cannot run on forever.

xgrammar's JSON grammars let a number have any count of digits and an array or object any
count of items. Greedy decoding with a small model then sometimes never leaves one
(``200.1234567895111…``, ``[1, 1, 1, …``) until ``max_tokens`` cuts the JSON off. These
bounds are applied to the grammar xgrammar builds, by rewriting its EBNF (the same text
its own parser reads back):

- ``[0-9]*`` (an integer part's further digits) to at most ``integer_digits - 1``;
- a repetition without an upper end, ``x{n, -1}``, of digits (fractions, exponents) to
  ``fraction_digits``, and of the items that follow an array's or object's first one so
  that it holds ``items`` at most.

Strings are left free in the grammar: a bounded run of string characters (``c{0, 1000}``)
defeats xgrammar's precomputed token masks, and filling a mask inside such a string is
hundreds of times slower than a precomputed one. ``string_chars`` is kept by the engine instead
(structured/output.py: once an open string has that many characters, its closing quote is forced
where the grammar takes it), and engine/structured/closer.py holds an answer to its shortest way to
the end as ``max_tokens`` nears. A schema's own bounds (``maxLength``, ``maxItems``,
numeric ranges) stay as written.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_OPEN_REPEAT = re.compile(r"(?P<ref>\w+)\{(?P<low>\d+), -1\}")
_MORE_DIGITS = "[0-9]*"


@dataclass(slots=True, frozen=True)
class JsonBounds:
    """How far a free JSON number, string or array may grow (each at least 1)."""

    string_chars: int = 1000
    integer_digits: int = 15
    fraction_digits: int = 10
    items: int = 64

    def __post_init__(self) -> None:
        """Refuse a bound below 1, naming it."""
        for name in ("string_chars", "integer_digits", "fraction_digits", "items"):
            if getattr(self, name) < 1:
                raise ValueError(f"json bound {name} must be at least 1, got {getattr(self, name)}")


def bounded(ebnf: str, bounds: JsonBounds) -> str:
    """The grammar ``ebnf`` (xgrammar's printed form) with its free numbers and items bounded."""
    ebnf = ebnf.replace(_MORE_DIGITS, f"[0-9]{{0, {bounds.integer_digits - 1}}}")
    return _OPEN_REPEAT.sub(lambda m: _repeat(m, bounds), ebnf)


def _repeat(match: re.Match[str], bounds: JsonBounds) -> str:
    """An open repetition ``x{n, -1}`` closed at the bound that fits what x is."""
    ref, low = match["ref"], int(match["low"])
    if "digit" in ref:
        limit = bounds.fraction_digits
    elif "char" in ref:  # string characters (minLength without maxLength): left free
        return match[0]
    else:  # the items after an array's or object's first one
        limit = bounds.items - 1
    return f"{ref}{{{low}, {max(low, limit)}}}"


def open_string_length(text: str) -> int:
    """Characters of the JSON string still open at the end of ``text`` (-1 if none is open).

    Escapes count as the characters they are written with; text outside JSON (a tool
    call's tags) holds no quotes, so it does not disturb the count.
    """
    start, escaped = -1, False
    for i, char in enumerate(text):
        if start < 0:
            if char == '"':
                start = i + 1
        elif escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == '"':
            start = -1
    return -1 if start < 0 else len(text) - start
