"""Fixtures for the server tests: a real ``paged-llm serve`` process over a tiny model."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.helpers.server_process import MODEL, ServerProcess, start_server
from tests.helpers.support import CACHE, TINY_VERSION


@pytest.fixture(scope="module")
def server(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """A server over the tiny random Llama, with an API key; stopped with SIGTERM at the end."""
    log = tmp_path_factory.mktemp("server") / "server.log"
    proc = start_server(tiny_model_dir, log, "--served-model-name", MODEL)
    yield proc
    assert proc.stop() == 0, proc.log_text()


@pytest.fixture(scope="session")
def scripted_dir() -> Path:
    """Where scripted models are kept between runs."""
    return CACHE / f"scripted-{TINY_VERSION}"


@pytest.fixture(autouse=True)
def _allow_sockets(socket_enabled: None) -> None:
    """These tests talk to a real server over loopback TCP."""


@pytest.fixture(autouse=True)
async def _close_half_read_streams() -> AsyncIterator[None]:
    """Let the openai client's half-read SSE generators close before the leak check.

    Its stream stops reading at ``[DONE]`` and leaves the inner byte generators to
    the garbage collector, whose finalizer closes them in a task of its own; a test
    that ends right after a stream could otherwise leave that task pending.
    """
    yield
    gc.collect()
    current = asyncio.current_task()
    for _ in range(20):
        await asyncio.sleep(0)
        pending = [t for t in asyncio.all_tasks() if t is not current and not t.done()]
        if not pending:
            return
        await asyncio.wait(pending, timeout=0.05)
