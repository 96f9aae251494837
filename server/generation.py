"""Turning a parsed request into an engine run: tokens, sampling parameters, errors."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import TYPE_CHECKING, Any, cast

from paged_llm.protocol.errors import ApiError, bad_field
from paged_llm.protocol.requests import ChatRequest, CompletionRequest, GenerationRequest

if TYPE_CHECKING:
    from paged_llm.engine.outputs import RequestOutput
    from paged_llm.engine.sequence import SamplingParams

    from .host import EngineHost

# Engine admission codes a client can fix by changing its request.
_CLIENT_CODES = {"context_too_long", "exceeds_kv_pool", "empty_prompt", "invalid_token"}


def engine_error(err: Exception, retry_after: int) -> ApiError:
    """The API error for an engine exception, with the status a client can act on."""
    from paged_llm.engine.errors import EngineDeadError, InvalidSamplingParams, RequestRejected

    if isinstance(err, ApiError):
        return err
    if isinstance(err, InvalidSamplingParams):
        param = str(err).split(" ", 1)[0]
        return ApiError(400, str(err), param=param, code=err.code)
    if isinstance(err, RequestRejected):
        if err.code == "queue_full":
            return ApiError(503, str(err), code=err.code, retry_after=retry_after)
        if err.code == "invalid_structured_output":
            # The message starts with the field: json_schema, json_object or structural_tag.
            param = "tools" if str(err).startswith("structural_tag") else "response_format"
            return ApiError(400, str(err), param=param, code=err.code)
        if err.code in _CLIENT_CODES:
            param = "messages" if err.code in ("empty_prompt", "invalid_token") else "max_tokens"
            return ApiError(400, str(err), param=param, code=err.code)
        return ApiError(500, str(err), code=err.code)
    if isinstance(err, EngineDeadError):
        return ApiError(503, str(err), code=err.code)
    return ApiError(500, f"internal error: {type(err).__name__}: {err}", code="internal_error")


def _params_fields() -> set[str]:
    """The SamplingParams fields this engine has (newer engines add penalties, grammars)."""
    from paged_llm.engine.sequence import SamplingParams

    return {f.name for f in dataclasses.fields(SamplingParams)}


def _structured_fields(
    request: ChatRequest, fields: set[str], chat_template: str | None
) -> dict[str, Any]:
    """``response_format`` or ``tool_choice`` as the engine's constrained decoding.

    With tools offered (and tool_choice not "none"), decoding is held to text or calls in
    the model's own format whose names are offered and whose arguments fit; "required"
    and a named function demand a call. Refused clearly where the engine has no grammars.
    """
    fmt = request.response_format
    tools = request.template_tools
    if fmt.type == "text" and not tools:
        return {}
    if "json_schema" not in fields:
        raise ApiError(
            400,
            f"response_format {fmt.type} is not supported: this engine has no constrained decoding",
            param="response_format",
            code="unsupported_response_format",
        )
    if fmt.type == "json_object":
        return {"json_object": True}
    if fmt.type == "json_schema":
        return {"json_schema": fmt.schema}
    from paged_llm.engine.tool_grammar import detect_tool_call_format, tool_call_structural_tag

    assert tools is not None
    style = detect_tool_call_format(chat_template)
    return {"structural_tag": tool_call_structural_tag(tools, style, request.tool_choice)}


def sampling_params(
    request: GenerationRequest,
    prompt_len: int,
    limit: int,
    default_max: int | None,
    chat_template: str | None = None,
) -> SamplingParams:
    """SamplingParams for ``request``; the default max_tokens fills the context left.

    ``chat_template`` tells the model's tool-call format (Hermes when it shows none).
    """
    from paged_llm.engine.errors import InvalidSamplingParams
    from paged_llm.engine.sequence import SamplingParams

    room = limit - prompt_len
    if room < 1:
        raise ApiError(
            400,
            f"the prompt has {prompt_len} tokens but this server fits at most {limit} tokens "
            "per request, prompt and answer together",
            param="messages" if isinstance(request, ChatRequest) else "prompt",
            code="context_too_long",
        )
    max_tokens = request.max_tokens
    if max_tokens is None:
        max_tokens = room if default_max is None else min(room, default_max)
    fields = _params_fields()
    extra: dict[str, Any] = {}
    for name, neutral in (
        ("presence_penalty", 0.0),
        ("frequency_penalty", 0.0),
        ("repetition_penalty", None),
    ):
        value = getattr(request, name)
        if name in fields:
            extra[name] = value
        elif value != neutral:
            raise bad_field(name, "is not supported yet by this engine")
    if isinstance(request, ChatRequest):
        extra.update(_structured_fields(request, fields, chat_template))
    try:
        return SamplingParams(
            temperature=request.temperature,
            top_p=request.top_p,
            top_k=request.top_k,
            max_tokens=max_tokens,
            seed=request.seed,
            stop=request.stop,
            ignore_eos=request.ignore_eos,
            **extra,
        )
    except InvalidSamplingParams as err:
        raise engine_error(err, 1) from None


async def tokenize(host: EngineHost, request: ChatRequest | CompletionRequest) -> list[int]:
    """Prompt token ids, off the event loop; a template that refuses the messages is a 400."""
    llm = host.engine.engine
    if isinstance(request, CompletionRequest):
        prompt: Any = request.prompt
        tools = None
        param = "prompt"
    else:
        prompt, tools, param = request.messages, request.template_tools, "messages"
    loop = asyncio.get_running_loop()
    try:
        ids: list[int] = await loop.run_in_executor(None, llm.tokenize, prompt, tools)
    except Exception as err:
        from paged_llm.engine.errors import EngineError

        if isinstance(err, EngineError):
            raise engine_error(err, 1) from None
        raise ApiError(
            400, f"the model's chat template refused the request: {err}", param=param
        ) from None
    return ids


async def run(
    host: EngineHost, token_ids: list[int], params: SamplingParams, priority: str
) -> AsyncGenerator[RequestOutput]:
    """Stream the engine's outputs; engine errors become API errors.

    Leaving the loop (a client that went away cancels its handler) aborts the request and
    returns its blocks, inside the engine's own generator.
    """
    try:
        # The engine's generate is an async generator; close it at once when we stop early.
        engine_stream = cast(
            "AsyncGenerator[RequestOutput]", host.engine.generate(token_ids, params, priority)
        )
        async with aclosing(engine_stream) as outputs:
            async for out in outputs:
                yield out
    except ApiError:
        raise
    except Exception as err:
        from paged_llm.engine.errors import EngineError

        if isinstance(err, EngineError):
            raise engine_error(err, 1) from err
        raise
