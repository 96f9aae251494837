"""The SSE wire format line by line, /metrics as Prometheus parses it, and 64 streams at once."""

from __future__ import annotations

import asyncio
import json
import random
import time
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers.server_process import MODEL, ServerProcess

HELLO = [{"role": "user", "content": "Tell me about the kitchen lights."}]


def _chat(max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": HELLO, "max_tokens": max_tokens, **extra}


async def _metrics(session: aiohttp.ClientSession, server: ServerProcess) -> dict[str, Any]:
    """Every sample by name (plus labels other than model_name), and the family types."""
    async with session.get(f"{server.url}/metrics", headers=server.headers) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        text = await response.text()
    samples: dict[str, Any] = {}
    types: dict[str, str] = {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for sample in family.samples:
            assert sample.labels.get("model_name") == MODEL, sample
            extra = tuple(sorted((k, v) for k, v in sample.labels.items() if k != "model_name"))
            samples[sample.name if not extra else f"{sample.name}{dict(extra)}"] = sample.value
    samples["__types__"] = types
    return samples


async def _wait_for(
    session: aiohttp.ClientSession, server: ServerProcess, check: Any, within: float = 20.0
) -> dict[str, Any]:
    """Poll /metrics until ``check(samples)`` holds."""
    deadline = time.monotonic() + within
    while True:
        samples = await _metrics(session, server)
        if check(samples):
            return samples
        assert time.monotonic() < deadline, samples
        await asyncio.sleep(0.1)


def _idle(s: dict[str, Any]) -> bool:
    return (
        s["vllm:num_requests_running"] == 0
        and s["vllm:num_requests_waiting"] == 0
        and s["paged_llm:kv_blocks_used"] == 0
    )


async def test_sse_wire_format_line_by_line(server: ServerProcess) -> None:
    body = _chat(5, stream=True, stream_options={"include_usage": True})
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{server.url}/v1/chat/completions", json=body, headers=server.headers
        ) as response,
    ):
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/event-stream")
        raw = (await response.read()).decode()
    assert raw.endswith("data: [DONE]\n\n")
    events = raw.split("\n\n")[:-1]
    # Every event is exactly one `data: ` line.
    assert all(e.startswith("data: ") and "\n" not in e for e in events), events
    payloads = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
    assert events[-1] == "data: [DONE]"
    assert {p["object"] for p in payloads} == {"chat.completion.chunk"}
    assert len({p["id"] for p in payloads}) == 1
    first, *middle, finish, usage = payloads
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(set(p["choices"][0]["delta"]) == {"content"} for p in middle)
    assert all(p["choices"][0]["finish_reason"] is None for p in [first, *middle])
    assert finish["choices"][0] == {
        "index": 0, "delta": {}, "finish_reason": "length", "logprobs": None
    }  # fmt: skip
    assert usage["choices"] == []
    assert usage["usage"]["completion_tokens"] == 5
    assert usage["usage"]["total_tokens"] == usage["usage"]["prompt_tokens"] + 5


async def test_metrics_move_with_requests_and_return_to_idle(server: ServerProcess) -> None:
    async with aiohttp.ClientSession() as session:
        before = await _wait_for(session, server, _idle)
        types = before["__types__"]
        assert types["vllm:num_requests_running"] == "gauge"
        assert types["vllm:num_requests_waiting"] == "gauge"
        assert types["vllm:kv_cache_usage_perc"] == "gauge"
        for counter in (
            "vllm:num_preemptions",
            "vllm:prefix_cache_queries",
            "vllm:prefix_cache_hits",
            "vllm:prompt_tokens",
            "vllm:generation_tokens",
        ):
            assert types[counter] == "counter", counter
            assert f"{counter}_total" in before
        for histogram in (
            "vllm:time_to_first_token_seconds",
            "vllm:request_queue_time_seconds",
            "vllm:e2e_request_latency_seconds",
            "paged_llm:time_to_first_token_seconds",
            "paged_llm:request_queue_time_seconds",
        ):
            assert types[histogram] == "histogram", histogram
        assert before["paged_llm:kv_blocks_total"] > 0
        assert "paged_llm:kv_blocks_cached" in before
        assert "paged_llm:time_to_first_token_seconds_count{'priority': 'background'}" in before

        # A long stream: while it runs the gauges show it.
        url = f"{server.url}/v1/chat/completions"
        body = _chat(400, stream=True, temperature=0, priority="background")
        async with session.post(url, json=body, headers=server.headers) as response:
            assert response.status == 200
            await response.content.readline()
            during = await _wait_for(
                session,
                server,
                lambda s: s["vllm:num_requests_running"] == 1 and s["paged_llm:kv_blocks_used"] > 0,
            )
            assert 0 < during["vllm:kv_cache_usage_perc"] <= 1
            await response.read()
        after = await _wait_for(session, server, _idle)
    assert after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] == 400
    assert after["vllm:prompt_tokens_total"] > before["vllm:prompt_tokens_total"]
    key = "vllm:time_to_first_token_seconds_count"
    assert after[key] == before[key] + 1
    bg = "paged_llm:time_to_first_token_seconds_count{'priority': 'background'}"
    assert after[bg] == before[bg] + 1
    assert after["vllm:request_success_total{'finished_reason': 'length'}"] >= 1


async def _stream(
    session: aiohttp.ClientSession, server: ServerProcess, leave_after: int | None
) -> str | None:
    """One streaming chat; leave after ``leave_after`` events, else read to [DONE]."""
    url = f"{server.url}/v1/chat/completions"
    body = _chat(48, stream=True, temperature=0.8, seed=random.randrange(1000))
    async with session.post(url, json=body, headers=server.headers) as response:
        assert response.status == 200, await response.text()
        events = 0
        finish = None
        async for line in response.content:
            if not line.strip():
                continue
            data = line.decode().removeprefix("data: ").strip()
            if data == "[DONE]":
                return finish
            chunk = json.loads(data)
            assert "error" not in chunk, chunk
            if chunk["choices"] and chunk["choices"][0]["finish_reason"]:
                finish = chunk["choices"][0]["finish_reason"]
            events += 1
            if leave_after is not None and events >= leave_after:
                response.close()  # the client goes away mid-stream
                return None
    raise AssertionError("the stream ended without [DONE]")


async def test_64_streams_with_a_third_disconnecting(server: ServerProcess) -> None:
    rng = random.Random(11)
    plans = [rng.randrange(1, 30) if i % 3 == 0 else None for i in range(64)]
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        results = await asyncio.wait_for(
            asyncio.gather(*(_stream(session, server, plan) for plan in plans)), timeout=300
        )
        completed = [r for r, plan in zip(results, plans, strict=True) if plan is None]
        assert len(completed) == 64 - 22
        assert all(r in ("length", "stop") for r in completed), completed
        # Every block is back and nothing is left running or queued.
        await _wait_for(session, server, _idle)
        # The server still answers.
        async with session.post(
            f"{server.url}/v1/chat/completions", json=_chat(3), headers=server.headers
        ) as response:
            assert response.status == 200
            assert (await response.json())["usage"]["completion_tokens"] == 3
