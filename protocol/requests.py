"""OpenAI chat and completion requests: parsed and checked, every error naming its field."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from .errors import ApiError, bad_field
from .priority import DEFAULT_PRIORITY, Priority, parse_priority
from .tool_calls import template_call_id

ROLES = ("system", "developer", "user", "assistant", "tool")
# OpenAI's bound on top_logprobs, and vLLM's default max_logprobs: the engine's too.
MAX_LOGPROBS = 20
TOOL_CHOICES = ("none", "auto", "required")


@dataclass(slots=True)
class ResponseFormat:
    """What shape the answer must have: free text, any JSON object, or a JSON schema."""

    type: str = "text"
    schema: dict[str, Any] | None = None
    name: str | None = None
    strict: bool = False


@dataclass(slots=True)
class GenerationRequest:
    """The fields chat and completion requests share."""

    model: str | None = None
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0  # vLLM's and llama.cpp's extension; 0 is off
    stop: tuple[str, ...] = ()
    seed: int | None = None
    stream: bool = False
    include_usage: bool = False
    priority: Priority = DEFAULT_PRIORITY
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float | None = None  # None: the model's own
    ignore_eos: bool = False
    # Alternatives per generated token (0: the chosen token's alone); None: no logprobs.
    logprobs: int | None = None
    # vLLM's prompt_logprobs: the prompt tokens' logprobs with this many alternatives.
    prompt_logprobs: int | None = None
    # This server's extension: score the prompt from this position on (negative: from its
    # end), so the prefix before it may come from the prefix cache. vLLM ignores the field
    # and scores the whole prompt: the same numbers for the positions asked.
    prompt_logprobs_from: int = 0


@dataclass(slots=True)
class ChatRequest(GenerationRequest):
    """A ``/v1/chat/completions`` request, messages ready for a chat template."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    tools: list[dict[str, Any]] = field(default_factory=list)
    tool_choice: str | dict[str, Any] = "auto"
    # This server's extension: the same tools with narrower argument schemas (Home
    # Assistant's home grammar), for decoding only; the prompt shows ``tools``.
    tool_grammar: list[dict[str, Any]] = field(default_factory=list)
    response_format: ResponseFormat = field(default_factory=ResponseFormat)
    # vLLM's: variables for the chat template, such as Qwen3's enable_thinking.
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def tool_names(self) -> set[str]:
        """Names of the tools the model may call (only the chosen one when one is forced)."""
        if self.tool_choice == "none":
            return set()
        if isinstance(self.tool_choice, dict):
            return {self.tool_choice["function"]["name"]}
        return {tool["function"]["name"] for tool in self.tools}

    @property
    def template_tools(self) -> list[dict[str, Any]] | None:
        """Tools to render into the prompt (none when tool_choice is "none")."""
        if not self.tools or self.tool_choice == "none":
            return None
        return self.tools

    @property
    def grammar_tools(self) -> list[dict[str, Any]] | None:
        """Tools whose calls decoding is held to: ``tool_grammar`` where sent, else ``tools``."""
        if self.template_tools is None:
            return None
        return self.tool_grammar or self.tools


@dataclass(slots=True)
class CompletionRequest(GenerationRequest):
    """A ``/v1/completions`` request: a text prompt or token ids."""

    prompt: str | list[int] = ""
    # Legacy echo: the prompt's text (and with logprobs, its tokens' logprobs) goes first.
    echo: bool = False


def _require_object(body: Any) -> dict[str, Any]:
    """The body as a JSON object, else a 400."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object", code="invalid_body")
    return body


def _number(body: dict[str, Any], name: str, default: float, low: float, high: float) -> float:
    """A finite number in [low, high]."""
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise bad_field(name, f"must be a number, got {value!r}")
    if not low <= value <= high:
        raise bad_field(name, f"must be between {low} and {high}, got {value}")
    return float(value)


def _integer(body: dict[str, Any], name: str, low: int | None = None) -> int | None:
    """An integer (or None when absent) of at least ``low``."""
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_field(name, f"must be an integer, got {value!r}")
    if low is not None and value < low:
        raise bad_field(name, f"must be >= {low}, got {value}")
    return value


def _logprob_count(body: dict[str, Any], name: str) -> int | None:
    """A number of alternatives in 0..MAX_LOGPROBS, or None when absent."""
    value = _integer(body, name, 0)
    if value is not None and value > MAX_LOGPROBS:
        raise bad_field(name, f"must be between 0 and {MAX_LOGPROBS}, got {value}")
    return value


def _flag(body: dict[str, Any], name: str) -> bool:
    """A boolean field, false when absent."""
    value = body.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise bad_field(name, f"must be true or false, got {value!r}")
    return value


def _chat_logprobs(body: dict[str, Any]) -> int | None:
    """Chat's ``logprobs`` (true or false) and ``top_logprobs`` (0..20) as one count."""
    wanted = _flag(body, "logprobs")
    top = _logprob_count(body, "top_logprobs")
    if top is not None and not wanted:
        raise bad_field("top_logprobs", "needs logprobs set to true")
    return (top or 0) if wanted else None


