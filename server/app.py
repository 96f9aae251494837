"""The aiohttp application: authentication, OpenAI-shaped errors, routes."""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

from paged_llm.protocol.errors import ApiError, error_body

from .app_keys import HOST, METRICS, SETTINGS
from .generation import engine_error
from .host import EngineHost
from .metrics import ServerMetrics
from .routes import add_routes
from .settings import ServerSettings

_LOGGER = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# Liveness and version stay open so probes need no key; the rest needs it when one is set.
OPEN_PATHS = frozenset({"/health", "/version"})


def _error_response(err: ApiError) -> web.Response:
    """OpenAI's error JSON with the error's status (and Retry-After when it has one)."""
    headers = {"Retry-After": str(err.retry_after)} if err.retry_after is not None else None
    return web.json_response(err.body(), status=err.status, headers=headers)


@web.middleware
async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every failure as OpenAI's error JSON: ours, aiohttp's (404, 405, 413) and bugs."""
    try:
        return await handler(request)
    except ApiError as err:
        return _error_response(err)
    except web.HTTPException as err:
        if err.status < 400:
            raise
        code = {413: "request_too_large", 404: "not_found", 405: "method_not_allowed"}
        message = err.text or err.reason
        if err.status == 413:
            limit = request.app[SETTINGS].max_body_bytes
            message = f"the request body is larger than this server's limit of {limit} bytes"
        return web.json_response(
            error_body(err.status, message, code=code.get(err.status)), status=err.status
        )
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception as err:
        # The engine's own errors keep their status (a stopped engine is a 503 on any
        # endpoint); anything else is a bug, logged with its traceback.
        api_error = engine_error(err, retry_after=1)
        if api_error.code == "internal_error":
            _LOGGER.exception("Unexpected error serving %s", request.path)
        return _error_response(api_error)


@web.middleware
async def auth(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Require ``Authorization: Bearer <key>`` when a key is set, compared in constant time."""
    key = request.app[SETTINGS].api_key
    if key and request.path not in OPEN_PATHS:
        given = request.headers.get("Authorization", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            token.strip().encode(), key.encode()
        ):
            raise ApiError(
                401,
                "a valid API key is required (Authorization: Bearer <key>)",
                code="invalid_api_key",
            )
    return await handler(request)


def make_app(host: EngineHost, settings: ServerSettings) -> web.Application:
    """The application for one engine host (the host is started separately)."""
    app = web.Application(middlewares=[errors, auth], client_max_size=settings.max_body_bytes)
    app[HOST] = host
    app[SETTINGS] = settings
    app[METRICS] = ServerMetrics(host)
    add_routes(app)
    return app
