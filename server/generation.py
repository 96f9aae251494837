"""Turning a parsed request into an engine run: tokens, sampling parameters, errors."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import TYPE_CHECKING, Any, cast

from paged_llm.protocol.errors import ApiError
from paged_llm.protocol.requests import ChatRequest, CompletionRequest, GenerationRequest

if TYPE_CHECKING:
    from paged_llm.engine.api import Constraint, RequestOutput, SamplingParams

    from .host import EngineHost


def engine_error(err: Exception, retry_after: int) -> ApiError:
    """The API error for an engine exception, with the status a client can act on."""
    from paged_llm.engine.api import error_info

    if isinstance(err, ApiError):
        return err
    info = error_info(err)
    if info.caller:
        return ApiError(400, info.message, param=info.param, code=info.code)
    if info.code == "queue_full":
        return ApiError(503, info.message, code=info.code, retry_after=retry_after)
    if info.code == "engine_dead":
        return ApiError(503, info.message, code=info.code)
    if info.code == "internal_error":
        return ApiError(500, f"internal error: {info.message}", code=info.code)
    return ApiError(500, info.message, code=info.code)


def _constraint(request: GenerationRequest) -> Constraint | None:
    """``response_format``, or the offered tools (unless tool_choice is "none"), if any."""
    from paged_llm.engine.api import Constraint

    if not isinstance(request, ChatRequest):
        return None
    fmt = request.response_format
    if fmt.type == "json_object":
        return Constraint(json_object=True)
    if fmt.type == "json_schema":
        return Constraint(json_schema=fmt.schema)
    tools = request.grammar_tools
    return Constraint(tools=tools, tool_choice=request.tool_choice) if tools else None


def sampling_params(
    request: GenerationRequest,
    prompt_len: int,
    limit: int,
    default_max: int | None,
    chat_template: str | None = None,
) -> SamplingParams:
    """SamplingParams for ``request``; the default max_tokens fills the context left.

    With tools offered (and tool_choice not "none"), decoding is held to text or calls in
    the model's own format (``chat_template`` tells it; Hermes when it shows none) whose
    names are offered and whose arguments fit; "required" and a named function demand a
    call.
    """
    from paged_llm.engine.api import InvalidSamplingParams
    from paged_llm.engine.api import sampling_params as engine_sampling

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
    try:
        return engine_sampling(
            max_tokens=max_tokens,
            temperature=request.temperature,
            top_p=request.top_p,
            top_k=request.top_k,
            min_p=request.min_p,
            seed=request.seed,
            stop=request.stop,
            ignore_eos=request.ignore_eos,
            repetition_penalty=request.repetition_penalty,
            frequency_penalty=request.frequency_penalty,
            presence_penalty=request.presence_penalty,
            constraint=_constraint(request),
            chat_template=chat_template,
            logprobs=request.logprobs,
            prompt_logprobs=_prompt_logprobs(request),
            prompt_logprobs_from=request.prompt_logprobs_from,
        )
    except InvalidSamplingParams as err:
        raise engine_error(err, 1) from None


def _prompt_logprobs(request: GenerationRequest) -> int | None:
    """Prompt logprobs asked: vLLM's field, or the legacy echo with logprobs (its count)."""
    if request.prompt_logprobs is not None:
        return request.prompt_logprobs
    if isinstance(request, CompletionRequest) and request.echo:
        return request.logprobs
    return None


async def tokenize(host: EngineHost, request: ChatRequest | CompletionRequest) -> list[int]:
    """Prompt token ids, off the event loop; a template that refuses the messages is a 400."""
    engine = host.engine
    kwargs = None
    if isinstance(request, CompletionRequest):
        prompt: Any = request.prompt
        tools = None
        param = "prompt"
    else:
        prompt, tools, param = request.messages, request.template_tools, "messages"
        kwargs = request.chat_template_kwargs or None
    try:
        return await engine.tokenize(prompt, tools, kwargs)
    except Exception as err:
        from paged_llm.engine.api import EngineError

        if isinstance(err, EngineError):
            raise engine_error(err, 1) from None
        raise ApiError(
            400, f"the model's chat template refused the request: {err}", param=param
        ) from None


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
        from paged_llm.engine.api import EngineError

        if isinstance(err, EngineError):
            raise engine_error(err, 1) from err
        raise
