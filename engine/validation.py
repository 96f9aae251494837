"""Type checks at the engine's public entry points: every error names the argument."""

from __future__ import annotations

from typing import Any

from paged_llm.engine.core.sequence import Priority, SamplingParams
from paged_llm.engine.errors import InvalidArgument
from paged_llm.protocol.priority import parse_priority


def check_prompt(prompt: object) -> None:
    """A prompt is text, a list of token ids (ints), or a list of chat messages (dicts)."""
    if isinstance(prompt, str):
        return
    if not isinstance(prompt, list | tuple):
        raise InvalidArgument(
            "prompt",
            "prompt must be text, a list of token ids (ints) or a list of chat messages "
            f"(dicts), got {type(prompt).__name__}",
        )
    if not prompt:
        return  # the empty prompt is refused as such by the engine
    if isinstance(prompt[0], dict):
        for index, message in enumerate(prompt):
            check_message(index, message)
        return
    check_token_ids(prompt, "prompt")


def check_token_ids(token_ids: object, argument: str = "prompt_token_ids") -> None:
    """Token ids are a list of ints (bools are not token ids)."""
    if not isinstance(token_ids, list | tuple):
        raise InvalidArgument(
            argument, f"{argument} must be a list of ints, got {type(token_ids).__name__}"
        )
    for index, token in enumerate(token_ids):
        if isinstance(token, bool) or not isinstance(token, int):
            label = "prompt token ids" if argument == "prompt" else argument
            raise InvalidArgument(
                argument, f"{label} must be ints, got {type(token).__name__} at index {index}"
            )


def check_message(index: int, message: object) -> None:
    """A chat message is a dict with a text role and text, a list of parts, or no content."""
    if not isinstance(message, dict):
        raise InvalidArgument(
            "prompt", f"prompt message {index} must be a dict, got {type(message).__name__}"
        )
    role = message.get("role")
    if not isinstance(role, str) or not role:
        raise InvalidArgument("prompt", f"prompt message {index} needs a text 'role'")
    content = message.get("content")
    if content is not None and not isinstance(content, str | list):
        raise InvalidArgument(
            "prompt",
            f"prompt message {index} 'content' must be text or a list of parts, "
            f"got {type(content).__name__}",
        )


def check_params(params: object) -> SamplingParams:
    """Sampling parameters are a SamplingParams or None (the defaults)."""
    if params is None:
        return SamplingParams()
    if not isinstance(params, SamplingParams):
        raise InvalidArgument(
            "params", f"params must be a SamplingParams or None, got {type(params).__name__}"
        )
    return params


def check_priority(priority: object) -> Priority:
    """A priority is a Priority, its name or vLLM's integer (protocol.priority)."""
    try:
        return parse_priority(priority)
    except ValueError as err:
        raise InvalidArgument("priority", str(err)) from None


def check_request_id(request_id: object) -> None:
    """A caller's request id is non-empty text or None (the engine picks one)."""
    if request_id is not None and (not isinstance(request_id, str) or not request_id):
        raise InvalidArgument(
            "request_id", f"request_id must be non-empty text or None, got {request_id!r}"
        )


# apply_chat_template's own arguments, which a template's variables must not replace.
_TEMPLATE_ARGUMENTS = frozenset(
    {
        "conversation",
        "tools",
        "documents",
        "chat_template",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
    }
)


def check_template_kwargs(kwargs: object) -> dict[str, Any] | None:
    """Variables for the chat template (``enable_thinking``): a dict by name, or None."""
    if kwargs is None:
        return None
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        raise InvalidArgument(
            "chat_template_kwargs", f"chat_template_kwargs must be a dict by name, got {kwargs!r}"
        )
    if taken := sorted(_TEMPLATE_ARGUMENTS & kwargs.keys()):
        raise InvalidArgument(
            "chat_template_kwargs", f"chat_template_kwargs cannot set {', '.join(taken)}"
        )
    return kwargs


def check_tools(tools: object) -> list[dict[str, Any]] | None:
    """Tools are a list of dicts (JSON tool definitions) or None."""
    if tools is None:
        return None
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise InvalidArgument("tools", f"tools must be a list of dicts or None, got {tools!r}")
    return tools


def check_arrival_time(arrival_time: object) -> None:
    """An arrival time is a number on the engine's clock, or None (now)."""
    if arrival_time is not None and (
        isinstance(arrival_time, bool) or not isinstance(arrival_time, int | float)
    ):
        raise InvalidArgument(
            "arrival_time", f"arrival_time must be a number or None, got {arrival_time!r}"
        )
