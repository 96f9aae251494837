"""Soak: mixed requests (voice, AI task with a schema, summaries, some cancelled) for a long while.

Through a real ``paged-llm serve`` (the official openai client) or a Home Assistant in this
process (its conversation agent, AI task and summarize action). Bounded in time; prints the
errors by kind, p50/p95/p99 latency by priority, KV blocks left in use once idle, and the
peak memory growth over the warmed-up process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from paged_llm.defaults import DEFAULT_MODEL

from .process import ServerProcess, free_port, peak_rss

# Share of each kind in the mix, with its priority class.
MIX = (("voice", "interactive", 0.6), ("task", "automation", 0.25), ("summary", "background", 0.15))
CANCEL_SHARE = 0.1
QUESTIONS = ("Is the kitchen light on?", "Turn off the hall heating.", "What time is it?")
SCHEMA = {
    "type": "object",
    "properties": {"room": {"type": "string"}, "lights": {"type": "integer"}},
    "required": ["room", "lights"],
    "additionalProperties": False,
}
WORDS = "the washing machine finished its cycle while the heating kept the hall warm".split()  # noqa: SIM905
# Errors a request's own answer may end with on a random-weights model (a structured
# answer cut off at max_tokens): the model's, not a fault of the serving path.
ANSWER_ERRORS = frozenset({"structured_output_cut_off", "structured_output_not_json",
                           "structured_output_invalid"})  # fmt: skip


@dataclass(slots=True)
class Job:
    """One request of the mix: its kind, text, and when it is cancelled (None: never)."""

    number: int
    kind: str
    priority: str
    text: str
    cancel_after_s: float | None


@dataclass(slots=True)
class Outcome:
    """How one job ended: its latency, or the kind of its error, or that it was cancelled."""

    job: Job
    latency_s: float
    error: str | None = None
    cancelled: bool = False


def plan(
    count: int, seed: int, summary_words: int = 600, cancel_within_s: float = 1.0
) -> list[Job]:
    """``count`` jobs in the mix's shares, a tenth cancelled at a random point; seeded.

    The point is drawn within ``cancel_within_s`` of the start: a run whose requests end
    sooner than that (a small model on a quiet machine) draws it shorter, or none land.
    """
    rng = random.Random(seed)
    jobs = []
    for number in range(count):
        kind, priority, _ = rng.choices(MIX, weights=[share for *_, share in MIX])[0]
        if kind == "summary":
            length = rng.randint(summary_words // 2, summary_words)
            text = " ".join(rng.choice(WORDS) for _ in range(length))
        else:
            text = rng.choice(QUESTIONS)
        cancel = rng.uniform(0.0, cancel_within_s) if rng.random() < CANCEL_SHARE else None
        jobs.append(Job(number, kind, priority, text, cancel))
    return jobs


class Target(Protocol):
    """What the soak drives: a request per job, the pool's used blocks, memory figures."""

    async def run(self, job: Job) -> None:
        """Run the job to its end; raise what the caller would meet."""

    async def blocks_used(self) -> int:
        """KV blocks held now."""

    def rss(self) -> int:
        """Resident memory of the serving process, bytes."""

    def peak(self) -> int:
        """Peak resident memory of the serving process so far, bytes."""


def error_kind(err: BaseException) -> str:
    """A short kind: the translation key, the server's error code, else the class."""
    key = getattr(err, "translation_key", None) or getattr(err, "code", None)
    status = getattr(err, "status_code", None)
    name = type(err).__name__
    return f"{name}:{status or ''}:{key or ''}".rstrip(":")


