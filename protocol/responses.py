"""OpenAI response shapes: chat completions, their stream chunks, text completions, usage."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from .tool_calls import ToolCall

DONE = "[DONE]"


@dataclass(slots=True, frozen=True)
class Usage:
    """Token counts of one request."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0

    def to_openai(self) -> dict[str, Any]:
        """OpenAI's ``usage`` object."""
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }


def new_id(prefix: str) -> str:
    """A response id such as ``chatcmpl-…``."""
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    """``created``: Unix seconds."""
    return int(time.time())


def chat_completion(
    response_id: str,
    model: str,
    content: str,
    tool_calls: list[ToolCall],
    finish_reason: str,
    usage: Usage,
    created: int | None = None,
) -> dict[str, Any]:
    """A whole ``chat.completion`` object."""
    message: dict[str, Any] = {"role": "assistant", "content": content or None}
    if tool_calls:
        message["tool_calls"] = [call.to_openai() for call in tool_calls]
    elif message["content"] is None:
        message["content"] = ""
    return {
        "id": response_id,
        "object": "chat.completion",
        "created": created or now(),
        "model": model,
        "choices": [
            {"index": 0, "message": message, "finish_reason": finish_reason, "logprobs": None}
        ],
        "usage": usage.to_openai(),
    }


def chat_chunk(
    response_id: str,
    model: str,
    created: int,
    delta: dict[str, Any] | None,
    finish_reason: str | None = None,
    usage: Usage | None = None,
) -> dict[str, Any]:
    """One ``chat.completion.chunk``; a usage-only chunk (``delta`` None) has no choices."""
    chunk: dict[str, Any] = {
        "id": response_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": []
        if delta is None
        else [{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}],
    }
    if usage is not None or delta is None:
        chunk["usage"] = usage.to_openai() if usage is not None else None
    return chunk


def tool_call_deltas(calls: list[ToolCall]) -> dict[str, Any]:
    """A stream delta carrying whole tool calls, each with its index."""
    return {
        "tool_calls": [{"index": i, **call.to_openai()} for i, call in enumerate(calls)],
    }


def text_completion(
    response_id: str,
    model: str,
    created: int,
    text: str,
    finish_reason: str | None,
    usage: Usage | None = None,
) -> dict[str, Any]:
    """A ``text_completion`` object (whole, or one stream chunk)."""
    body: dict[str, Any] = {
        "id": response_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "text": text, "finish_reason": finish_reason, "logprobs": None}],
    }
    if usage is not None:
        body["usage"] = usage.to_openai()
    return body


def models_list(names: list[str], created: int, max_model_len: int | None) -> dict[str, Any]:
    """``/v1/models``: the served model (vLLM adds ``max_model_len``)."""
    return {
        "object": "list",
        "data": [
            {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": "paged-llm",
                "root": name,
                "max_model_len": max_model_len,
            }
            for name in names
        ],
    }
