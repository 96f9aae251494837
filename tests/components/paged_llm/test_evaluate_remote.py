"""ai_task.evaluate through a real `paged-llm serve`: the embedded engine's answers, remotely."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web
from homeassistant.core import HomeAssistant
from homeassistant.exceptions import HomeAssistantError
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.paged_llm.backend import ScoreQuery
from tests.components.paged_llm.test_evaluate import QUESTIONS, _evaluate
from tests.components.paged_llm.test_remote import (  # noqa: F401 (fixtures)
    API_KEY,
    _agent,
    local_sockets,
    remote_entry,
    server,
)
from tests.helpers.remote_server import ServerProcess, free_port


async def test_remote_answers_equal_the_embedded_engines_on_the_same_model(
    hass: HomeAssistant,
    init_integration: MockConfigEntry,
    remote_entry: MockConfigEntry,
    server: ServerProcess,
) -> None:
    embedded = await _evaluate(hass, _agent(hass, init_integration, "ai_task_data"), QUESTIONS)
    remote = await _evaluate(hass, _agent(hass, remote_entry, "ai_task_data"), QUESTIONS)
    for question_id in QUESTIONS:
        here, there = embedded["answers"][question_id], remote["answers"][question_id]
        assert here.keys() == there.keys()
        for key, value in here.items():
            if isinstance(value, dict):
                assert list(value) == list(there[key])
                assert list(value.values()) == pytest.approx(list(there[key].values()), abs=1e-4)
            elif isinstance(value, float | list):
                assert value == pytest.approx(there[key], abs=1e-4), (question_id, key)
            else:
                assert value == there[key]
    # The server read each alternative's tail only: the state came from its prefix cache.
    async with aiohttp.ClientSession() as session:
        headers = {"Authorization": f"Bearer {API_KEY}"}
        async with session.get(f"{server.url}/metrics", headers=headers) as resp:
            metrics = await resp.text()
    hits = [
        float(line.split()[-1])
        for line in metrics.splitlines()
        if line.startswith("vllm:prefix_cache_hits")
    ]
    assert hits and hits[0] > 0


async def _proxy_without_prompt_logprobs(target: str) -> AsyncIterator[str]:
    """A server in front of ``target`` whose completions carry no prompt_logprobs.

    It stands for a server that ignores the field (llama.cpp's, Ollama's): everything else
    is the real server's answer.
    """
    session = aiohttp.ClientSession()

    async def forward(request: web.Request) -> web.Response:
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() != "host"}
        async with session.request(
            request.method, f"{target}{request.path_qs}", data=body, headers=headers
        ) as resp:
            payload = await resp.read()
            if request.path == "/v1/completions" and resp.status == 200:
                data = await resp.json()
                for choice in data.get("choices", []):
                    choice.pop("prompt_logprobs", None)
                return web.json_response(data)
            return web.Response(body=payload, status=resp.status, content_type=resp.content_type)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", forward)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()
        await session.close()


async def test_a_server_without_prompt_logprobs_cannot_evaluate_and_says_so(
    hass: HomeAssistant, remote_entry: MockConfigEntry, server: ServerProcess
) -> None:
    backend = remote_entry.runtime_data.backend
    real_root, real_api = backend.client.root, backend.client.api
    async for url in _proxy_without_prompt_logprobs(server.url):
        backend.client.root, backend.client.api = url, f"{url}/v1"
        try:
            with pytest.raises(HomeAssistantError) as caught:
                await _evaluate(hass, _agent(hass, remote_entry, "ai_task_data"), QUESTIONS)
        finally:
            backend.client.root, backend.client.api = real_root, real_api
    assert caught.value.translation_key == "evaluate_unsupported"
    assert "prompt_logprobs" in str(caught.value)
    # The server itself still evaluates.
    query = ScoreQuery([{"role": "user", "content": "Is it on?"}], ["yes", "no"])
    scores = await backend.async_score([query], "automation")
    assert len(scores[0]) == 2
    assert all(score < 0 for score in scores[0])