@dataclass(slots=True)
class Report:
    """The soak's figures."""

    outcomes: list[Outcome] = field(default_factory=list)
    not_run: int = 0
    seconds: float = 0.0
    leaked_blocks: int = 0
    rss_start: int = 0
    rss_end: int = 0
    rss_peak: int = 0

    def errors(self) -> Counter[str]:
        """Errors by kind."""
        return Counter(o.error for o in self.outcomes if o.error is not None)

    def faults(self) -> Counter[str]:
        """Errors that are not the model's own answer failing its schema."""
        return Counter(
            {k: n for k, n in self.errors().items() if k.split(":")[-1] not in ANSWER_ERRORS}
        )

    def latencies(self) -> dict[str, dict[str, float]]:
        """p50/p95/p99 seconds of answered requests, by priority."""
        by: dict[str, list[float]] = {}
        for o in self.outcomes:
            if o.error is None and not o.cancelled:
                by.setdefault(o.job.priority, []).append(o.latency_s)
        return {
            priority: {
                "n": len(xs),
                **{f"p{q}": _quantile(xs, q / 100) for q in (50, 95, 99)},
            }
            for priority, xs in sorted(by.items())
        }

    def as_dict(self) -> dict[str, Any]:
        """Everything printed, as data."""
        return {
            "requests": len(self.outcomes) + self.not_run,
            "not_run": self.not_run,
            "seconds": round(self.seconds, 1),
            "cancelled": sum(o.cancelled for o in self.outcomes),
            "errors": dict(self.errors()),
            "faults": dict(self.faults()),
            "latency_s": self.latencies(),
            "leaked_blocks": self.leaked_blocks,
            "rss_start_mib": round(self.rss_start / 2**20, 1),
            "rss_end_mib": round(self.rss_end / 2**20, 1),
            "peak_growth_mib": round((self.rss_peak - self.rss_start) / 2**20, 1),
        }

    def text(self, name: str) -> str:
        """A few lines for the terminal."""
        data = self.as_dict()
        lines = [
            f"soak through {name}: {data['requests']} requests in {data['seconds']} s "
            f"({data['not_run']} not started within the bound), {data['cancelled']} cancelled",
            f"  errors by kind: {data['errors'] or 'none'}",
        ]
        for priority, q in data["latency_s"].items():
            lines.append(
                f"  {priority:<12} n={q['n']:<5} p50 {q['p50']:.2f} s  p95 {q['p95']:.2f} s  "
                f"p99 {q['p99']:.2f} s"
            )
        lines.append(
            f"  KV blocks in use once idle: {data['leaked_blocks']}; memory "
            f"{data['rss_start_mib']} MiB after warm-up, {data['rss_end_mib']} MiB at the end, "
            f"peak growth {data['peak_growth_mib']} MiB"
        )
        return "\n".join(lines)


def _quantile(xs: list[float], q: float) -> float:
    """The ``q`` quantile of ``xs`` (inclusive method; one value is itself)."""
    if len(xs) == 1:
        return xs[0]
    return statistics.quantiles(xs, n=100, method="inclusive")[round(q * 100) - 1]


async def _one(target: Target, job: Job) -> Outcome:
    """Run ``job``, cancelling it at its point; how it ended."""
    started = time.monotonic()
    task = asyncio.ensure_future(target.run(job))
    try:
        if job.cancel_after_s is not None:
            done, _ = await asyncio.wait({task}, timeout=job.cancel_after_s)
            if not done:
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    return Outcome(job, time.monotonic() - started, cancelled=True)
        await task
    except Exception as err:  # every kind is counted, none ends the soak
        return Outcome(job, time.monotonic() - started, error=error_kind(err))
    return Outcome(job, time.monotonic() - started)


async def soak(
    target: Target, jobs: Sequence[Job], concurrency: int = 16, bound_s: float = 600.0
) -> Report:
    """Run ``jobs`` with at most ``concurrency`` at once, none started after ``bound_s``."""
    report = Report()
    report.rss_start = target.rss()
    gate = asyncio.Semaphore(concurrency)
    began = time.monotonic()

    async def gated(job: Job) -> Outcome | None:
        async with gate:
            if time.monotonic() - began > bound_s:
                return None
            return await _one(target, job)

    results = await asyncio.gather(*(gated(job) for job in jobs))
    report.seconds = time.monotonic() - began
    report.outcomes = [r for r in results if r is not None]
    report.not_run = sum(r is None for r in results)
    # Aborts reach the engine thread within a step or two; give it a few seconds.
    for _ in range(100):
        report.leaked_blocks = await target.blocks_used()
        if report.leaked_blocks == 0:
            break
        await asyncio.sleep(0.1)
    report.rss_end = target.rss()
    report.rss_peak = target.peak()
    return report