def _stop(value: Any) -> tuple[str, ...]:
    """``stop``: a string or a list of non-empty strings."""
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise bad_field("stop", "must be a string or a list of strings")
    return tuple(s for s in value if s)


def _common(body: dict[str, Any], request: GenerationRequest) -> None:
    """Parse the shared sampling, streaming and scheduling fields into ``request``."""
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad_field("model", f"must be a string, got {model!r}")
    request.model = model or None
    max_tokens = _integer(body, "max_completion_tokens", 1)
    if max_tokens is None:
        max_tokens = _integer(body, "max_tokens", 1)
    request.max_tokens = max_tokens
    request.temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
    request.top_p = _number(body, "top_p", 1.0, 0.0, 1.0)
    if body.get("top_p") is not None and request.top_p == 0:
        raise bad_field("top_p", "must be greater than 0")
    top_k = _integer(body, "top_k", -1)
    request.top_k = 0 if top_k is None or top_k == -1 else top_k  # vLLM: -1 means off
    request.min_p = _number(body, "min_p", 0.0, 0.0, 1.0)
    request.stop = _stop(body.get("stop"))
    request.seed = _integer(body, "seed")
    n = _integer(body, "n", 1)
    if n not in (None, 1):
        raise bad_field("n", f"only n=1 is supported, got {n}")
    request.prompt_logprobs = _logprob_count(body, "prompt_logprobs")
    request.prompt_logprobs_from = _integer(body, "prompt_logprobs_from") or 0
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise bad_field("stream", f"must be true or false, got {stream!r}")
    request.stream = stream
    options = body.get("stream_options")
    if options is not None:
        if not isinstance(options, dict):
            raise bad_field("stream_options", "must be an object")
        include = options.get("include_usage", False)
        if not isinstance(include, bool):
            raise bad_field("stream_options.include_usage", "must be true or false")
        request.include_usage = include
    if body.get("priority") is not None:
        try:
            request.priority = parse_priority(body["priority"])
        except ValueError as err:
            raise bad_field("priority", str(err)) from None
    request.presence_penalty = _number(body, "presence_penalty", 0.0, -2.0, 2.0)
    request.frequency_penalty = _number(body, "frequency_penalty", 0.0, -2.0, 2.0)
    if body.get("repetition_penalty") is not None:
        request.repetition_penalty = _number(body, "repetition_penalty", 1.0, 0.01, 10.0)
    ignore_eos = body.get("ignore_eos", False)  # vLLM's extension, for benchmarks
    if not isinstance(ignore_eos, bool):
        raise bad_field("ignore_eos", f"must be true or false, got {ignore_eos!r}")
    request.ignore_eos = ignore_eos


def _content(value: Any, where: str) -> str:
    """Message content: a string or a list of text parts (other parts are refused)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = []
        for i, part in enumerate(value):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind != "text" or not isinstance(part.get("text"), str):
                raise bad_field(f"{where}[{i}]", f"only text parts are supported, got {kind!r}")
            texts.append(part["text"])
        return "".join(texts)
    raise bad_field(where, "must be a string or a list of text parts")


def _tool_call_for_template(call: Any, where: str) -> dict[str, Any]:
    """An assistant message's tool call as chat templates expect it (arguments as an object)."""
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise bad_field(where, "must be {type: function, function: {name, arguments}}")
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            raise bad_field(f"{where}.function.arguments", "is not valid JSON") from None
    call_id = call.get("id")
    return {
        "id": template_call_id(call_id) if isinstance(call_id, str) and call_id else None,
        "type": "function",
        "function": {"name": function["name"], "arguments": arguments},
    }


def _messages(value: Any) -> list[dict[str, Any]]:
    """``messages``: checked and converted for the model's chat template."""
    if not isinstance(value, list) or not value:
        raise bad_field("messages", "must be a non-empty list of messages")
    out: list[dict[str, Any]] = []
    for i, message in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise bad_field(where, "must be an object")
        role = message.get("role")
        if role not in ROLES:
            raise bad_field(f"{where}.role", f"must be one of {', '.join(ROLES)}, got {role!r}")
        item: dict[str, Any] = {
            "role": "system" if role == "developer" else role,
            "content": _content(message.get("content"), f"{where}.content"),
        }
        calls = message.get("tool_calls")
        if calls:
            if role != "assistant" or not isinstance(calls, list):
                raise bad_field(f"{where}.tool_calls", "must be a list on an assistant message")
            item["tool_calls"] = [
                _tool_call_for_template(c, f"{where}.tool_calls[{j}]") for j, c in enumerate(calls)
            ]
        if role == "tool" and isinstance(message.get("tool_call_id"), str):
            item["tool_call_id"] = template_call_id(message["tool_call_id"])
        if isinstance(message.get("name"), str):
            item["name"] = message["name"]
        out.append(item)
    return out


