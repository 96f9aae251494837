"""Turn a Home Assistant chat log into chat messages for the model's chat template."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import probatio
from homeassistant.components import conversation
from homeassistant.exceptions import HomeAssistantError
from homeassistant.helpers import llm
from homeassistant.helpers.json import json_dumps

from paged_llm.protocol.tool_prompt import (
    template_shows_tools,
    template_source,
    tools_as_text,
    uses_tools,
)

from .const import DOMAIN
from .tool_calls import template_call_id

# The agents' default instructions: Home Assistant's, with today's date and the time in
# words a small model reads (it also appends its own terse time line after the tools).
DEFAULT_INSTRUCTIONS = """You are a voice assistant for Home Assistant.
It is now {{ now().strftime("%A, %d %B %Y, %H:%M") }}.
Answer questions about the world truthfully.
Respond simply and to the point in plain text.
"""

# Without an LLM API the model has no tools: it must not pretend to switch things.
NO_CONTROL_INSTRUCTION = (
    "You cannot control, switch or check any device in this home. When asked to, say "
    "plainly that you cannot do that; never claim that you did it."
)

JSON_INSTRUCTION = (
    "Answer with only a JSON value that matches this JSON schema, with no other text and "
    "no code fences:\n{schema}"
)

PLAIN_ROLES = {"system": "", "user": "User: ", "assistant": "Assistant: ", "tool": "Tool: "}
PLAIN_STOP = ("\nUser:",)


def chat_template(tokenizer: Any) -> str | None:
    """The tokenizer's chat template source, if it has one."""
    return template_source(getattr(tokenizer, "chat_template", None))


def template_knows_tools(tokenizer: Any) -> bool:
    """Whether the chat template renders a ``tools`` list itself."""
    return template_shows_tools(chat_template(tokenizer))


def format_tool(tool: llm.Tool, custom_serializer: Callable[[Any], Any] | None) -> dict[str, Any]:
    """A Home Assistant tool in the OpenAI function format chat templates expect."""
    spec: dict[str, Any] = {
        "name": tool.name,
        "parameters": probatio.to_openapi(
            tool.parameters, custom_serializer=custom_serializer, openapi_version="3.1.0"
        ),
    }
    if tool.description:
        spec["description"] = tool.description
    return {"type": "function", "function": spec}


def structure_schema(
    structure: probatio.Schema, custom_serializer: Callable[[Any], Any] | None
) -> dict[str, Any]:
    """The JSON schema of an AI task's structure, converted the way Home Assistant does it."""
    schema: dict[str, Any] = probatio.to_openapi(
        structure,
        custom_serializer=custom_serializer or llm.selector_serializer,
        openapi_version="3.1.0",
    )
    return schema


def json_schema_instruction(schema: dict[str, Any]) -> str:
    """The instruction that asks for JSON matching an AI task's schema."""
    return JSON_INSTRUCTION.format(schema=json.dumps(schema))


def agent_instructions(prompt: str | None, can_control: bool) -> str:
    """The agent's instructions, with the no-control sentence when it has no LLM API."""
    text = prompt if prompt and prompt.strip() else DEFAULT_INSTRUCTIONS
    if can_control:
        return text
    return f"{text.rstrip()}\n{NO_CONTROL_INSTRUCTION}\n"


def trim_history(
    content: Sequence[conversation.Content], max_history: int
) -> list[conversation.Content]:
    """Keep the system prompt, the last ``max_history`` rounds and the current one."""
    content = list(content)
    if max_history < 1:
        return content
    user_turns = [i for i, item in enumerate(content) if isinstance(item, conversation.UserContent)]
    if len(user_turns) - 1 <= max_history:
        return content
    return [content[0], *content[user_turns[-(max_history + 1)] :]]


def build_messages(
    content: Sequence[conversation.Content],
    *,
    tools: list[dict[str, Any]] | None,
    native_tools: bool,
    json_instruction: str | None = None,
) -> list[dict[str, Any]]:
    """Chat messages for the template.

    With ``native_tools`` the template receives tool calls and results in the structured
    form; otherwise tools are described in the system prompt and calls and results are
    written as text, which any chat template renders.
    """
    messages: list[dict[str, Any]] = []
    for item in content:
        if isinstance(item, conversation.SystemContent):
            messages.append({"role": "system", "content": item.content})
        elif isinstance(item, conversation.UserContent):
            if item.attachments:
                raise HomeAssistantError(
                    translation_domain=DOMAIN, translation_key="attachments_not_supported"
                )
            messages.append({"role": "user", "content": item.content})
        elif isinstance(item, conversation.AssistantContent):
            message: dict[str, Any] = {"role": "assistant", "content": item.content or ""}
            if item.tool_calls:
                message["tool_calls"] = [
                    {
                        "id": template_call_id(call.id),
                        "type": "function",
                        "function": {"name": call.tool_name, "arguments": call.tool_args},
                    }
                    for call in item.tool_calls
                ]
            messages.append(message)
        elif isinstance(item, conversation.ToolResultContent):
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": template_call_id(item.tool_call_id),
                    "name": item.tool_name,
                    "content": json_dumps({"data": item.result.data, "error": item.result.error}),
                }
            )
    if not native_tools and uses_tools(messages, tools):
        messages = tools_as_text(messages, tools)
    if json_instruction:
        for message in reversed(messages):
            if message["role"] == "user":
                message["content"] = f"{message['content']}\n\n{json_instruction}"
                break
        else:
            messages.append({"role": "user", "content": json_instruction})
    return messages


def render_plain(messages: Sequence[dict[str, Any]]) -> str:
    """A transcript prompt for models without a chat template (base models)."""
    lines = [f"{PLAIN_ROLES.get(m['role'], '')}{m.get('content') or ''}" for m in messages]
    return "\n".join(lines) + "\nAssistant:"