class ServerTarget:
    """A ``paged-llm serve`` process, through the official openai client."""

    def __init__(self, url: str, model: str, pid: int, api_key: str = "none") -> None:
        """Talk to the server at ``url`` (its process ``pid``, for memory)."""
        from openai import AsyncOpenAI

        self.url, self.model, self.pid = url, model, pid
        self.client = AsyncOpenAI(base_url=f"{url}/v1", api_key=api_key, max_retries=0)
        self._headers = {"Authorization": f"Bearer {api_key}"}

    async def run(self, job: Job) -> None:
        """Voice streams; the task asks for the schema; a summary waits for the whole answer."""
        messages = [{"role": "user", "content": job.text}]
        extra = {"priority": job.priority}
        if job.kind == "voice":
            stream = await self.client.chat.completions.create(
                model=self.model, messages=messages, max_tokens=16, stream=True, extra_body=extra
            )
            async for _chunk in stream:
                pass
        elif job.kind == "task":
            await self.client.chat.completions.create(
                model=self.model,
                messages=messages,
                max_tokens=32,
                response_format={
                    "type": "json_schema",
                    "json_schema": {"name": "home", "schema": SCHEMA, "strict": True},
                },
                extra_body=extra,
            )
        else:
            summary = [{"role": "user", "content": f"Summarize:\n{job.text}"}]
            await self.client.chat.completions.create(
                model=self.model, messages=summary, max_tokens=24, extra_body=extra
            )

    async def blocks_used(self) -> int:
        """The server's ``paged_llm:kv_blocks_used`` gauge."""
        from paged_llm.client.metrics import parse_metrics
        from paged_llm.protocol.metrics import KV_BLOCKS_USED

        response = await self.client._client.get(f"{self.url}/metrics", headers=self._headers)
        values = parse_metrics(response.text).values
        return int(values.get(KV_BLOCKS_USED, 0))

    def rss(self) -> int:
        """The server's resident memory now."""
        return _status_bytes(self.pid, "VmRSS:")

    def peak(self) -> int:
        """The server's peak resident memory."""
        return peak_rss(self.pid)


class HassTarget:
    """A Home Assistant's Paged LLM entry: its conversation agent, AI task and summarize action."""

    def __init__(self, hass: Any, entry: Any, voice: str, task: str) -> None:
        """Drive ``entry`` in ``hass`` through the agents ``voice`` and ``task``."""
        self.hass, self.entry, self.voice, self.task = hass, entry, voice, task

    async def run(self, job: Job) -> None:
        """What an Assist pipeline, an automation's AI task and a summarize action call."""
        from homeassistant.components import ai_task, conversation
        from homeassistant.core import Context
        from homeassistant.exceptions import HomeAssistantError
        from homeassistant.helpers import intent

        if job.kind == "voice":
            result = await conversation.async_converse(
                self.hass, job.text, None, Context(), agent_id=self.voice
            )
            if result.response.response_type is intent.IntentResponseType.ERROR:
                raise HomeAssistantError(result.response.speech["plain"]["speech"])
        elif job.kind == "task":
            await ai_task.async_generate_data(
                self.hass, task_name="soak", entity_id=self.task, instructions=job.text
            )
        else:
            await self.hass.services.async_call(
                "paged_llm",
                "summarize",
                {"text": job.text, "max_tokens": 24},
                blocking=True,
                return_response=True,
            )

    async def blocks_used(self) -> int:
        """The entry's engine's used KV blocks."""
        return int(self.entry.runtime_data.backend.engine.metrics().kv_blocks_used)

    def rss(self) -> int:
        """Resident memory of this process now (Home Assistant runs here)."""
        return _status_bytes("self", "VmRSS:")

    def peak(self) -> int:
        """Peak resident memory of this process."""
        return _status_bytes("self", "VmHWM:")


