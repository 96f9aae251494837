"""Unexpected failures on every endpoint: OpenAI's error JSON with a status, never a bare 500."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from paged_llm.engine.config import EngineConfig
from paged_llm.engine.errors import EngineDeadError
from paged_llm.server.app import make_app
from paged_llm.server.app_keys import HOST, METRICS
from paged_llm.server.host import EngineHost
from paged_llm.server.settings import ServerSettings
from tests.helpers.support import becomes_true

CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
COMPLETION = {"prompt": "the hall light", "max_tokens": 4}


def _broken(*_args: Any, **_kwargs: Any) -> Any:
    """A method that fails as a bug would."""
    raise RuntimeError("something broke")


async def _broken_generate(*_args: Any, **_kwargs: Any) -> AsyncIterator[Any]:
    """A request that fails before its first output."""
    raise RuntimeError("something broke")
    yield  # an async generator, as generate is


@pytest.fixture
async def served(tiny_model_dir: Path, socket_enabled: None) -> AsyncIterator[TestClient]:
    """A real server app over the tiny model, through aiohttp's test client."""
    config = EngineConfig(model=str(tiny_model_dir), device="cpu", dtype="float32", kv_budget=2**20)
    host = EngineHost(config)
    await host.start()
    client = TestClient(TestServer(make_app(host, ServerSettings())))
    await client.start_server()
    try:
        yield client
    finally:
        await client.close()
        await host.stop()


async def _error(response: Any, status: int, code: str) -> dict[str, Any]:
    """The OpenAI-shaped error of ``response``, checked for status and code."""
    assert response.status == status, await response.text()
    assert response.content_type == "application/json"
    error: dict[str, Any] = (await response.json())["error"]
    assert error["code"] == code
    assert error["type"] == ("server_error" if status >= 500 else "invalid_request_error")
    assert error["message"]
    return error


@pytest.mark.parametrize(
    ("method", "path", "body", "broken"),
    [
        ("post", "/v1/chat/completions", CHAT, "generate"),
        ("post", "/v1/chat/completions", {**CHAT, "stream": True}, "generate"),
        ("post", "/v1/completions", COMPLETION, "generate"),
        ("post", "/tokenize", {"prompt": "Hi", "add_special_tokens": False}, "tokenize"),
        ("get", "/block_map", None, "block_map"),
        ("post", "/expect_interactive", None, "expect_interactive"),
    ],
)
async def test_a_bug_in_the_engine_is_a_json_500_naming_it(
    served: TestClient,
    monkeypatch: pytest.MonkeyPatch,
    method: str,
    path: str,
    body: dict[str, Any] | None,
    broken: str,
) -> None:
    engine = served.app[HOST].engine
    monkeypatch.setattr(engine, broken, _broken_generate if broken == "generate" else _broken)
    response = await served.request(method, path, json=body)
    error = await _error(response, 500, "internal_error")
    assert "something broke" in error["message"]


async def test_a_broken_metrics_page_is_a_json_500(
    served: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(served.app[METRICS], "render", _broken)
    await _error(await served.get("/metrics"), 500, "internal_error")


async def test_a_stopped_engine_is_a_503_on_every_engine_endpoint(
    served: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine's own errors keep their meaning: a stopped engine is a 503, not a bug."""
    engine = served.app[HOST].engine

    def stopped(*_args: Any, **_kwargs: Any) -> Any:
        raise EngineDeadError("the engine is stopped")

    for name in ("tokenize", "block_map"):
        monkeypatch.setattr(engine, name, stopped)
    await _error(await served.get("/block_map"), 503, "engine_dead")
    plain = {"prompt": "Hi", "add_special_tokens": False}
    await _error(await served.post("/tokenize", json=plain), 503, "engine_dead")


async def test_a_stream_that_breaks_after_its_first_token_ends_with_an_error_event(
    served: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Headers are sent by then: the failure is the stream's last event, as vLLM does."""
    engine = served.app[HOST].engine
    real_generate = engine.generate

    async def breaks(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        """The real request's first output, then a bug."""
        async with aclosing(real_generate(*args, **kwargs)) as outputs:
            async for out in outputs:
                yield out
                raise RuntimeError("something broke")

    monkeypatch.setattr(engine, "generate", breaks)
    response = await served.post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert response.status == 200
    text = await response.text()
    assert '"code": "internal_error"' in text or '"code":"internal_error"' in text
    assert "something broke" in text
    # The request was aborted: its blocks are back, and the engine serves the next one.
    monkeypatch.undo()
    assert await becomes_true(lambda: engine.metrics().kv_blocks_used == 0, 10)
    response = await served.post("/v1/completions", json=COMPLETION)
    assert response.status == 200
