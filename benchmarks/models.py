"""Memory and speed of the recommended files' shapes as the integration runs them (docs/models.md).

For each recommended file of ``package/catalogue.py`` a random-weight Q4_K_M file of the same
shape (``benchmarks.gguf_models``: speed and memory depend on a model's shapes and weight
format, not on its weights; the tokenizer is SmolLM2's, filled to the model's vocabulary)
is served by ``paged-llm serve FILE --device cpu`` with the integration's KV default
(512 MiB, the engine's automatic KV dtype) and every other engine setting at its default, in
a fresh cache folder (the engine's C kernels built once beforehand, as an installed
integration has them after its first load). Ours only: these are the figures a user of the
engine gets, not a comparison. Measured per file:

- load: process start to ``/health`` 200;
- peak resident memory (VmHWM) of the server over the whole run, beside the pool's bytes
  (reserved whole, but resident only as far as it was written);
- decode tokens/s of one request: greedy, EOS ignored, ``--tokens`` (64) after a 16-token
  prompt, counted after its first token;
- the first token after an Assist-sized prompt: docs/models.md's 1,350 tokens with 3
  exposed entities plus 14 for each further one (``--entities`` 25: 1,658 tokens), then a
  30-token question. Cold: a prompt the server has never seen (a voice question after a
  restart or an entity change, before the warm-up ran). Cached: the same prompt with
  another question (every other voice question), the median of 3, with the prompt tokens
  the prefix cache served (its Prometheus counter) to show it did.

From those, computed (not timed end to end): the cold first token at other entity counts
at the measured prompt rate, and docs/models.md's voice answer with a cached prompt (first
token, a 30-token tool call, the tool result's ~50 tokens read, a 15-token confirmation).
Prompts are random token ids, each starting with a token no other prompt starts with.

Prints markdown tables and writes ``bench_results/models-<timestamp>.json`` after each
file. Usage: ``scripts/bench models [--models qwen2.5-1.5b,qwen3-4b,...] [--bundled]
[--entities 25] [--tokens 64]``; a missing file is made first (``benchmarks.gguf_models``,
minutes for a 4B shape).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from . import ROOT, argument_parser
from .gguf import (
    Prompts,
    add_install_option,
    built_kernels,
    http_session,
    machine,
    paged_completion,
    paged_llm,
    paged_version,
    quiet,
    use_install,
)
from .gguf_models import BUNDLED_SHAPE, SHAPES, Shape, ensure_models, parse_list
from .process import ServerProcess, free_port

FORMAT = "Q4_K_M"  # the catalogue's quantization of every recommended file
# Each recommended file (package/catalogue.py's key) and the random-weight shape made for it.
CATALOGUE_SHAPES = {
    "qwen2.5-1.5b": "qwen1.5b",
    "qwen2.5-3b": "qwen2.5-3b",
    "qwen3-1.7b": "qwen3-1.7b",
    "qwen3-4b": "qwen3-4b",
    "llama3.2-3b": "llama3.2-3b",
    "gemma3-1b": "gemma3-1b",
    "gemma3-4b": "gemma3-4b",
}
# The integration's automatic KV budget's floor (package/catalogue.py AUTO_KV_FLOOR): what it
# gives every recommended file but Qwen3 4B and Gemma 3 4B (576 and 544 MiB: their 4,096 tokens).
KV_BUDGET_MIB = 512
# docs/models.md's Assist prompt, measured through the integration: 1,350 tokens with 3
# exposed entities, 14 more for each further one; a question reads 20-40 tokens of its own.
ASSIST_BASE_TOKENS, ASSIST_BASE_ENTITIES, TOKENS_PER_ENTITY = 1350, 3, 14
QUESTION_TOKENS = 30
# docs/models.md's voice answer after the first token: a tool call of ~30 tokens, the tool
# result's ~50 tokens read, a spoken confirmation of ~15.
TOOL_CALL_TOKENS, TOOL_RESULT_TOKENS, CONFIRMATION_TOKENS = 30, 50, 15
# Entity counts of the computed cold waits.
ENTITY_COUNTS = (10, 25, 50, 100)
SHORT_PROMPT = 16


@dataclass(frozen=True, slots=True)
class Plan:
    """What one file's run does."""

    tokens: int = 64  # decoded by the one-request run
    entities: int = 25
    prompt_tokens: int = 0  # 0: the Assist prompt of ``entities``
    question_tokens: int = QUESTION_TOKENS
    cached_repeats: int = 3
    kv_budget_mib: int = KV_BUDGET_MIB

    @property
    def assist_tokens(self) -> int:
        """The shared prompt's length: given, or Assist's for ``entities``."""
        return self.prompt_tokens or assist_tokens(self.entities)


