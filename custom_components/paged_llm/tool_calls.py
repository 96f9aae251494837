"""Tool calls for Home Assistant: the library's parser, handing back ``llm.ToolInput``."""

from __future__ import annotations

from dataclasses import dataclass, field

from homeassistant.helpers import llm

from paged_llm.protocol import tool_calls as _protocol
from paged_llm.protocol.tool_calls import (
    HERMES_CLOSE,
    HERMES_OPEN,
    ToolCall,
    new_tool_call_id,
    template_call_id,
)

__all__ = [
    "HERMES_CLOSE",
    "HERMES_OPEN",
    "ToolCallStream",
    "new_tool_call_id",
    "parse_tool_calls",
    "template_call_id",
    "to_tool_input",
]


def to_tool_input(call: ToolCall) -> llm.ToolInput:
    """The library's tool call as Home Assistant's ``ToolInput``."""
    return llm.ToolInput(tool_name=call.tool_name, tool_args=call.tool_args, id=call.id)


def parse_tool_calls(text: str, tool_names: set[str]) -> tuple[str, list[llm.ToolInput]]:
    """Split model output into the text for the user and the tool calls it makes."""
    content, calls = _protocol.parse_tool_calls(text, tool_names)
    return content, [to_tool_input(call) for call in calls]


@dataclass
class ToolCallStream:
    """The library's streaming hold-back parser, with calls as Home Assistant ``ToolInput``."""

    tool_names: set[str]
    calls: list[llm.ToolInput] = field(default_factory=list)
    _parser: _protocol.ToolCallStream = field(init=False)

    def __post_init__(self) -> None:
        """Start the library parser over the same tools."""
        self._parser = _protocol.ToolCallStream(self.tool_names)

    def feed(self, delta: str) -> str:
        """Add a text delta; return the text that is safe to show now."""
        shown: str = self._parser.feed(delta)
        return shown

    def finish(self) -> str:
        """Parse what was held back; return its text for the user and keep its calls."""
        content: str = self._parser.finish()
        self.calls = [to_tool_input(call) for call in self._parser.calls]
        return content
