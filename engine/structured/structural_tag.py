"""Structural tags (xgrammar's JSON format, which the engine keeps) written as llguidance Lark.

tool_grammar.py describes tool calls as a structural tag: free text, and calls that open
with a trigger and then hold to an offered tool's name and parameter schema. The engine
keeps that description (callers and tests read it) and compiles it here into a Lark
grammar for llguidance, with the meaning xgrammar gave it:

- ``triggered_tags``: text is free until a trigger; from there a tag that begins with
  it must follow whole. ``at_least_one`` starts the answer with a tag at once;
  ``stop_after_first`` ends the answer after one tag.
- ``tag`` (begin, content, end), ``sequence``, ``or``, ``const_string``, ``regex``,
  ``any_text``, ``json_schema`` and ``tags_with_separator``.

A trigger that the tokenizer holds as one special token (Mistral's ``[TOOL_CALLS]``) is
taken as that token too: a model emits the token, and llguidance never matches a special
token's text as bytes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from paged_llm.engine.structured.json_bounds import JsonBounds, bounded_schema

# Free text: any characters, newlines included.
_TEXT = "TEXT: /(.|\\n)*/"
# JSON whitespace characters, for a bound on a run of them (max_whitespace_cnt).
_WHITESPACE = "[\\x20\\x0A\\x0D\\x09]"
# Any character may be written as a \\uXXXX escape, as JSON allows (and xgrammar took):
# llguidance otherwise takes the escape for control characters only.
JSON_ESCAPES = {"json_allow_general_unicode_escapes": True}


def json_options(schema: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """``schema`` with llguidance's layout options (``x-guidance``), the schema's own winning."""
    options = {**extra, **(schema.get("x-guidance") or {})}
    return {"x-guidance": options, **{k: v for k, v in schema.items() if k != "x-guidance"}}


def _literal(text: str) -> str:
    """A Lark string literal for ``text`` (JSON escapes, which llguidance's Lark reads)."""
    return json.dumps(text, ensure_ascii=False)


class _Writer:
    """Builds one Lark grammar from a structural tag's format tree."""

    def __init__(self, bounds: JsonBounds | None, special: Callable[[str], int | None]) -> None:
        """Remember the JSON bounds and how to find a text's special token."""
        self.bounds = bounds
        self.special = special
        self.rules: list[str] = []
        self._count = 0
        self.text_used = False

    def rule(self, body: str, attrs: str = "") -> str:
        """Add a rule with ``body``; its name."""
        self._count += 1
        name = f"r{self._count}"
        self.rules.append(f"{name}{attrs}: {body}")
        return name

    def text(self) -> str:
        """The free-text terminal."""
        self.text_used = True
        return "TEXT"

    def expr(self, fmt: Any) -> str:
        """A Lark expression for one format node; ValueError for what it cannot hold."""
        if not isinstance(fmt, Mapping):
            raise ValueError(f"a structural tag format must be an object, got {fmt!r:.100}")
        kind = fmt.get("type")
        handler = _HANDLERS.get(kind) if isinstance(kind, str) else None
        if handler is None:
            raise ValueError(f"unsupported structural tag format type {kind!r}")
        return handler(self, fmt)

    def const_string(self, fmt: Mapping[str, Any]) -> str:
        """Exactly the given text."""
        value = fmt.get("value")
        if not isinstance(value, str):
            raise ValueError("const_string needs a string value")
        return _literal(value) if value else '""'

    def json_schema(self, fmt: Mapping[str, Any]) -> str:
        """A JSON value fitting the schema: strict objects, bounded numbers and items."""
        schema = fmt.get("json_schema")
        if isinstance(schema, bool):
            schema = {} if schema else {"not": {}}
        if not isinstance(schema, Mapping):
            raise ValueError("json_schema needs a schema object")
        schema = bounded_schema(schema, self.bounds, strict=True)
        extra: dict[str, Any] = dict(JSON_ESCAPES)
        spaces = fmt.get("max_whitespace_cnt")
        if isinstance(spaces, int) and spaces >= 1:
            # A run of at most that many: small models otherwise drift into endless newlines.
            extra["whitespace_pattern"] = f"{_WHITESPACE}{{1,{spaces}}}"
        return "%json " + json.dumps(json_options(schema, extra), ensure_ascii=False)

    def regex(self, fmt: Mapping[str, Any]) -> str:
        """Text matching the pattern."""
        pattern = fmt.get("pattern")
        if not isinstance(pattern, str) or not pattern:
            raise ValueError("regex needs a pattern")
        return "/" + pattern.replace("/", "\\/") + "/"

    def any_text(self, fmt: Mapping[str, Any]) -> str:
        """Any text."""
        return self.text()

    def sequence(self, fmt: Mapping[str, Any]) -> str:
        """Each element in turn."""
        return "(" + " ".join(self.expr(e) for e in _elements(fmt)) + ")"

    def one_of(self, fmt: Mapping[str, Any]) -> str:
        """One of the elements."""
        return "(" + " | ".join(self.expr(e) for e in _elements(fmt)) + ")"

    def tag(self, fmt: Mapping[str, Any], begin: str | None = None) -> str:
        """Begin, content, end (``begin`` overrides the tag's own: a trigger already taken)."""
        begin = _text(fmt, "begin") if begin is None else begin
        end = _text(fmt, "end")
        content = fmt.get("content")
        if isinstance(content, Mapping) and content.get("type") == "any_text":
            # Free text up to the end: lazy, so the first end closes it.
            body = self.rule(f"{self.text()} {_literal(end)}" if end else self.text(), "[lazy]")
            return " ".join(p for p in (_literal(begin) if begin else "", body) if p)
        parts = [_literal(begin) if begin else "", self.expr(content), _literal(end) if end else ""]
        return "(" + " ".join(p for p in parts if p) + ")"

    def triggered_tags(self, fmt: Mapping[str, Any]) -> str:
        """Free text, with tags after each trigger (xgrammar's TagDispatch)."""
        triggers = fmt.get("triggers")
        tags = fmt.get("tags")
        if (
            not isinstance(triggers, list)
            or not triggers
            or not all(isinstance(t, str) and t for t in triggers)
        ):
            raise ValueError("triggered_tags needs non-empty trigger strings")
        if not isinstance(tags, list) or not tags:
            raise ValueError("triggered_tags needs tags")
        if fmt.get("excludes"):
            raise ValueError("triggered_tags excludes are not supported")
        bodies: dict[str, list[str]] = {t: [] for t in triggers}
        for tag in tags:
            begin = _text(tag, "begin")
            trigger = max((t for t in triggers if begin.startswith(t)), key=len, default=None)
            if trigger is None:
                raise ValueError(f"tag begin {begin!r:.100} starts with no trigger")
            bodies[trigger].append(self.tag(tag, begin[len(trigger) :]))
        calls, firsts = [], []
        for trigger, options in bodies.items():
            if not options:
                continue
            rest = " | ".join(options)
            token = self.special(trigger)
            opener = _literal(trigger) if token is None else f"({_literal(trigger)} | <[{token}]>)"
            firsts.append(f"{opener} ({rest})")
            head = self.rule(f"{self.text()} {_literal(trigger)}", "[lazy]")
            if token is not None:
                head = f"({head} | {self.text()} <[{token}]>)"
            calls.append(f"{head} ({rest})")
        call = self.rule(" | ".join(calls))
        first = self.rule(" | ".join(firsts))
        at_least_one, stop_after_first = (
            bool(fmt.get("at_least_one")),
            bool(fmt.get("stop_after_first")),
        )
        if stop_after_first:
            return first if at_least_one else f"({call} | {self.text()})"
        return f"{first} {call}* {self.text()}" if at_least_one else f"{call}* {self.text()}"

    def tags_with_separator(self, fmt: Mapping[str, Any]) -> str:
        """Tags and nothing else, separated by the separator."""
        tags = fmt.get("tags")
        if not isinstance(tags, list) or not tags:
            raise ValueError("tags_with_separator needs tags")
        one = self.rule(" | ".join(self.tag(t) for t in tags))
        separator = _text(fmt, "separator")
        sep = _literal(separator) if separator else ""
        if fmt.get("stop_after_first"):
            return one if fmt.get("at_least_one") else f"{one}?"
        many = f"{one} ({sep} {one})*"
        return many if fmt.get("at_least_one") else f"({many})?"


_HANDLERS: dict[str, Callable[[_Writer, Mapping[str, Any]], str]] = {
    "const_string": _Writer.const_string,
    "json_schema": _Writer.json_schema,
    "regex": _Writer.regex,
    "any_text": _Writer.any_text,
    "sequence": _Writer.sequence,
    "or": _Writer.one_of,
    "tag": _Writer.tag,
    "triggered_tags": _Writer.triggered_tags,
    "tags_with_separator": _Writer.tags_with_separator,
}


def _text(fmt: Any, key: str) -> str:
    """A string field of a format node (ValueError naming it when it is not one)."""
    value = fmt.get(key) if isinstance(fmt, Mapping) else None
    if not isinstance(value, str):
        raise ValueError(f"a structural tag {key} must be a string, got {value!r:.100}")
    return value


def _elements(fmt: Mapping[str, Any]) -> list[Any]:
    """A sequence's or or's elements (ValueError when there are none)."""
    elements = fmt.get("elements")
    if not isinstance(elements, list) or not elements:
        raise ValueError(f"{fmt.get('type')} needs elements")
    return elements


def structural_tag_lark(
    tag: Mapping[str, Any],
    bounds: JsonBounds | None,
    special: Callable[[str], int | None] = lambda _text: None,
) -> str:
    """The Lark grammar of an xgrammar-style structural tag; ValueError for what it cannot hold.

    ``special`` gives the id of the special token that spells a trigger, or None.
    """
    if tag.get("type") != "structural_tag" or "format" not in tag:
        raise ValueError('a structural tag is {"type": "structural_tag", "format": {...}}')
    writer = _Writer(bounds, special)
    start = writer.expr(tag["format"])
    lines = ["%llguidance {}", f"start: {start}", *writer.rules]
    if writer.text_used:
        lines.append(_TEXT)
    return "\n".join(lines) + "\n"
