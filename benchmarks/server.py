"""``scripts/bench --server``: the same work through ``paged-llm serve`` over HTTP and in-process.

Two cases: 32 chat requests at once, and the home mix with its arrival times. The server
is a real subprocess with the same engine settings; the client streams every request with
aiohttp and times the first content chunk, as an OpenAI client would see it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from paged_llm.engine.config import DEFAULT_MODEL, KVLayout
from paged_llm.engine.model.loader import LoadedModel

from .process import ServerProcess, free_port
from .runners import CLASSES, RequestResult, SystemRun, engine_config, run_engine
from .workload import HomeRequest

BATCH = 32
BATCH_TOKENS = 64


def paged_server(args: argparse.Namespace, log: Path) -> ServerProcess:
    """``paged-llm serve`` with the engine settings of the in-process runs, not yet started."""
    config = engine_config(args, KVLayout.PAGED)
    port = free_port()
    command = [
        sys.executable, "-m", "paged_llm", "serve", DEFAULT_MODEL,
        "--device", "cpu", "--dtype", args.dtype, "--kv-budget", str(int(config.kv_budget)),
        "--block-size", str(config.block_size), "--max-num-seqs", str(config.max_num_seqs),
        "--max-num-batched-tokens", str(config.max_num_batched_tokens),
        "--max-model-len", str(config.max_model_len), "--cache-dir", str(config.cache_dir),
        "--port", str(port), "--log-level", "WARNING",
    ]  # fmt: skip
    return ServerProcess("paged-llm serve", command, port, log_path=log, stop_seconds=120)


async def _drive_http(url: str, workload: list[HomeRequest]) -> SystemRun:
    """Stream every request at its arrival offset; figures as the client sees them."""
    import aiohttp

    async def one(session: aiohttp.ClientSession, req: HomeRequest) -> RequestResult:
        await asyncio.sleep(max(0.0, start + req.arrival - time.monotonic()))
        arrived = time.monotonic()
        body = {
            "prompt": req.prompt_ids,
            "max_tokens": req.max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "priority": req.priority,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        first = None
        tokens = 0
        async with session.post(f"{url}/v1/completions", json=body) as response:
            response.raise_for_status()
            async for line in response.content:
                data = line.decode().removeprefix("data: ").strip()
                if not data or data == "[DONE]":
                    continue
                chunk = json.loads(data)
                if first is None and chunk["choices"] and chunk["choices"][0]["text"]:
                    first = time.monotonic()
                if chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
        done = time.monotonic()
        ttft = (first or done) - arrived
        return RequestResult(
            req.request_id, req.priority, req.arrival, ttft, done - arrived, 0.0, tokens
        )

    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        start = time.monotonic()
        results = await asyncio.gather(*(one(session, r) for r in workload))
        makespan = time.monotonic() - start - workload[0].arrival
    return SystemRun("paged engine through HTTP", list(results), makespan)


def _batch(workload: list[HomeRequest]) -> list[HomeRequest]:
    """32 chat requests arriving at once."""
    chats = [r for r in workload if r.priority != "background"]
    return [
        HomeRequest(
            f"b{i}",
            chats[i % len(chats)].priority,
            0.0,
            chats[i % len(chats)].prompt_ids,
            BATCH_TOKENS,
        )
        for i in range(BATCH)
    ]


def _compare(local: SystemRun, http: SystemRun) -> dict[str, Any]:
    """Throughput ratio and the time to first token HTTP adds, per class."""
    local_c, http_c = local.per_class(), http.per_class()
    added = {}
    for cls in CLASSES:
        a, b = local_c[cls]["ttft_p50"], http_c[cls]["ttft_p50"]
        added[cls] = None if a is None or b is None else b - a
    return {
        "in_process_tokens_per_s": local.tokens_per_s,
        "http_tokens_per_s": http.tokens_per_s,
        "ratio": http.tokens_per_s / local.tokens_per_s if local.tokens_per_s else None,
        "ttft_p50_added_s": added,
        "in_process": local_c,
        "http": http_c,
    }


def server_experiment(
    loaded: LoadedModel, workload: list[HomeRequest], args: argparse.Namespace, out: Path
) -> dict[str, Any]:
    """Both cases in-process and through a ``paged-llm serve`` subprocess."""
    config = engine_config(args, KVLayout.PAGED)
    batch = _batch(workload)
    local_batch = run_engine(loaded, config, batch, "in-process, 32 at once")
    local_mix = run_engine(loaded, config, workload, "in-process, home mix")
    with paged_server(args, out / "server.log") as server:
        http_batch = asyncio.run(_drive_http(server.url, batch))
        http_mix = asyncio.run(_drive_http(server.url, workload))
    return {"batch32": _compare(local_batch, http_batch), "home_mix": _compare(local_mix, http_mix)}


def server_report(data: dict[str, Any]) -> str:
    """A short table of both cases."""
    lines = [
        "| case | in-process tok/s | HTTP tok/s | ratio (target >= 0.9) "
        "| TTFT p50 added (interactive / automation / background) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for case in ("batch32", "home_mix"):
        row = data[case]
        added = " / ".join(
            "-" if v is None else f"{v * 1000:+.0f} ms" for v in row["ttft_p50_added_s"].values()
        )
        lines.append(
            f"| {case} | {row['in_process_tokens_per_s']:.1f} | {row['http_tokens_per_s']:.1f} "
            f"| {row['ratio']:.2f} | {added} |"
        )
    return "\n".join(lines)
