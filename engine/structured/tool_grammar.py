"""Structural tags that hold tool calls to a model's own format, offered names and schemas."""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from typing import Any

# At most one whitespace character between JSON tokens inside a call: the one-line layout
# the formats show; more lets a small model drift into runs of newlines until max_tokens.
_MAX_WHITESPACE = 1


class ToolCallFormat(enum.StrEnum):
    """How a model writes tool calls (the formats the integration reads back)."""

    HERMES = "hermes"  # <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call> (Qwen too)
    LLAMA3 = "llama3"  # {"name": ..., "parameters": {...}}
    MISTRAL = "mistral"  # [TOOL_CALLS][{"name": ..., "arguments": {...}}]


# (trigger, text before the name, text between name and arguments, text after arguments)
_SHAPES: dict[ToolCallFormat, tuple[str, str, str, str]] = {
    ToolCallFormat.HERMES: (
        "<tool_call>",
        '<tool_call>\n{"name": "',
        '", "arguments": ',
        "}\n</tool_call>",
    ),
    ToolCallFormat.LLAMA3: ('{"name": ', '{"name": "', '", "parameters": ', "}"),
    ToolCallFormat.MISTRAL: ("[TOOL_CALLS]", '[TOOL_CALLS][{"name": "', '", "arguments": ', "}]"),
}


def detect_tool_call_format(chat_template: str | None) -> ToolCallFormat:
    """The format a chat template teaches its model; Hermes when it shows none.

    Templates that know nothing of tools get the Hermes instructions from the integration.
    """
    template = chat_template or ""
    if "[TOOL_CALLS]" in template:
        return ToolCallFormat.MISTRAL
    if "<tool_call>" in template:
        return ToolCallFormat.HERMES
    if "<|python_tag|>" in template or '"parameters": ' in template:
        return ToolCallFormat.LLAMA3
    return ToolCallFormat.HERMES


def _tool_name(tool: Mapping[str, Any]) -> str:
    """The function name of an OpenAI-style tool (``{"type": "function", "function": {...}}``)."""
    function = tool.get("function", tool)
    name = function.get("name") if isinstance(function, Mapping) else None
    if not isinstance(name, str) or not name:
        raise ValueError(f"tools: every tool needs a function name, got {tool!r:.200}")
    return name


def _parameters(tool: Mapping[str, Any]) -> dict[str, Any]:
    """The tool's parameter schema; a tool without one takes an object."""
    function = tool.get("function", tool)
    schema = function.get("parameters") if isinstance(function, Mapping) else None
    return dict(schema) if isinstance(schema, Mapping) else {"type": "object"}


def _chosen_name(tool_choice: str | Mapping[str, Any]) -> str | None:
    """The function a named tool choice asks for (OpenAI's shape, or just a name)."""
    if isinstance(tool_choice, Mapping):
        function = tool_choice.get("function", tool_choice)
        name = function.get("name") if isinstance(function, Mapping) else None
        if isinstance(name, str) and name:
            return name
        raise ValueError(f"tool_choice names no function: {tool_choice!r:.200}")
    return None


def tool_call_structural_tag(
    tools: Sequence[Mapping[str, Any]],
    fmt: ToolCallFormat = ToolCallFormat.HERMES,
    tool_choice: str | Mapping[str, Any] = "auto",
) -> dict[str, Any] | None:
    """An xgrammar structural tag: free text, or calls of offered tools with fitting arguments.

    ``tool_choice`` is OpenAI's: ``"auto"`` (text or calls), ``"required"`` (at least one
    call), ``"none"`` (no constraint: None is returned) or a named function (only that
    one, at least once). Text stays free until a call's trigger appears; from there the
    name must be an offered tool's and the arguments must fit its parameter schema.
    """
    if tool_choice == "none" or not tools:
        return None
    named = _chosen_name(tool_choice)
    if named is None and tool_choice not in ("auto", "required"):
        raise ValueError(
            f"tool_choice must be 'auto', 'none', 'required' or a function, got {tool_choice!r}"
        )
    by_name = {_tool_name(tool): tool for tool in tools}
    if named is not None:
        if named not in by_name:
            raise ValueError(f"tool_choice names {named!r}, which is not among the tools")
        by_name = {named: by_name[named]}
    trigger, before, between, after = _SHAPES[fmt]
    tags = [
        {
            "type": "tag",
            "begin": f"{before}{name}{between}",
            "content": {
                "type": "json_schema",
                "json_schema": _parameters(tool),
                "max_whitespace_cnt": _MAX_WHITESPACE,
            },
            "end": after,
        }
        for name, tool in by_name.items()
    ]
    fmt_spec = {
        "type": "triggered_tags",
        "triggers": [trigger],
        "tags": tags,
        "at_least_one": tool_choice != "auto",
        # Llama 3 and Mistral answers end with their call: text after it breaks the format.
        "stop_after_first": fmt is not ToolCallFormat.HERMES,
    }
    return {"type": "structural_tag", "format": fmt_spec}
