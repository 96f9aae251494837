"""Tools for a chat template that shows none: the Hermes instructions and the text turns.

A chat template that renders no ``tools`` list (the bundled SmolLM2's, many small
models') drops the tools a request offers, so the model never sees them. Such a
conversation is rewritten in the Hermes convention, which small instruct models have
seen most and which the tool-call parser reads back: the tools listed in the system
prompt, earlier calls as ``<tool_call>`` text, their results as ``<tool_response>`` user
turns. The engine does it for the server's requests and the integration for its own, so
a model sees the same prompt whichever runs it. Torch-free and Home Assistant-free.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from .tool_calls import HERMES_CLOSE, HERMES_OPEN

TOOL_PROMPT = """# Tools

You may call one or more functions to assist with the user query.
You are provided with function signatures within <tools></tools> XML tags:
<tools>
{tools}
</tools>

For each function call, return a JSON object with the function name and arguments within \
<tool_call></tool_call> XML tags:
<tool_call>
{{"name": <function-name>, "arguments": <args-json-object>}}
</tool_call>"""


def template_source(value: Any) -> str | None:
    """A tokenizer's ``chat_template`` as the text used with tools (its tool_use variant)."""
    if isinstance(value, Mapping):
        value = value.get("tool_use") or value.get("default")
    return value if isinstance(value, str) and value.strip() else None


def template_shows_tools(template: str | None) -> bool:
    """Whether a chat template renders a ``tools`` list itself."""
    return template is not None and "tools" in template


def uses_tools(messages: Sequence[Mapping[str, Any]], tools: Sequence[Any] | None) -> bool:
    """Whether a conversation offers tools or holds tool calls or results."""
    return bool(tools) or any(m.get("role") == "tool" or m.get("tool_calls") for m in messages)


def tools_as_text(
    messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None
) -> list[dict[str, Any]]:
    """``messages`` (OpenAI's chat shape) with the tools and tool turns written as text.

    The first system message gets the Hermes instructions and the tools (a system message
    is added when there is none); an assistant's calls become ``<tool_call>`` blocks after
    its text; tool results become one user turn of ``<tool_response>`` blocks per run of
    results. Other messages are kept as they are.
    """
    out: list[dict[str, Any]] = []
    listed = not tools
    results: dict[str, Any] | None = None  # the user turn the current run of results fills
    for message in messages:
        role = message.get("role")
        if role == "tool":
            text = f"<tool_response>\n{_text(message.get('content'))}\n</tool_response>"
            if results is None:
                results = {"role": "user", "content": text}
                out.append(results)
            else:
                results["content"] += "\n" + text
            continue
        results = None
        copy = dict(message)
        if role == "system" and not listed:
            copy["content"] = _with_tools(_text(message.get("content")), tools or ())
            listed = True
        elif role == "assistant" and message.get("tool_calls"):
            calls = [_call_text(call) for call in copy.pop("tool_calls")]
            parts = [_text(message.get("content")), *calls]
            copy["content"] = "\n".join(p for p in parts if p)
        out.append(copy)
    if not listed:
        out.insert(0, {"role": "system", "content": _with_tools("", tools or ())})
    return out


def _with_tools(text: str, tools: Sequence[Mapping[str, Any]]) -> str:
    """A system prompt followed by the Hermes instructions listing ``tools``."""
    listing = "\n".join(json.dumps(tool.get("function", tool)) for tool in tools)
    return f"{text}\n\n{TOOL_PROMPT.format(tools=listing)}".strip()


def _call_text(call: Mapping[str, Any]) -> str:
    """One call (OpenAI's shape; arguments as a JSON string or an object) as Hermes text."""
    function = call.get("function", call)
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        with contextlib.suppress(ValueError):  # else shown as the string it is
            arguments = json.loads(arguments)
    payload = json.dumps({"name": function.get("name"), "arguments": arguments})
    return f"{HERMES_OPEN}\n{payload}\n{HERMES_CLOSE}"


def _text(content: Any) -> str:
    """A message's content as text: a string, or the text parts of a list of parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        return "".join(part.get("text", "") for part in content if isinstance(part, Mapping))
    return str(content)
