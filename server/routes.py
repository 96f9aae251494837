"""The HTTP endpoints: chat and text completions, tokenize, models, health, metrics and more."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from contextlib import aclosing
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any, cast

from aiohttp import web

from paged_llm.protocol.errors import ApiError
from paged_llm.protocol.requests import (
    ChatRequest,
    CompletionRequest,
    parse_chat_request,
    parse_completion_request,
)
from paged_llm.protocol.responses import (
    Usage,
    chat_chunk,
    chat_completion,
    models_list,
    new_id,
    now,
    text_completion,
    tool_call_deltas,
)
from paged_llm.protocol.tool_calls import ToolCallStream
from paged_llm.protocol.tool_prompt import template_source

from . import logprobs as lp
from . import sse
from .app_keys import HOST, METRICS
from .generation import engine_error, run, sampling_params, tokenize
from .host import EngineHost, HostState
from .metrics import CONTENT_TYPE

if TYPE_CHECKING:
    from paged_llm.engine.api import RequestOutput, TokenLogprob

_LOGGER = logging.getLogger(__name__)

COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's and vLLM's default for /v1/completions


def package_version() -> str:
    """The installed library's version."""
    try:
        return version("paged-llm")
    except PackageNotFoundError:
        return "unknown"


async def read_json(request: web.Request) -> Any:
    """The decoded JSON body; over the size limit aiohttp raises 413 while reading."""
    raw = await request.read()
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ApiError(400, f"the body is not valid JSON: {err}", code="invalid_json") from None


def _check_model(host: EngineHost, name: str | None) -> None:
    """404 for a model this server does not serve (a request never names a file to load)."""
    if name is not None and name != host.model_name:
        raise ApiError(
            404,
            f"the model {name!r} does not exist; this server serves {host.model_name!r}",
            param="model",
            code="model_not_found",
        )


def _finish_reason(reason: Any, has_calls: bool) -> str:
    """OpenAI's finish reason for the engine's."""
    if has_calls:
        return "tool_calls"
    return str(reason.value if hasattr(reason, "value") else reason or "stop")


async def _fail_stream(stream: web.StreamResponse, err: ApiError) -> web.StreamResponse:
    """End a stream whose headers are sent with an error event, as vLLM does."""
    await sse.send(stream, err.body())
    await sse.close_stream(stream)
    return stream


async def _prepare(
    request: web.Request, body: ChatRequest | CompletionRequest, default_max: int | None
) -> tuple[EngineHost, list[int], Any]:
    """Checks shared by both endpoints: model, readiness, prompt tokens, sampling."""
    host = request.app[HOST]
    _check_model(host, body.model)
    engine = host.engine  # a 503 while loading, before any work
    ids = await tokenize(host, body)
    # A model with several templates (a dict by name) shows its tool format in tool_use's
    template = template_source(getattr(engine.tokenizer, "chat_template", None))
    params = sampling_params(body, len(ids), host.max_request_tokens, default_max, template)
    if isinstance(body, ChatRequest) and body.tool_grammar:
        from paged_llm.engine.api import first_compiled

        def plain() -> Any:
            """The tools as sent: tool_grammar's narrowed schemas are a hint, not a must."""
            body.tool_grammar = []
            return sampling_params(body, len(ids), host.max_request_tokens, default_max, template)

        narrowed = params
        # When neither compiles, the plain tools' error fails the request as without a hint.
        params = await first_compiled(engine, (lambda: narrowed, plain), _LOGGER) or plain()
    return host, ids, params


@dataclass(slots=True)
class _Generated:
    """What one request produced: its last output, its whole text, its stream if any."""

    last: RequestOutput
    text: str
    stream: web.StreamResponse | None
    # Every token's log probabilities and the prompt's, where the request asked.
    logprobs: list[TokenLogprob]
    prompt_logprobs: list[TokenLogprob | None] | None


