"""The server's block-map endpoint, over a real engine on a tiny model."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from paged_llm.client.openai import OpenAIClient
from paged_llm.engine.config import EngineConfig
from paged_llm.engine.core.kv.block_map import BlockMap
from paged_llm.server.app import make_app
from paged_llm.server.host import EngineHost
from paged_llm.server.settings import ServerSettings


async def test_block_map_follows_requests_and_needs_the_key(
    tiny_model_dir: Path, socket_enabled: None
) -> None:
    config = EngineConfig(model=str(tiny_model_dir), device="cpu", dtype="float32", kv_budget=2**20)
    host = EngineHost(config)
    await host.start()
    client = TestClient(TestServer(make_app(host, ServerSettings(api_key="secret"))))
    await client.start_server()
    headers = {"Authorization": "Bearer secret"}
    try:
        response = await client.get("/block_map")
        assert response.status == 401

        response = await client.get("/block_map", headers=headers)
        assert response.status == 200
        idle = BlockMap.from_dict(await response.json())
        assert idle.used == 0
        assert idle.num_blocks == host.engine.info.num_kv_blocks

        body = {"prompt": "the hall light " * 40, "max_tokens": 64, "ignore_eos": True}
        request = asyncio.create_task(client.post("/v1/completions", json=body, headers=headers))
        # The integration's remote backend asks through the project's client.
        remote = OpenAIClient(client.session, str(client.make_url("/v1")), api_key="secret")
        busy = None
        for _ in range(200):
            data = await remote.block_map()
            assert data is not None
            if data["used"]:
                busy = data
                break
            await asyncio.sleep(0.02)
        assert (await request).status == 200
        assert busy is not None
        cells = base64.b64decode(busy["cells"])
        assert busy["used"] + busy["cached"] + busy["free"] == len(cells) == idle.num_blocks
        assert busy["used_by_class"]["automation"] + busy["used_by_class"]["interactive"] > 0
    finally:
        await client.close()
        await host.stop()
    assert not host.ready


async def test_other_servers_have_no_block_map(socket_enabled: None) -> None:
    async def models(_request: web.Request) -> web.Response:
        return web.json_response({"data": []})

    app = web.Application()
    app.router.add_get("/v1/models", models)
    client = TestClient(TestServer(app))
    await client.start_server()
    try:
        remote = OpenAIClient(client.session, str(client.make_url("/")))
        assert await remote.block_map() is None
    finally:
        await client.close()
