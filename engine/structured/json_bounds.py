"""Bounds on free JSON numbers and item counts in a schema, so an answer cannot run on forever.

A JSON schema lets a number have any count of digits and an array or object any count of
items. Greedy decoding with a small model then sometimes never leaves one
(``200.1234567895111…``, ``[1, 1, 1, …``) until ``max_tokens`` cuts the JSON off. These
bounds are written into the schema before llguidance compiles it, as the schema keywords
llguidance enforces in its grammar:

- a number or integer without a range gets one: fewer than ``integer_digits`` digits
  before the point (``exclusiveMinimum``/``exclusiveMaximum`` of ``±10**integer_digits``);
- a number without ``multipleOf`` gets ``multipleOf: 10**-fraction_digits``, at most that
  many digits after the point (llguidance writes a bounded number without an exponent);
- an array without ``maxItems`` gets ``maxItems: items``, and a free object (values under
  ``additionalProperties``, all its listed properties required) ``maxProperties: items``;
- a value the schema leaves free (``{}``, ``true``, an array without ``items``) is any JSON
  value under the same bounds.

Strings are left free in the grammar: a bounded run of string characters costs mask time
on every token of the string. ``string_chars`` is kept by the engine instead (output.py:
once an open string has that many characters, its closing quote is forced where the
grammar takes it), and closer.py holds an answer to its shortest way to the end as
``max_tokens`` nears. A schema's own bounds (``maxLength``, ``maxItems``, numeric ranges)
stay as written.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# Where the bounded "any JSON value" schema is kept in a schema's $defs (a name no
# caller's schema uses: $ref resolves against the root).
ANY_VALUE = "paged_llm_any_value"
_ANY_REF = {"$ref": f"#/$defs/{ANY_VALUE}"}
# Keywords whose value is one subschema, a list of them, or a name -> subschema map.
_ONE = ("items", "additionalProperties", "not", "if", "then", "else", "contains")
_LIST = ("anyOf", "oneOf", "allOf", "prefixItems")
_MAP = ("properties", "patternProperties", "$defs", "definitions")


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


def any_value_schema(bounds: JsonBounds) -> dict[str, Any]:
    """Any JSON value, its numbers and item counts bounded (its members refer back to it)."""
    return {
        "anyOf": [
            {"type": "null"},
            {"type": "boolean"},
            _bound_number({"type": "number"}, bounds),
            {"type": "string"},
            {"type": "array", "items": dict(_ANY_REF), "maxItems": bounds.items},
            {
                "type": "object",
                "additionalProperties": dict(_ANY_REF),
                "maxProperties": bounds.items,
            },
        ]
    }


def any_object_schema(bounds: JsonBounds | None) -> dict[str, Any]:
    """Any JSON object (``json_object``), bounded when ``bounds`` is given."""
    if bounds is None:
        return {"type": "object"}
    schema: dict[str, Any] = bounded_schema(
        {"type": "object", "additionalProperties": True}, bounds, strict=False
    )
    return schema


def bounded_schema(schema: Any, bounds: JsonBounds | None, *, strict: bool) -> Any:
    """``schema`` with its free numbers and items bounded (a copy; the caller's stays).

    ``strict``: an object schema that says nothing of other properties takes none (the
    OpenAI and xgrammar reading of a tool's or answer's schema), rather than JSON
    schema's default of any. Without ``bounds`` only that is applied.
    """
    if not isinstance(schema, Mapping):
        return schema
    root = copy.deepcopy(dict(schema))
    walker = _Walker(bounds, strict)
    root = walker.node(root)
    if walker.used_any and bounds is not None:
        defs = root.setdefault("$defs", {})
        defs[ANY_VALUE] = _Walker(bounds, strict=False).node(any_value_schema(bounds))
    return root


class _Walker:
    """One pass over a schema's subschemas, bounding each in place."""

    def __init__(self, bounds: JsonBounds | None, strict: bool) -> None:
        """Remember the bounds and whether objects are closed by default."""
        self.bounds = bounds
        self.strict = strict
        self.used_any = False

    def free(self) -> Any:
        """A free value: the bounded any-value schema (or left free without bounds)."""
        if self.bounds is None:
            return {}
        self.used_any = True
        return dict(_ANY_REF)

    def node(self, schema: Any) -> Any:
        """One subschema, bounded; ``true`` and ``{}`` become the bounded any-value."""
        if schema is True or schema == {}:
            return self.free()
        if not isinstance(schema, dict):
            return schema  # false, or something the compiler will refuse by name
        for key in _ONE:
            if key in schema and not (key == "additionalProperties" and schema[key] is False):
                schema[key] = self.node(schema[key])
        for key in _LIST:
            if isinstance(schema.get(key), list):
                schema[key] = [self.node(item) for item in schema[key]]
        for key in _MAP:
            if isinstance(schema.get(key), dict):
                schema[key] = {name: self.node(sub) for name, sub in schema[key].items()}
        types = schema.get("type")
        kinds = set(types) if isinstance(types, list) else {types}
        if types is None:  # a schema that says only what an object's or array's parts are
            kinds |= {"object"} if {"properties", "required"} & set(schema) else set()
            kinds |= {"array"} if {"items", "prefixItems"} & set(schema) else set()
        if "object" in kinds:
            self._object(schema)
        if self.bounds is None:
            return schema
        if "array" in kinds:
            self._array(schema, self.bounds)
        if "number" in kinds:
            _bound_number(schema, self.bounds)
        elif "integer" in kinds:
            _bound_integer(schema, self.bounds)
        return schema

    def _object(self, schema: dict[str, Any]) -> None:
        """Close a strict object; bound the count of a free one's members."""
        if "additionalProperties" not in schema and "patternProperties" not in schema:
            if self.strict:
                schema["additionalProperties"] = False
                return
            schema["additionalProperties"] = self.free()
        if self.bounds is None or schema.get("additionalProperties") is False:
            return
        listed = set(schema.get("properties") or ())
        # llguidance bounds the member count only where every listed property is required.
        if "maxProperties" not in schema and listed <= set(schema.get("required") or ()):
            schema["maxProperties"] = max(self.bounds.items, len(listed))

    def _array(self, schema: dict[str, Any], bounds: JsonBounds) -> None:
        """Items of any kind where none are given, and at most ``items`` of them."""
        if "items" not in schema and "prefixItems" not in schema:
            schema["items"] = self.free()
        if "maxItems" not in schema:
            schema["maxItems"] = max(bounds.items, int(schema.get("minItems", 0)))


def _bound_number(schema: dict[str, Any], bounds: JsonBounds) -> dict[str, Any]:
    """A number's integer digits and fraction digits bounded, where it sets no range of its own."""
    limit = 10**bounds.integer_digits
    if not {"minimum", "exclusiveMinimum"} & set(schema):
        schema["exclusiveMinimum"] = -limit
    if not {"maximum", "exclusiveMaximum"} & set(schema):
        schema["exclusiveMaximum"] = limit
    schema.setdefault("multipleOf", 10.0**-bounds.fraction_digits)
    return schema


def _bound_integer(schema: dict[str, Any], bounds: JsonBounds) -> None:
    """An integer's digits bounded, where it sets no range of its own."""
    limit = 10**bounds.integer_digits - 1
    if not {"minimum", "exclusiveMinimum"} & set(schema):
        schema["minimum"] = -limit
    if not {"maximum", "exclusiveMaximum"} & set(schema):
        schema["maximum"] = limit


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
