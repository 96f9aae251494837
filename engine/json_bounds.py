"""Bounds on free JSON values in a grammar, so a schema answer cannot run on forever.

xgrammar's JSON grammars let a number have any count of digits, a string without a
``maxLength`` any length, and an array or object any count of items. Greedy decoding with
a small model then sometimes never leaves one (``200.1234567895111…``, ``"1.1.1.1…"``)
until ``max_tokens`` cuts the JSON off. These bounds are applied to the grammar xgrammar
builds, by rewriting its EBNF (the same text its own parser reads back):

- ``[0-9]*`` (an integer part's further digits) to at most ``integer_digits - 1``;
- a repetition without an upper end, ``x{n, -1}``: digit rules (fractions, exponents) to
  ``fraction_digits``, string characters to ``string_chars``, the items that follow an
  array's or object's first one so that it holds ``items`` at most;
- the recursive rule of a free string (one character, then the rest of the string) to a
  bounded repetition of one character, ``string_chars`` long at most.

A schema's own bounds (``maxLength``, ``maxItems``, numeric ranges) are already finite and
stay as written.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# The recursive rule of a free string, as xgrammar writes it:
#   name ::= (("\"") | (CLASS name) | ("\\" ESCAPE name)) LOOKAHEAD
_STRING_RULE = re.compile(
    r'^(?P<name>\w+) ::= \(\("\\""\) \| \((?P<cls>\[[^\n]*?\]) (?P=name)\) '
    r'\| \("\\\\" (?P<esc>\w+) (?P=name)\)\)(?P<rest>.*)$',
    re.MULTILINE,
)
_OPEN_REPEAT = re.compile(r"(?P<ref>\w+)\{(?P<low>\d+), -1\}")
_MORE_DIGITS = "[0-9]*"


@dataclass(slots=True, frozen=True)
class JsonBounds:
    """How long a free JSON value may grow (each at least 1)."""

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
    """The grammar ``ebnf`` (xgrammar's printed form) with its free JSON values bounded."""
    ebnf = _STRING_RULE.sub(lambda m: _string_rule(m, bounds.string_chars), ebnf)
    ebnf = ebnf.replace(_MORE_DIGITS, f"[0-9]{{0, {bounds.integer_digits - 1}}}")
    return _OPEN_REPEAT.sub(lambda m: _repeat(m, bounds), ebnf)


def _string_rule(match: re.Match[str], limit: int) -> str:
    """A free string's recursive rule as a bounded run of characters, then the quote."""
    name, cls, esc = match["name"], match["cls"], match["esc"]
    char = f"{name}_char"
    return (
        f'{name} ::= (({char}{{0, {limit}}} "\\"")){match["rest"]}\n'
        f'{char} ::= (({cls}) | ("\\\\" {esc}))'
    )


def _repeat(match: re.Match[str], bounds: JsonBounds) -> str:
    """An open repetition ``x{n, -1}`` closed at the bound that fits what x is."""
    ref, low = match["ref"], int(match["low"])
    if "digit" in ref:
        limit = bounds.fraction_digits
    elif "char" in ref:
        limit = bounds.string_chars
    else:  # the items after an array's or object's first one
        limit = bounds.items - 1
    return f"{ref}{{{low}, {max(low, limit)}}}"