def _tools(value: Any, name: str = "tools") -> list[dict[str, Any]]:
    """``tools`` (or the field ``name``): a list of function tools with names."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise bad_field(name, "must be a list of tools")
    for i, tool in enumerate(value):
        function = tool.get("function") if isinstance(tool, dict) else None
        if (
            not isinstance(tool, dict)
            or tool.get("type", "function") != "function"
            or not isinstance(function, dict)
            or not isinstance(function.get("name"), str)
            or not function["name"]
        ):
            raise bad_field(f"{name}[{i}]", "must be {type: function, function: {name, ...}}")
        parameters = function.get("parameters")
        if parameters is not None and not isinstance(parameters, dict):
            raise bad_field(f"{name}[{i}].function.parameters", "must be a JSON schema object")
    return value


def _tool_grammar(value: Any, tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``tool_grammar``: the same tools as ``tools``, by name, for decoding only."""
    grammar = _tools(value, "tool_grammar")
    names = sorted(tool["function"]["name"] for tool in tools)
    if grammar and sorted(tool["function"]["name"] for tool in grammar) != names:
        raise bad_field("tool_grammar", "must hold the same tools as tools, by name")
    return grammar


def _tool_choice(value: Any, tools: list[dict[str, Any]]) -> str | dict[str, Any]:
    """``tool_choice``: none, auto, required, or one named function among ``tools``."""
    if value is None:
        return "auto"
    if isinstance(value, str):
        if value not in TOOL_CHOICES:
            raise bad_field("tool_choice", f"must be one of {', '.join(TOOL_CHOICES)} or a tool")
        if value == "required" and not tools:
            raise bad_field("tool_choice", '"required" needs at least one tool in tools')
        return value
    function = value.get("function") if isinstance(value, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str):
        raise bad_field("tool_choice", "must be a string or {type: function, function: {name}}")
    if name not in {tool["function"]["name"] for tool in tools}:
        raise bad_field("tool_choice", f"names {name!r}, which is not in tools")
    return {"type": "function", "function": {"name": name}}


def _template_kwargs(value: Any) -> dict[str, Any]:
    """``chat_template_kwargs``: an object of the template's variables."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise bad_field("chat_template_kwargs", "must be an object of template variables")
    return value


def _response_format(value: Any) -> ResponseFormat:
    """``response_format``: text, json_object, or json_schema with a schema object."""
    if value is None:
        return ResponseFormat()
    if not isinstance(value, dict):
        raise bad_field("response_format", "must be an object")
    kind = value.get("type")
    if kind in ("text", "json_object"):
        return ResponseFormat(type=kind)
    if kind != "json_schema":
        raise bad_field(
            "response_format.type", f"must be text, json_object or json_schema, got {kind!r}"
        )
    spec = value.get("json_schema")
    if not isinstance(spec, dict):
        raise bad_field("response_format.json_schema", "must be an object with a schema")
    schema = spec.get("schema")
    if not isinstance(schema, dict):
        raise bad_field("response_format.json_schema.schema", "must be a JSON schema object")
    name = spec.get("name")
    if name is not None and not isinstance(name, str):
        raise bad_field("response_format.json_schema.name", "must be a string")
    return ResponseFormat(
        type="json_schema", schema=schema, name=name, strict=bool(spec.get("strict", False))
    )


def parse_chat_request(body: Any) -> ChatRequest:
    """A checked chat request from a decoded JSON body; ApiError(400) naming the bad field."""
    body = _require_object(body)
    request = ChatRequest()
    _common(body, request)
    request.messages = _messages(body.get("messages"))
    request.tools = _tools(body.get("tools"))
    request.tool_choice = _tool_choice(body.get("tool_choice"), request.tools)
    request.tool_grammar = _tool_grammar(body.get("tool_grammar"), request.tools)
    request.response_format = _response_format(body.get("response_format"))
    request.chat_template_kwargs = _template_kwargs(body.get("chat_template_kwargs"))
    request.logprobs = _chat_logprobs(body)
    return request


def parse_completion_request(body: Any) -> CompletionRequest:
    """A checked completion request; the prompt is a string, one string in a list, or ids."""
    body = _require_object(body)
    request = CompletionRequest()
    _common(body, request)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str) and prompt:
        request.prompt = prompt
    elif (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt)
    ):
        request.prompt = list(prompt)
    else:
        raise bad_field("prompt", "must be a non-empty string or a list of token ids (one prompt)")
    # The legacy API's logprobs is a count (OpenAI allows up to 5; vLLM, as here, 20).
    request.logprobs = _logprob_count(body, "logprobs")
    request.echo = _flag(body, "echo")
    return request
