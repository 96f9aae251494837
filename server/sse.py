"""Server-sent events in OpenAI's wire format: ``data: {json}`` lines, then ``data: [DONE]``."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from paged_llm.protocol.responses import DONE

HEADERS = {
    "Content-Type": "text/event-stream; charset=utf-8",
    "Cache-Control": "no-cache",
    # Proxies such as nginx would otherwise hold the events back.
    "X-Accel-Buffering": "no",
}


async def open_stream(request: web.Request) -> web.StreamResponse:
    """Send the headers of an event stream."""
    response = web.StreamResponse(status=200, headers=HEADERS)
    response.enable_chunked_encoding()
    await response.prepare(request)
    return response


async def send(response: web.StreamResponse, payload: dict[str, Any]) -> None:
    """Write one event."""
    data = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    await response.write(f"data: {data}\n\n".encode())


async def close_stream(response: web.StreamResponse) -> None:
    """Write the closing ``[DONE]`` event and end the response."""
    await response.write(f"data: {DONE}\n\n".encode())
    await response.write_eof()