def assist_tokens(entities: int) -> int:
    """Tokens of Assist's prompt with ``entities`` exposed entities (docs/models.md's rule)."""
    return ASSIST_BASE_TOKENS + TOKENS_PER_ENTITY * (entities - ASSIST_BASE_ENTITIES)


class ModelServer(ServerProcess):
    """``paged-llm serve FILE --device cpu`` with the integration's KV budget, INFO log."""

    def __init__(self, gguf: Path, plan: Plan, cache_dir: Path, log: Path) -> None:
        """The command: only the KV budget set, the rest the engine's defaults."""
        port = free_port()
        command = [
            str(paged_llm()), "serve", str(gguf), "--device", "cpu",
            "--kv-budget", f"{plan.kv_budget_mib}MiB", "--cache-dir", str(cache_dir),
            "--host", "127.0.0.1", "--port", str(port), "--log-level", "INFO",
        ]  # fmt: skip
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        super().__init__(
            "paged-llm serve", command, port, env=env, log_path=log, timeout=900, stop_seconds=60
        )


async def prefix_hits(session: Any, url: str, above: float | None = None) -> float:
    """The server's prefix-cache hits so far (prompt tokens), from its Prometheus text.

    With ``above``, waits (up to 2 s) for the figure to pass it: the engine publishes its
    counters at most every fifth of a second, so a reply can come before its count does.
    """
    deadline = time.monotonic() + 2.0
    while True:
        async with session.get(f"{url}/metrics") as reply:
            reply.raise_for_status()
            text = await reply.text()
        found = re.search(r"^vllm:prefix_cache_hits(?:_total)?(?:\{[^}]*\})? (\S+)$", text, re.M)
        hits = float(found[1]) if found else float("nan")
        if above is None or hits > above or time.monotonic() > deadline:
            return hits
        await asyncio.sleep(0.05)


async def measure(url: str, plan: Plan, prompts: Prompts, out: dict[str, Any]) -> None:
    """Warm-up, one request's decode, the Assist prompt cold, then cached.

    Figures go into ``out`` as they come, so a failure late keeps the earlier ones.
    """
    async with http_session() as session:
        started = time.monotonic()
        await paged_completion(session, url, prompts.fresh(SHORT_PROMPT), 8)
        out["warmup_s"] = time.monotonic() - started
        ttft, e2e, n = await paged_completion(
            session, url, prompts.fresh(SHORT_PROMPT), plan.tokens
        )
        out["decode1_tokens"] = n
        out["decode1_tps"] = (n - 1) / (e2e - ttft)
        prefix = prompts.fresh(plan.assist_tokens)
        out["prompt_tokens"] = len(prefix) + plan.question_tokens
        cold = prefix + prompts.fresh(plan.question_tokens)
        out["ttft_cold_s"] = (await paged_completion(session, url, cold, 2))[0]
        out["prompt_tps"] = out["prompt_tokens"] / out["ttft_cold_s"]
        times, hits = [], []
        for _ in range(plan.cached_repeats):
            before = await prefix_hits(session, url)
            question = prompts.fresh(plan.question_tokens)
            times.append((await paged_completion(session, url, prefix + question, 2))[0])
            hits.append(await prefix_hits(session, url, above=before) - before)
        out["ttft_cached_s"] = statistics.median(times)
        out["ttft_cached_all_s"] = times
        out["cached_prompt_tokens"] = hits


_READY = re.compile(r"ready in [0-9.]+ s: (\d+) KV blocks of (\d+) tokens, context (\d+)")
_KV_DTYPE = re.compile(r"(float32|float16|bfloat16) KV cache")


