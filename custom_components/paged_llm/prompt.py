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

from .const import DOMAIN
from .tool_calls import HERMES_CLOSE, HERMES_OPEN, template_call_id

# For templates that know nothing of tools: the Hermes convention, which small instruct
# models have seen most and which the parser reads back.
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
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        template = template.get("tool_use") or template.get("default")
    return template if isinstance(template, str) and template.strip() else None


def template_knows_tools(tokenizer: Any) -> bool:
    """Whether the chat template renders a ``tools`` list itself."""
    template = chat_template(tokenizer)
    return template is not None and "tools" in template


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


def _tool_call_text(call: llm.ToolInput) -> str:
    """One tool call in the Hermes text form."""
    payload = json.dumps({"name": call.tool_name, "arguments": call.tool_args})
    return f"{HERMES_OPEN}\n{payload}\n{HERMES_CLOSE}"


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
            text = item.content
            if tools and not native_tools:
                listing = "\n".join(json.dumps(tool["function"]) for tool in tools)
                text = f"{text}\n\n{TOOL_PROMPT.format(tools=listing)}".strip()
            messages.append({"role": "system", "content": text})
        elif isinstance(item, conversation.UserContent):
            if item.attachments:
                raise HomeAssistantError(
                    translation_domain=DOMAIN, translation_key="attachments_not_supported"
                )
            messages.append({"role": "user", "content": item.content})
        elif isinstance(item, conversation.AssistantContent):
            calls = item.tool_calls or []
            if native_tools:
                message: dict[str, Any] = {"role": "assistant", "content": item.content or ""}
                if calls:
                    message["tool_calls"] = [
                        {
                            "id": template_call_id(call.id),
                            "type": "function",
                            "function": {"name": call.tool_name, "arguments": call.tool_args},
                        }
                        for call in calls
                    ]
                messages.append(message)
            else:
                parts = [item.content or "", *(_tool_call_text(call) for call in calls)]
                messages.append({"role": "assistant", "content": "\n".join(p for p in parts if p)})
        elif isinstance(item, conversation.ToolResultContent):
            result = json_dumps({"data": item.result.data, "error": item.result.error})
            if native_tools:
                messages.append(
                    {
                        "role": "tool",
                        "tool_call_id": template_call_id(item.tool_call_id),
                        "name": item.tool_name,
                        "content": result,
                    }
                )
            else:
                text = f"<tool_response>\n{result}\n</tool_response>"
                previous = messages[-1] if messages else None
                if previous and previous.get("tool_response"):
                    previous["content"] += "\n" + text
                else:
                    messages.append({"role": "user", "content": text, "tool_response": True})
    for message in messages:
        message.pop("tool_response", None)
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
