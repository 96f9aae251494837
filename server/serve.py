"""``paged-llm serve``: listen, load the engine, and stop gracefully on SIGTERM."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import sys
from typing import TYPE_CHECKING

from aiohttp import web

from .app import make_app
from .host import EngineHost, HostState
from .settings import ServerSettings

if TYPE_CHECKING:
    from paged_llm.engine.api import EngineConfig

_LOGGER = logging.getLogger(__name__)


async def serve(config: EngineConfig, settings: ServerSettings) -> int:
    """Serve until SIGTERM or SIGINT, then drain within the grace period; return 0.

    The socket opens before the model loads, so /health can say "loading" meanwhile.
    """
    settings.check()
    host = EngineHost(config, settings.served_model_name)
    app = make_app(host, settings)
    # handler_cancellation: a client that disconnects cancels its handler, which aborts its
    # request in the engine at once. shutdown_timeout is the grace period for running ones.
    runner = web.AppRunner(
        app,
        handler_cancellation=True,
        shutdown_timeout=settings.grace_seconds,
        access_log=None,
    )
    await runner.setup()
    site = web.TCPSite(runner, settings.host, settings.port)
    await site.start()
    for address in runner.addresses:
        name, port = address[0], address[1]
        shown = f"[{name}]" if ":" in name else name
        # A line a supervisor (or a test) can wait for; the port is the real one with --port 0.
        print(f"paged-llm: listening on http://{shown}:{port}", file=sys.stderr, flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loading = asyncio.create_task(load(host))
    try:
        await stop.wait()
        _LOGGER.info("Stopping: finishing running requests (up to %.0f s)", settings.grace_seconds)
        print("paged-llm: stopping", file=sys.stderr, flush=True)
        host.state = HostState.STOPPING  # new requests get 503 while running ones finish
        await runner.cleanup()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        await loading  # a load in progress cannot be interrupted; let it end, then free it
        await host.stop()
    print("paged-llm: stopped", file=sys.stderr, flush=True)
    return 0


async def load(host: EngineHost) -> None:
    """Start the engine, then keep what loading left alive out of the collector's scans.

    torch, transformers and the model leave hundreds of thousands of objects that every
    full collection walks while holding the GIL: a pause of a large part of a second in the
    middle of a step that no step budget can plan for (frozen: a millisecond at most).
    This process is the server's own; inside Home Assistant the process is not, so the
    integration leaves Home Assistant's collector as it is.
    """
    await host.start()
    gc.collect()
    gc.freeze()