def run_file(gguf: Path, plan: Plan, seed: int, out: Path, result: dict[str, Any]) -> None:
    """Serve ``gguf`` from a fresh cache folder (removed afterwards) and measure it."""
    result["quiet"] = quiet(gguf.name)
    log = out / f"models-{gguf.stem}.log"
    result["log"] = str(log)
    with tempfile.TemporaryDirectory(prefix="paged-llm-cache-") as tmp:
        cache = Path(tmp)
        (cache / "kernels").symlink_to(built_kernels(), target_is_directory=True)
        server = ModelServer(gguf, plan, cache, log)
        result["command"] = " ".join(server.command)
        started = time.monotonic()
        try:
            with server:
                assert server.process is not None
                result["load_s"] = server.load_s
                result["rss_loaded_bytes"] = server.peak_rss
                result["version"] = paged_version(server.url)
                try:
                    asyncio.run(measure(server.url, plan, Prompts(seed), result))
                finally:
                    result["peak_rss_bytes"] = server.peak_rss
        finally:
            result["wall_s"] = time.monotonic() - started
            text = server.log_text()
            if ready := _READY.search(text):
                blocks, size, context = (int(g) for g in ready.groups())
                result["kv"] = {"blocks": blocks, "tokens": blocks * size, "context": context}
            if dtype := _KV_DTYPE.search(text):
                result.setdefault("kv", {})["dtype"] = dtype[1]


def computed(entry: dict[str, Any]) -> dict[str, float | None]:
    """docs/models.md's waits from the measured rates: cold at other counts, a voice answer."""
    r = entry.get("result", {})
    rate, decode, cached = r.get("prompt_tps"), r.get("decode1_tps"), r.get("ttft_cached_s")
    waits: dict[str, float | None] = {}
    for n in ENTITY_COUNTS:
        tokens = assist_tokens(n) + QUESTION_TOKENS
        waits[f"cold_{n}_s"] = tokens / rate if rate else None
    if rate and decode and cached is not None:
        spoken = (TOOL_CALL_TOKENS + CONFIRMATION_TOKENS) / decode + TOOL_RESULT_TOKENS / rate
        waits["voice_cached_s"] = cached + spoken
    else:
        waits["voice_cached_s"] = None
    return waits


def _num(value: float | None, digits: int = 1) -> str:
    """A figure as the tables show it, '-' when missing."""
    return "-" if value is None else f"{value:,.{digits}f}"


