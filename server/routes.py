"""The HTTP endpoints: chat and text completions, models, health, version and metrics."""

from __future__ import annotations

import json
from contextlib import aclosing
from importlib.metadata import PackageNotFoundError, version
from typing import Any

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

from . import sse
from .generation import run, sampling_params, tokenize
from .host import EngineHost, HostState
from .keys import HOST, METRICS
from .metrics import CONTENT_TYPE

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
    host.engine  # noqa: B018  # 503 while loading, before any work
    ids = await tokenize(host, body)
    params = sampling_params(body, len(ids), host.max_request_tokens, default_max)
    return host, ids, params


async def chat_completions(request: web.Request) -> web.StreamResponse:
    """``POST /v1/chat/completions``."""
    body = parse_chat_request(await read_json(request))
    host, ids, params = await _prepare(request, body, None)
    metrics = request.app[METRICS]
    response_id, created, model = new_id("chatcmpl"), now(), host.model_name
    parser = ToolCallStream(body.tool_names) if body.tool_names else None
    priority = body.priority.value
    stream: web.StreamResponse | None = None
    text: list[str] = []
    try:
        async with aclosing(run(host, ids, params, priority)) as outputs:
            # The first output comes before any header: admission errors keep their status.
            out = await anext(outputs)
            if body.stream:
                stream = await sse.open_stream(request)
                role: dict[str, Any] = {"role": "assistant", "content": ""}
                await sse.send(stream, chat_chunk(response_id, model, created, role))
            while True:
                delta = parser.feed(out.text) if parser is not None else out.text
                if out.finished and parser is not None:
                    delta += parser.finish()
                if stream is not None and delta:
                    chunk = chat_chunk(response_id, model, created, {"content": delta})
                    await sse.send(stream, chunk)
                text.append(delta)
                if out.finished:
                    break
                out = await anext(outputs)
    except ApiError as err:
        if stream is None:
            raise
        return await _fail_stream(stream, err)
    calls = parser.calls if parser is not None else []
    reason = _finish_reason(out.finish_reason, bool(calls))
    usage = Usage(out.prompt_tokens, out.completion_tokens, out.cached_tokens)
    if out.timing is not None:
        metrics.observe(priority, out.timing, reason)
    if stream is None:
        return web.json_response(
            chat_completion(response_id, model, "".join(text), calls, reason, usage, created)
        )
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
    host, ids, params = await _prepare(request, body, COMPLETION_DEFAULT_MAX_TOKENS)
    metrics = request.app[METRICS]
    response_id, created, model = new_id("cmpl"), now(), host.model_name
    priority = body.priority.value
    stream: web.StreamResponse | None = None
    text: list[str] = []
    try:
        async with aclosing(run(host, ids, params, priority)) as outputs:
            out = await anext(outputs)
            if body.stream:
                stream = await sse.open_stream(request)
            while True:
                if stream is not None and out.text:
                    chunk = text_completion(response_id, model, created, out.text, None)
                    await sse.send(stream, chunk)
                text.append(out.text)
                if out.finished:
                    break
                out = await anext(outputs)
    except ApiError as err:
        if stream is None:
            raise
        return await _fail_stream(stream, err)
    reason = _finish_reason(out.finish_reason, False)
    usage = Usage(out.prompt_tokens, out.completion_tokens, out.cached_tokens)
    if out.timing is not None:
        metrics.observe(priority, out.timing, reason)
    if stream is None:
        return web.json_response(
            text_completion(response_id, model, created, "".join(text), reason, usage)
        )
    await sse.send(stream, text_completion(response_id, model, created, "", reason))
    if body.include_usage:
        await sse.send(
            stream,
            {**text_completion(response_id, model, created, "", None, usage), "choices": []},
        )
    await sse.close_stream(stream)
    return stream


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


def add_routes(app: web.Application) -> None:
    """Register every endpoint."""
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/version", version_info)
    app.router.add_get("/metrics", prometheus)