def _status_bytes(pid: int | str, field_name: str) -> int:
    """A ``/proc/<pid>/status`` memory field in bytes, 0 when it is gone."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith(field_name):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


async def warm_up(target: Target) -> None:
    """One job of each kind first, so memory growth is measured over a warmed-up process."""
    for kind, priority, _ in MIX:
        text = " ".join(WORDS * 10) if kind == "summary" else QUESTIONS[0]
        await _one(target, Job(-1, kind, priority, text, None))


def _server_run(args: argparse.Namespace, jobs: list[Job]) -> Report:
    """Start ``paged-llm serve`` and soak it."""
    port = free_port()
    command = [
        sys.executable, "-m", "paged_llm", "serve", args.model, "--device", "cpu",
        "--kv-budget", args.kv_budget, "--port", str(port), "--log-level", "WARNING",
        "--served-model-name", "soak",
    ]  # fmt: skip
    with ServerProcess("paged-llm serve", command, port, stop_seconds=60) as server:
        assert server.process is not None
        target = ServerTarget(server.url, "soak", server.process.pid)
        return asyncio.run(_drive(target, jobs, args))


async def _drive(target: Target, jobs: list[Job], args: argparse.Namespace) -> Report:
    """Warm up, then soak."""
    await warm_up(target)
    return await soak(target, jobs, args.concurrency, args.bound)


def _hass_run(args: argparse.Namespace, jobs: list[Job]) -> Report:
    """A Home Assistant in this process with one entry over the model, soaked."""
    from .home_commands import async_home_assistant

    async def run() -> Report:
        with tempfile.TemporaryDirectory(prefix="soak-hass-") as folder:
            async with async_home_assistant(Path(folder)) as hass:
                target = await async_hass_target(hass, args.model, args.kv_budget)
                return await _drive(target, jobs, args)

    return asyncio.run(run())


async def async_hass_target(hass: Any, model: str, kv_budget: str) -> HassTarget:
    """Set up the integration with one conversation and one AI task agent over ``model``."""
    from homeassistant import loader
    from homeassistant.helpers import entity_registry as er
    from homeassistant.setup import async_setup_component
    from pytest_homeassistant_custom_component.common import MockConfigEntry

    hass.data.pop(loader.DATA_CUSTOM_COMPONENTS, None)  # the harness hides custom ones
    for domain in ("homeassistant", "conversation", "ai_task"):
        assert await async_setup_component(hass, domain, {}), domain
    mib = int(kv_budget.removesuffix("MiB"))
    entry = MockConfigEntry(
        domain="paged_llm",
        title="soak",
        data={"model": model, "device": "cpu", "kv_budget_mib": mib, "max_num_seqs": 16},
        subentries_data=[
            {
                "subentry_type": "conversation",
                "data": {"max_tokens": 16},
                "title": "voice",
                "unique_id": None,
            },
            {
                "subentry_type": "ai_task_data",
                "data": {"max_tokens": 32},
                "title": "task",
                "unique_id": None,
            },
        ],
    )
    entry.add_to_hass(hass)
    assert await hass.config_entries.async_setup(entry.entry_id), entry.state
    await hass.async_block_till_done(wait_background_tasks=True)
    registry = er.async_get(hass)
    ids = {
        s.subentry_type: registry.async_get_entity_id(
            "conversation" if s.subentry_type == "conversation" else "ai_task",
            "paged_llm",
            s.subentry_id,
        )
        for s in entry.subentries.values()
    }
    return HassTarget(hass, entry, str(ids["conversation"]), str(ids["ai_task_data"]))


RUNS: dict[str, Callable[[argparse.Namespace, list[Job]], Report]] = {
    "server": _server_run,
    "hass": _hass_run,
}


def main(argv: list[str] | None = None) -> int:
    """``scripts/bench soak [--requests N] [--through server,hass]``; 1 when a fault showed."""
    parser = argparse.ArgumentParser(prog="scripts/bench soak", description=__doc__)
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--through", default="server,hass", help="server, hass or both")
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--kv-budget", default="64MiB")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--bound", type=float, default=3600.0, help="start no job after (s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)
    jobs = plan(args.requests, args.seed)
    figures: dict[str, Any] = {}
    failed = False
    for name in args.through.split(","):
        report = RUNS[name](args, jobs)
        print(report.text(name), flush=True)
        figures[name] = report.as_dict()
        failed = failed or bool(report.faults()) or report.leaked_blocks > 0
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return 1 if failed else 0
