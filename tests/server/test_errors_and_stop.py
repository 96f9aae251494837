"""Every error status once, the loopback-only default, and a graceful stop on SIGTERM."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from tests.helpers.server_process import MODEL, ServerProcess, start_server

HELLO = [{"role": "user", "content": "Tell me about the kitchen lights."}]


@pytest.fixture(scope="module")
def small_server(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """One sequence at a time, one waiting, a 4 KiB body limit: limits that are easy to hit."""
    log = tmp_path_factory.mktemp("small") / "server.log"
    proc = start_server(
        tiny_model_dir,
        log,
        "--served-model-name", MODEL,
        "--max-num-seqs", "1",
        "--max-waiting", "1",
        "--max-body-size", "4KiB",
        "--grace-period", "60",
    )  # fmt: skip
    yield proc
    proc.stop()


async def _post(
    session: aiohttp.ClientSession, server: ServerProcess, body: object, **kwargs: object
) -> tuple[int, dict[str, object], aiohttp.typedefs.LooseHeaders]:
    headers = kwargs.pop("headers", server.headers)
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with session.post(
        f"{server.url}/v1/chat/completions", data=data, headers=headers
    ) as response:
        return response.status, await response.json(), response.headers


def _error(payload: dict[str, object]) -> dict[str, object]:
    error = payload["error"]
    assert isinstance(error, dict)
    assert set(error) == {"message", "type", "param", "code"}
    return error


async def test_401_without_the_key_and_open_health(small_server: ServerProcess) -> None:
    async with aiohttp.ClientSession() as session:
        status, payload, _ = await _post(session, small_server, {"messages": HELLO}, headers={})
        assert status == 401
        assert _error(payload)["type"] == "authentication_error"
        async with session.get(f"{small_server.url}/metrics") as response:
            assert response.status == 401
        async with session.get(f"{small_server.url}/health") as response:
            assert response.status == 200
        async with session.get(f"{small_server.url}/version") as response:
            assert (await response.json())["version"]


async def test_400_404_413(small_server: ServerProcess) -> None:
    async with aiohttp.ClientSession() as session:
        status, payload, _ = await _post(session, small_server, b"{not json")
        assert status == 400
        assert "not valid JSON" in str(_error(payload)["message"])
        status, payload, _ = await _post(
            session, small_server, {"messages": HELLO, "temperature": "hot"}
        )
        assert status == 400
        assert _error(payload)["param"] == "temperature"
        status, payload, _ = await _post(
            session, small_server, {"model": "other", "messages": HELLO}
        )
        assert status == 404
        assert _error(payload)["code"] == "model_not_found"
        async with session.get(
            f"{small_server.url}/v1/nothing", headers=small_server.headers
        ) as response:
            assert response.status == 404
            assert _error(await response.json())["code"] == "not_found"
        big = {"messages": [{"role": "user", "content": "x" * 8000}]}
        status, payload, _ = await _post(session, small_server, big)
        assert status == 413
        assert "4096 bytes" in str(_error(payload)["message"])


async def test_503_with_retry_after_when_the_queue_is_full(small_server: ServerProcess) -> None:
    url = f"{small_server.url}/v1/chat/completions"
    body = {"messages": HELLO, "max_tokens": 2000, "stream": True, "temperature": 0}
    async with aiohttp.ClientSession() as session:
        # One runs, one waits: the third finds the queue full.
        running = await session.post(url, json=body, headers=small_server.headers)
        await running.content.readline()
        waiting = asyncio.create_task(session.post(url, json=body, headers=small_server.headers))
        await asyncio.sleep(1.0)
        status, payload, headers = await _post(session, small_server, {"messages": HELLO})
        assert status == 503
        assert headers["Retry-After"] == "1"
        assert _error(payload)["code"] == "queue_full"
        running.close()
        (await waiting).close()


def test_refuses_to_listen_beyond_loopback_without_a_key(tiny_model_dir: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "paged_llm", "serve", str(tiny_model_dir), "--host", "0.0.0.0"],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 2
    assert "--no-auth" in result.stderr
    assert "API key" in result.stderr


async def test_sigterm_lets_a_running_stream_finish(small_server: ServerProcess) -> None:
    url = f"{small_server.url}/v1/chat/completions"
    body = {"messages": HELLO, "max_tokens": 200, "stream": True, "temperature": 0}
    async with aiohttp.ClientSession() as session:
        async with session.post(url, json=body, headers=small_server.headers) as response:
            await response.content.readline()
            small_server.process.send_signal(15)
            raw = (await response.read()).decode()
        assert raw.endswith("data: [DONE]\n\n")
        assert '"finish_reason":"length"' in raw
    assert await asyncio.to_thread(small_server.process.wait, 60) == 0
    log = small_server.log_text()
    assert "stopping" in log
    assert "stopped" in log


async def test_health_is_503_while_loading_and_after_a_failed_load(tmp_path: Path) -> None:
    missing = tmp_path / "no-model-here"
    proc = start_server(missing, tmp_path / "server.log", ready=False)
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(600):
                async with session.get(f"{proc.url}/health") as response:
                    assert response.status == 503
                    state = (await response.json())["status"]
                if state == "failed":
                    break
                assert state == "loading"
                await asyncio.sleep(0.2)
            async with session.get(f"{proc.url}/health") as response:
                detail = (await response.json())["detail"]
            assert "does not exist" in detail
            status, payload, _ = await _post(session, proc, {"messages": HELLO})
            assert status == 503
            assert _error(payload)["code"] == "model_not_ready"
    finally:
        assert proc.stop() == 0