def table(entries: list[dict[str, Any]], plan: Plan, what: str = "") -> str:
    """The measured table and the computed one, markdown; ``what`` says what the files are."""
    mib = 2**20
    what = what or f"random weights of each model's shape, {FORMAT}"
    lines = [
        f"| model ({what}) | file MiB | load s | peak RSS MiB "
        f"| KV pool | decode tok/s, 1 request | first token, {plan.assist_tokens:,}+"
        f"{plan.question_tokens} tokens cold (s) | same prompt cached (s) | prompt tok/s |",
        "|---|---:|---:|---:|---|---:|---:|---:|---:|",
    ]
    for e in entries:
        r = e.get("result", {})
        kv = r.get("kv", {})
        pool = (
            f"{plan.kv_budget_mib} MiB {kv.get('dtype', '?')}, {kv['tokens']:,} tokens"
            if "tokens" in kv
            else "-"
        )
        rss = r.get("peak_rss_bytes")
        lines.append(
            f"| {e['name']} | {e['file_bytes'] / mib:,.0f} | {_num(r.get('load_s'))} "
            f"| {_num(rss / mib if rss else None, 0)} | {pool} | {_num(r.get('decode1_tps'))} "
            f"| {_num(r.get('ttft_cold_s'), 2)} | {_num(r.get('ttft_cached_s'), 2)} "
            f"| {_num(r.get('prompt_tps'))} |"
        )
    counts = " | ".join(f"{n} entities" for n in ENTITY_COUNTS)
    lines += [
        "",
        "Computed from the rates above (not timed end to end): the first token with the "
        "prompt not cached, and a voice answer with it cached (first token + "
        f"{TOOL_CALL_TOKENS}-token tool call + {TOOL_RESULT_TOKENS} tokens of its result read "
        f"+ {CONFIRMATION_TOKENS}-token confirmation).",
        "",
        f"| model | uncached: {counts} (s) | voice answer, cached prompt (s) |",
        "|---|" + "---:|" * (len(ENTITY_COUNTS) + 1),
    ]
    for e in entries:
        waits = computed(e)
        cells = " | ".join(_num(waits[f"cold_{n}_s"]) for n in ENTITY_COUNTS)
        lines.append(f"| {e['name']} | {cells} | {_num(waits['voice_cached_s'])} |")
    for e in entries:
        if error := e.get("result", {}).get("error"):
            lines.append(f"\n{e['name']} failed: {error[:500]}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Command line: make the missing files, serve and measure each, print the tables."""
    from paged_llm.catalogue import BANDWIDTH_USE, BY_KEY, measure_bandwidth

    parser = argument_parser("models", __doc__)
    parser.add_argument(
        "--models",
        default=",".join(CATALOGUE_SHAPES),
        help="comma-separated catalogue keys (default: every recommended file)",
    )
    parser.add_argument(
        "--bundled", action="store_true", help="the bundled 135M model's own file only"
    )
    defaults = Plan()
    parser.add_argument("--tokens", type=int, default=defaults.tokens, help="decoded tokens")
    parser.add_argument("--entities", type=int, default=defaults.entities)
    parser.add_argument(
        "--prompt-tokens", type=int, default=0, help="the shared prompt's length (default Assist's)"
    )
    parser.add_argument("--question-tokens", type=int, default=QUESTION_TOKENS)
    parser.add_argument("--kv-budget-mib", type=int, default=KV_BUDGET_MIB)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / "bench_results")
    add_install_option(parser)
    args = parser.parse_args(argv)
    plan = replace(
        defaults,
        tokens=args.tokens,
        entities=args.entities,
        prompt_tokens=args.prompt_tokens,
        question_tokens=args.question_tokens,
        kv_budget_mib=args.kv_budget_mib,
    )
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    use_install(args.install)
    files: list[tuple[str, str, Shape, Path]] = []  # (key, name, shape, file)
    if args.bundled:
        from paged_llm.defaults import BUNDLED_PREFIX, DEFAULT_MODEL, bundled_gguf

        name = DEFAULT_MODEL.removeprefix(BUNDLED_PREFIX)
        files.append(("bundled", name, BUNDLED_SHAPE, bundled_gguf(name)))
    else:
        keys = parse_list(args.models, CATALOGUE_SHAPES, "models")
        made = ensure_models([CATALOGUE_SHAPES[k] for k in keys], [FORMAT], args.seed, clean=True)
        for key in keys:
            shape = SHAPES[CATALOGUE_SHAPES[key]]
            files.append((key, BY_KEY[key].name, shape, made[shape.key, FORMAT]))
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"models-{stamp}.json"
    bandwidth = measure_bandwidth()
    report: dict[str, Any] = {
        "started": stamp,
        "machine": machine(),
        "plan": asdict(plan),
        "probe_bandwidth_bytes_s": bandwidth,
        "install": args.install,
        "files": [],
    }
    for key, name, shape, gguf in files:
        print(f"{name} ({gguf.name}) ...", flush=True)
        catalogue = BY_KEY.get(key)
        entry: dict[str, Any] = {
            "key": key,
            "name": name,
            "shape": asdict(shape),
            "file": str(gguf),
            "file_bytes": gguf.stat().st_size,
            "catalogue_bytes": catalogue.size if catalogue else None,
            # The picker's estimate on this machine, for comparison with the measured rate.
            "estimated_decode_tps": (
                bandwidth * BANDWIDTH_USE / gguf.stat().st_size if bandwidth else None
            ),
            "result": {},
        }
        try:
            run_file(gguf, plan, args.seed, args.out, entry["result"])
        except Exception as err:  # one file's failure must not lose the others' figures
            entry["result"]["error"] = f"{type(err).__name__}: {err}"
        entry["computed"] = computed(entry)
        report["files"].append(entry)
        path.write_text(json.dumps(report, indent=1) + "\n")
        print(f"  {entry['result'].get('wall_s', 0):.0f} s", flush=True)
    what = "its own file, real weights" if args.bundled else ""
    print(table(report["files"], plan, what))
    print(f"\nwrote {path}")


if __name__ == "__main__":
    sys.exit(main())
