"""Faults against a real ``paged-llm serve``: a long document fills the KV pool under voice."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from benchmarks.soak import SCHEMA, ServerTarget
from tests.helpers.server_process import API_KEY, MODEL, ServerProcess, start_server

# Every caller answers or is refused within this.
BOUND_S = 120.0


@pytest.fixture(scope="module")
def tight_server(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """A KV pool of 1 MiB, about two long requests' worth at this tiny model's size."""
    log = tmp_path_factory.mktemp("tight") / "server.log"
    proc = start_server(
        tiny_model_dir, log, "--served-model-name", MODEL, "--kv-budget", "1MiB",
        "--max-model-len", "1024",
    )  # fmt: skip
    yield proc
    assert proc.stop() == 0, proc.log_text()


async def test_a_long_document_filling_the_pool_leaves_voice_and_tasks_answered(
    tight_server: ServerProcess,
) -> None:
    """Voice first by priority, the document preempted or waiting; all answer, blocks return."""
    target = ServerTarget(tight_server.url, MODEL, tight_server.process.pid, api_key=API_KEY)
    client = target.client
    document = " ".join(["the heating in the hall kept the temperature near twenty"] * 80)

    async def summary() -> str | None:
        done = await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": f"Summarize:\n{document}"}],
            max_tokens=64,
            extra_body={"priority": "background", "ignore_eos": True},
        )
        return done.choices[0].finish_reason

    async def voice(i: int) -> str | None:
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": f"Is light {i} on?"}],
            max_tokens=16,
            stream=True,
            extra_body={"priority": "interactive"},
        )
        reason = None
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].finish_reason:
                reason = chunk.choices[0].finish_reason
        return reason

    async def task() -> str | None:
        done = await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "How many lights in the hall?"}],
            max_tokens=24,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "home", "schema": SCHEMA, "strict": True},
            },
            extra_body={"priority": "automation"},
        )
        return done.choices[0].finish_reason

    async with asyncio.timeout(BOUND_S):
        results = await asyncio.gather(
            summary(), summary(), *(voice(i) for i in range(4)), task(), task(),
            return_exceptions=True,
        )  # fmt: skip
    for result in results:
        # An answer, or a clear refusal naming its code (never a bare 500).
        if isinstance(result, BaseException):
            assert isinstance(result, openai.APIStatusError), repr(result)
            assert result.status_code in (400, 503), repr(result)
            assert result.code, repr(result)
        else:
            assert result in ("stop", "length"), results
    assert not any(isinstance(r, BaseException) for r in results[2:6]), results
    for _ in range(100):
        if await target.blocks_used() == 0:
            break
        await asyncio.sleep(0.1)
    assert await target.blocks_used() == 0
    assert await voice(99) in ("stop", "length")
    assert "Traceback" not in tight_server.log_text()