async def _generate(
    request: web.Request,
    prepared: tuple[EngineHost, list[int], Any],
    priority: str,
    streaming: bool,
    delta: Callable[[RequestOutput], str],
    chunk: Callable[[str, RequestOutput], dict[str, Any] | None],
    opening: dict[str, Any] | None = None,
) -> _Generated | web.StreamResponse:
    """Run one request, sending ``chunk(delta(output), output)`` as events when ``streaming``.

    ``chunk`` gives None for an output with nothing to send.

    Returns what it produced, or the closed stream when the request failed after the
    stream was opened (a failure before that raises, keeping its HTTP status).
    """
    host, ids, params = prepared
    stream: web.StreamResponse | None = None
    text: list[str] = []
    records: list[TokenLogprob] = []
    prompt: list[TokenLogprob | None] | None = None
    try:
        async with aclosing(run(host, ids, params, priority)) as outputs:
            # The first output comes before any header: admission errors keep their status.
            out = await anext(outputs)
            if streaming:
                stream = await sse.open_stream(request)
                if opening is not None:
                    await sse.send(stream, opening)
            while True:
                piece = delta(out)
                if stream is not None and (event := chunk(piece, out)) is not None:
                    await sse.send(stream, event)
                text.append(piece)
                records.extend(out.logprobs or ())
                if out.prompt_logprobs is not None:
                    prompt = out.prompt_logprobs
                if out.finished:
                    break
                out = await anext(outputs)
    except ApiError as err:
        if stream is None:
            raise
        return await _fail_stream(stream, err)
    except ConnectionResetError:
        raise  # the client went away: nobody reads an error event
    except Exception as err:
        if stream is None:
            raise  # the error middleware answers with OpenAI's error JSON
        # Headers are sent: an error response now would land inside the event stream
        # and break the client's parser; the error is the stream's last event instead.
        _LOGGER.exception("Unexpected error streaming %s", request.path)
        return await _fail_stream(stream, engine_error(err, 1))
    return _Generated(out, "".join(text), stream, records, prompt)


def _observe(request: web.Request, priority: str, out: RequestOutput, reason: str) -> Usage:
    """Record a finished request's timing in the metrics; return its token usage."""
    if out.timing is not None:
        request.app[METRICS].observe(priority, out.timing, reason)
    return Usage(out.prompt_tokens, out.completion_tokens, out.cached_tokens)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    """``POST /v1/chat/completions``."""
    body = parse_chat_request(await read_json(request))
    prepared = await _prepare(request, body, None)
    response_id, created, model = new_id("chatcmpl"), now(), prepared[0].model_name
    parser = ToolCallStream(body.tool_names) if body.tool_names else None
    priority = body.priority.label

    def delta(out: RequestOutput) -> str:
        """The output's text, with tool-call markup held back for the parser."""
        if parser is None:
            return out.text
        return parser.feed(out.text) + (parser.finish() if out.finished else "")

    texts = lp.TokenTexts(prepared[0].engine.tokenizer)

    def chunk(piece: str, out: RequestOutput) -> dict[str, Any] | None:
        """A content chunk, with its tokens' logprobs where asked (even with no text yet)."""
        if not piece and not out.logprobs:
            return None
        event = chat_chunk(response_id, model, created, {"content": piece})
        if out.logprobs:
            event["choices"][0]["logprobs"] = {"content": lp.chat_content(out.logprobs, texts)}
        return event

    result = await _generate(
        request,
        prepared,
        priority,
        body.stream,
        delta,
        chunk,
        opening=chat_chunk(response_id, model, created, {"role": "assistant", "content": ""}),
    )
    if isinstance(result, web.StreamResponse):
        return result
    calls = parser.calls if parser is not None else []
    reason = _finish_reason(result.last.finish_reason, bool(calls))
    usage = _observe(request, priority, result.last, reason)
    if (stream := result.stream) is None:
        answer = chat_completion(response_id, model, result.text, calls, reason, usage, created)
        if body.logprobs is not None:
            content = lp.chat_content(result.logprobs, texts)
            answer["choices"][0]["logprobs"] = {"content": content}
        if result.prompt_logprobs is not None:
            answer["prompt_logprobs"] = lp.vllm_prompt_logprobs(result.prompt_logprobs, texts)
        return web.json_response(answer)
    if calls:
        await sse.send(stream, chat_chunk(response_id, model, created, tool_call_deltas(calls)))
    await sse.send(stream, chat_chunk(response_id, model, created, {}, reason))
    if body.include_usage:
        await sse.send(stream, chat_chunk(response_id, model, created, None, usage=usage))
    await sse.close_stream(stream)
    return stream


