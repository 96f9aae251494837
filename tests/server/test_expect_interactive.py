"""``POST /expect_interactive``: an announced voice query holds the server engine's step budget."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
from aiohttp.test_utils import TestClient, TestServer

from paged_llm.client import OpenAIClient
from paged_llm.engine.config import EngineConfig
from paged_llm.server.app import make_app
from paged_llm.server.host import EngineHost
from paged_llm.server.settings import ServerSettings
from tests.helpers.support import becomes_true


async def test_an_announcement_holds_the_budget_and_needs_the_key(
    tiny_model_dir: Path, socket_enabled: None
) -> None:
    config = EngineConfig(
        model=str(tiny_model_dir),
        device="cpu",
        dtype="float32",
        kv_budget=2**20,
        interactive_hold_seconds=0.3,
    )
    host = EngineHost(config)
    await host.start()
    client = TestClient(TestServer(make_app(host, ServerSettings(api_key="secret"))))
    await client.start_server()
    scheduler = host.engine._llm.scheduler
    try:
        response = await client.post("/expect_interactive")
        assert response.status == 401
        assert not scheduler.step_budget_held()

        url = str(client.make_url("/v1"))
        async with aiohttp.ClientSession() as session:
            assert await OpenAIClient(session, url, api_key="secret").expect_interactive()
            assert await becomes_true(scheduler.step_budget_held, 1.0)
            await asyncio.sleep(0.4)
            assert not scheduler.step_budget_held()  # the hold lapsed
            # A wrong key is refused: not "no such call", so a later announcement tries again.
            assert await OpenAIClient(session, url, api_key="wrong").expect_interactive() is None
    finally:
        await client.close()
        await host.stop()


async def test_a_server_without_the_call_or_out_of_reach_says_so(socket_enabled: None) -> None:
    app = aiohttp.web.Application()  # an OpenAI-compatible server of another make
    client = TestClient(TestServer(app))
    await client.start_server()
    try:
        async with aiohttp.ClientSession() as session:
            other = OpenAIClient(session, str(client.make_url("/v1")))
            assert await other.expect_interactive() is False
            gone = OpenAIClient(session, "http://127.0.0.1:9", timeout=2)
            assert await gone.expect_interactive() is None
    finally:
        await client.close()


async def test_a_server_still_loading_is_asked_again_later(
    tiny_model_dir: Path, socket_enabled: None
) -> None:
    host = EngineHost(EngineConfig(model=str(tiny_model_dir), device="cpu"))  # not started
    client = TestClient(TestServer(make_app(host, ServerSettings())))
    await client.start_server()
    try:
        response = await client.post("/expect_interactive")
        assert response.status == 503
        async with aiohttp.ClientSession() as session:
            loading = OpenAIClient(session, str(client.make_url("/v1")))
            assert await loading.expect_interactive() is None  # not "no such call"
    finally:
        await client.close()
