"""Tool calls in model output: Hermes/Qwen ``<tool_call>``, Llama 3 JSON and Mistral formats.

Torch-free and Home Assistant-free: the integration, the server and the remote client share it.
"""

from __future__ import annotations

import dataclasses
import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

HERMES_OPEN = "<tool_call>"
HERMES_CLOSE = "</tool_call>"
MISTRAL_MARKER = "[TOOL_CALLS]"
MISTRAL_ARGS = "[ARGS]"
LLAMA_PYTHON_TAG = "<|python_tag|>"
MARKERS = (HERMES_OPEN, MISTRAL_MARKER, LLAMA_PYTHON_TAG)
_HERMES_BLOCK = re.compile(
    re.escape(HERMES_OPEN) + r"\s*(.*?)\s*(?:" + re.escape(HERMES_CLOSE) + r"|$)", re.DOTALL
)
_DECODER = json.JSONDecoder()


@dataclass(slots=True, frozen=True)
class ToolCall:
    """One call a model asked for: the tool's name, its arguments and a call id."""

    tool_name: str
    tool_args: dict[str, Any]
    id: str

    def to_openai(self) -> dict[str, Any]:
        """The call in OpenAI's ``tool_calls`` shape (arguments as a JSON string)."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.tool_name, "arguments": json.dumps(self.tool_args)},
        }


def new_tool_call_id() -> str:
    """A tool call id every chat template accepts (Mistral's demand 9 alphanumerics)."""
    return uuid.uuid4().hex[:9]


def template_call_id(call_id: str) -> str:
    """Map any tool call id (Home Assistant's are ULIDs) to 9 alphanumerics, stably."""
    if len(call_id) == 9 and call_id.isalnum():
        return call_id
    return uuid.uuid5(uuid.NAMESPACE_OID, call_id).hex[:9]


def _json_values(text: str) -> list[Any] | None:
    """Every JSON value in ``text`` one after another (separated by space, ``,`` or ``;``)."""
    values: list[Any] = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        try:
            value, pos = _DECODER.raw_decode(text, pos)
        except json.JSONDecodeError:
            return None
        values.append(value)
        while pos < len(text) and text[pos] in " \t\r\n,;":
            pos += 1
    return values


def _arguments(value: Any) -> dict[str, Any] | None:
    """Tool arguments as a dict; some models send them as a JSON string."""
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except json.JSONDecodeError:
            return None
    if value is None:
        return {}
    return value if isinstance(value, dict) else None


NAMESPACE_SEPARATOR = "__"


def resolve_tool_name(name: str, tool_names: set[str]) -> str:
    """The offered tool a called name means: itself, or the one it names with or without a prefix.

    Home Assistant names tools ``<domain>__<name>`` (``intent__HassTurnOn``,
    ``homeassistant__GetLiveContext``) and a merged API's colliding tools
    ``<api>__<name>``; before 2026.11 it put every merged tool under its API's name
    (``assist__intent__HassTurnOn``). Small models drop such a prefix, or write the one they
    saw in another release or in the prompt (``tools from "assist"``). A name that is not
    offered is matched, in this order, to the one offered name ending in ``__<name>``, then
    with its own prefixes dropped one at a time to an offered name or the one offered name
    ending in what is left. A name that fits no offered tool, or several, stays as it is.
    """
    if not tool_names or name in tool_names:
        return name
    parts = name.split(NAMESPACE_SEPARATOR)
    for start in range(len(parts)):
        tail = NAMESPACE_SEPARATOR.join(parts[start:])
        if not tail:
            break
        if start and tail in tool_names:
            return tail
        suffix = NAMESPACE_SEPARATOR + tail
        matches = [offered for offered in tool_names if offered.endswith(suffix)]
        if len(matches) == 1:
            return matches[0]
        if matches:
            break  # ambiguous: naming less would not make it less so
    return name


def _call_from_object(obj: Any, tool_names: set[str] | None) -> ToolCall | None:
    """A tool call from ``{"name": ..., "arguments"|"parameters": {...}}``, else None.

    With ``tool_names`` given the name must be one of them: bare JSON is only a call when
    it names an offered tool (a JSON answer is otherwise just an answer).
    """
    if not isinstance(obj, dict):
        return None
    if isinstance(obj.get("function"), dict):  # OpenAI style {"type": "function", "function": {}}
        obj = obj["function"]
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return None
    if tool_names is not None:
        name = resolve_tool_name(name, tool_names)
        if name not in tool_names:
            return None
    args = _arguments(obj.get("arguments", obj.get("parameters")))
    if args is None:
        return None
    # Small models often send empty values for optional parameters; intent tools reject them.
    args = {key: value for key, value in args.items() if value is not None and value != ""}
    return ToolCall(tool_name=name, tool_args=args, id=new_tool_call_id())


def _calls_from_json(text: str, tool_names: set[str] | None) -> list[ToolCall] | None:
    """Calls from JSON objects or arrays of them; None unless every value is a call."""
    values = _json_values(text)
    if not values:
        return None
    objects = [item for value in values for item in (value if isinstance(value, list) else [value])]
    calls = [_call_from_object(obj, tool_names) for obj in objects]
    if not calls or any(call is None for call in calls):
        return None
    return [call for call in calls if call is not None]


def _parse_hermes(text: str) -> tuple[str, list[ToolCall]] | None:
    """Hermes/Qwen: JSON calls inside ``<tool_call>`` tags anywhere in the text."""
    if HERMES_OPEN not in text:
        return None
    calls: list[ToolCall] = []
    kept: list[str] = []
    pos = 0
    for match in _HERMES_BLOCK.finditer(text):
        parsed = _calls_from_json(match.group(1), None)
        if parsed is None:
            continue  # not a call after all: the text stays as it was
        kept.append(text[pos : match.start()])
        pos = match.end()
        calls.extend(parsed)
    if not calls:
        return None
    kept.append(text[pos:])
    return "".join(kept).strip(), calls


def _parse_mistral(text: str) -> tuple[str, list[ToolCall]] | None:
    """Mistral: ``[TOOL_CALLS]`` then a JSON array, or ``name[ARGS]{...}`` per call (v11+)."""
    index = text.find(MISTRAL_MARKER)
    if index < 0:
        return None
    before, rest = text[:index], text[index + len(MISTRAL_MARKER) :]
    calls: list[ToolCall] = []
    if MISTRAL_ARGS in rest:
        for part in rest.split(MISTRAL_MARKER):
            name, sep, args_text = part.partition(MISTRAL_ARGS)
            values = _json_values(args_text) if sep else None
            call = (
                _call_from_object({"name": name.strip(), "arguments": values[0]}, None)
                if values
                else None
            )
            if call is None:
                return None
            calls.append(call)
    else:
        parsed = _calls_from_json(rest, None)
        if parsed is None:
            return None
        calls = parsed
    return before.strip(), calls


def _parse_bare_json(text: str, tool_names: set[str]) -> tuple[str, list[ToolCall]] | None:
    """Llama 3 (and Mistral with its marker decoded away): the whole answer is JSON calls."""
    body = text.strip().removeprefix(LLAMA_PYTHON_TAG).strip()
    if not body.startswith(("{", "[")):
        return None
    calls = _calls_from_json(body, tool_names)
    return ("", calls) if calls else None


def parse_tool_calls(text: str, tool_names: set[str]) -> tuple[str, list[ToolCall]]:
    """Split model output into the text for the user and the tool calls it makes.

    Each call's name is resolved to the offered tool it means (``resolve_tool_name``).
    """
    for parsed in (
        _parse_hermes(text),
        _parse_mistral(text),
        _parse_bare_json(text, tool_names),
    ):
        if parsed is not None:
            content, calls = parsed
            return content, [
                call
                if (name := resolve_tool_name(call.tool_name, tool_names)) == call.tool_name
                else dataclasses.replace(call, tool_name=name)
                for call in calls
            ]
    return text, []


def _could_start_marker(tail: str) -> int:
    """Length of the longest end of ``tail`` that could begin a marker."""
    for length in range(min(len(tail), max(map(len, MARKERS)) - 1), 0, -1):
        if any(marker.startswith(tail[-length:]) for marker in MARKERS):
            return length
    return 0


@dataclass
class ToolCallStream:
    """Streams text to the user while holding back whatever may turn out to be a tool call.

    Text before a tool-call marker streams at once; from a marker on, or when the answer
    opens with JSON (Llama 3 and marker-less Mistral calls), text is held until the end
    and then parsed.
    """

    tool_names: set[str]
    _text: str = ""
    _emitted: int = 0
    _holding: bool = False
    calls: list[ToolCall] = field(default_factory=list)

    def feed(self, delta: str) -> str:
        """Add a text delta; return the text that is safe to show now."""
        self._text += delta
        if self._holding:
            return ""
        pending = self._text[self._emitted :]
        if self._emitted == 0:
            start = pending.lstrip()
            if not start:
                return ""
            if start[0] in "{[":
                self._holding = True
                return ""
        found = [i for i in (pending.find(marker) for marker in MARKERS) if i >= 0]
        if found:
            end = min(found)
            self._holding = True
        else:
            end = len(pending) - _could_start_marker(pending)
        out = pending[:end]
        self._emitted += end
        return out

    def finish(self) -> str:
        """Parse what was held back; return its text for the user and keep its calls."""
        rest = self._text[self._emitted :]
        self._emitted = len(self._text)
        content, self.calls = parse_tool_calls(rest, self.tool_names)
        return content