async def completions(request: web.Request) -> web.StreamResponse:
    """``POST /v1/completions``."""
    body = parse_completion_request(await read_json(request))
    prepared = await _prepare(request, body, COMPLETION_DEFAULT_MAX_TOKENS)
    host, ids = prepared[0], prepared[1]
    response_id, created, model = new_id("cmpl"), now(), host.model_name
    priority = body.priority.label
    texts = lp.TokenTexts(host.engine.tokenizer)
    # Echo puts the prompt's text first: the string sent, or the ids' decoded text.
    echo = ""
    if body.echo:
        echo = body.prompt if isinstance(body.prompt, str) else host.engine.tokenizer.decode(ids)
    # Characters streamed so far (the next text_offset), and whether the echo went out.
    sent, echoed = [len(echo)], [not body.echo]

    def chunk(piece: str, out: RequestOutput) -> dict[str, Any] | None:
        """A text chunk (the echo before the first), with its tokens' legacy logprobs."""
        first = not echoed[0]
        echoed[0] = True
        text = (echo if first else "") + piece
        if not text and not out.logprobs:
            return None
        event = text_completion(response_id, model, created, text, None)
        if body.logprobs is not None:
            if first and out.prompt_logprobs is not None:
                value = lp.echoed_logprobs(
                    ids, out.prompt_logprobs, out.logprobs or [], texts, len(echo)
                )
            else:
                value = lp.completion_logprobs(list(out.logprobs or []), texts, sent[0])
            event["choices"][0]["logprobs"] = value
        sent[0] += len(piece)
        return event

    result = await _generate(request, prepared, priority, body.stream, lambda out: out.text, chunk)
    if isinstance(result, web.StreamResponse):
        return result
    reason = _finish_reason(result.last.finish_reason, False)
    usage = _observe(request, priority, result.last, reason)
    if (stream := result.stream) is None:
        answer = text_completion(response_id, model, created, echo + result.text, reason, usage)
        if body.logprobs is not None:
            if body.echo and result.prompt_logprobs is not None:
                value = lp.echoed_logprobs(
                    ids, result.prompt_logprobs, result.logprobs, texts, len(echo)
                )
            else:
                value = lp.completion_logprobs(list(result.logprobs), texts)
            answer["choices"][0]["logprobs"] = value
        if body.prompt_logprobs is not None and result.prompt_logprobs is not None:
            answer["choices"][0]["prompt_logprobs"] = lp.vllm_prompt_logprobs(
                result.prompt_logprobs, texts
            )
        return web.json_response(answer)
    await sse.send(stream, text_completion(response_id, model, created, "", reason))
    if body.include_usage:
        await sse.send(
            stream,
            {**text_completion(response_id, model, created, "", None, usage), "choices": []},
        )
    await sse.close_stream(stream)
    return stream


async def tokenize_prompt(request: web.Request) -> web.Response:
    """``POST /tokenize`` (vLLM's): a prompt's or chat messages' token ids and their count.

    Messages go through the chat template with the generation prompt, tools and template
    variables, exactly as a chat completion renders them, so ``count`` is that request's
    prompt tokens (the integration counts its agent's prompt with it). A text prompt gets
    the tokenizer's special tokens unless ``add_special_tokens`` is false.
    """
    raw = await read_json(request)
    chat = isinstance(raw, dict) and "messages" in raw
    body = parse_chat_request(raw) if chat else parse_completion_request(raw)
    host = request.app[HOST]
    _check_model(host, body.model)
    plain = isinstance(body, CompletionRequest) and isinstance(body.prompt, str)
    if plain and raw.get("add_special_tokens") is False:
        text = cast(str, cast(CompletionRequest, body).prompt)
        ids = await host.engine.tokenize(text, add_special_tokens=False)  # a 503 while loading
    else:
        ids = await tokenize(host, body)
    return web.json_response(
        {"count": len(ids), "max_model_len": host.max_model_len, "tokens": ids}
    )


async def models(request: web.Request) -> web.Response:
    """``GET /v1/models``: the one model this process serves."""
    host = request.app[HOST]
    length = host.max_model_len if host.ready else None
    return web.json_response(models_list([host.model_name], host.created, length))


async def health(request: web.Request) -> web.Response:
    """``GET /health``: 200 when ready, 503 while loading, stopping or after a failure."""
    host = request.app[HOST]
    if host.ready:
        return web.json_response({"status": "ok", "model": host.model_name})
    headers = {"Retry-After": "5"} if host.state is HostState.LOADING else None
    return web.json_response(
        {"status": host.state.value, "detail": host.describe(), "model": host.model_name},
        status=503,
        headers=headers,
    )


async def version_info(request: web.Request) -> web.Response:
    """``GET /version``."""
    return web.json_response({"version": package_version()})


async def prometheus(request: web.Request) -> web.Response:
    """``GET /metrics``: Prometheus text exposition."""
    body = request.app[METRICS].render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


async def block_map(request: web.Request) -> web.Response:
    """``GET /block_map``: every KV block's state (base64, one byte each) and the counts.

    The integration's block-map card reads it in remote mode; taken between two engine
    steps, at most a few milliseconds for tens of thousands of blocks.
    """
    engine = request.app[HOST].engine
    return web.json_response((await engine.block_map()).as_dict())


async def expect_interactive(request: web.Request) -> web.Response:
    """``POST /expect_interactive``: a voice query is on its way; shorten steps for the hold.

    Not part of the OpenAI API: the integration calls it in remote mode when an Assist
    satellite hears its wake word (see ``AsyncEngine.expect_interactive``).
    """
    request.app[HOST].engine.expect_interactive()
    return web.Response(status=204)


def add_routes(app: web.Application) -> None:
    """Register every endpoint."""
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/tokenize", tokenize_prompt)
    app.router.add_get("/health", health)
    app.router.add_get("/version", version_info)
    app.router.add_get("/metrics", prometheus)
    app.router.add_get("/block_map", block_map)
    app.router.add_post("/expect_interactive", expect_interactive)
