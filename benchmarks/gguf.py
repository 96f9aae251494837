"""paged-llm beside llama.cpp's llama-server on the same GGUF files, 2 threads each.

For every (shape, format) file from ``benchmarks.gguf_models`` (random weights of real shapes:
speed and memory depend on shapes and formats, not on weights) both servers run one after
the other, each a fresh process, and each is measured the same way:

- load: process start to ``/health`` 200, and the bytes it wrote to disk meanwhile
  (paged-llm's cache folder, a fresh temporary one per run, so the model's first load;
  its C kernels built once beforehand, as llama-server is; llama.cpp writes none);
- decode tokens/s of one request, and of 32 requests at once (as
  ``benchmarks.llama_cpp.decode_rate`` counts: the tokens after each first token, from the
  moment the last request had its first token), greedy and ignoring EOS;
- time to first token after a 60-token and after a 1,500-token prompt, every prompt
  fresh (its first token differs from every other, so no cached prefix helps);
- peak resident memory (VmHWM) of the server process, both with the same KV cache:
  ``KV_TOKENS`` tokens of context (llama.cpp's ``-c``, one cache shared by 32 slots) and
  the bytes of that many tokens for paged-llm's ``--kv-budget`` with the same context
  length (``--max-model-len``), float16 K and V on both where paged-llm has
  ``--kv-cache-dtype``, as llama.cpp's default;
- both tools' versions, and what paged-llm says about its weights.

With ``--rounds N`` the two servers take turns N times on each file and each system's
figure is its best of the N (highest tokens/s, lowest time and memory): on a shared
virtual machine, whose speed moves by a third from minute to minute, a slow spell then
lowers one round's figure, not the ratio; each round's ratios are printed too.

Prints a markdown table per file with ours / llama.cpp ratios, writes
``bench_results/gguf-<timestamp>.json`` and the plots ``docs/img/gguf_decode.png`` and
``docs/img/gguf_ttft.png``. Usage:
``scripts/bench gguf [--shapes 360m,1.7b,qwen1.5b] [--formats Q4_0,Q4_K_M,Q8_0] [--quick]
[--rounds N]``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import functools
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Coroutine
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from . import ROOT, argument_parser
from .gguf_models import (
    BUNDLED_SHAPE,
    DEFAULT_SHAPES,
    FORMATS,
    SHAPES,
    Shape,
    ensure_models,
    parse_list,
    shape_of,
)
from .install import CHECKOUT, INSTALLS, program
from .llama_cpp import LlamaServer, build_server, skip_reason, stream_completion
from .process import ServerProcess, free_port

# The paged-llm program the runs start (install.py): the checkout's venv until use_install.
_USING: dict[str, Any] = {"install": "checkout", "program": CHECKOUT}
# The engine's C kernels, built once per bench run and shared by every fresh cache folder:
# llama-server is built ahead of time too, and the engine compiles them once per machine,
# not per model (about 6 s on 2 cores), so a model's first load is timed without it.
KERNELS = ROOT / ".cache" / "bench-kernels"
_BUILD_KERNELS = """
import importlib.util
import sys
from pathlib import Path
from paged_llm.kernels.cpu import attention as cpu_attention, forward as cpu_forward
from paged_llm.kernels.cpu import gguf_matmul as gguf_kernels
every = [gguf_kernels, cpu_forward, cpu_attention]
if importlib.util.find_spec("torch") is not None:  # the torch path's own (a user install has none)
    from paged_llm.kernels.cpu import quant as cpu_quant
    every.append(cpu_quant)
for kernels in every:
    reason = kernels.unavailable(Path(sys.argv[1]))
    if reason is not None:
        print(reason, file=sys.stderr)
"""
THREADS = 2
KV_TOKENS = 8192  # one context of 8k tokens, shared by 32 slots: 32 x (16 + 128) fits
LLAMA_KV_BYTES = 2  # llama.cpp's default K and V cache type is f16
SYSTEMS = ("llama.cpp", "paged-llm")
# (key, label, higher is better): the table's rows and the ratios' sense.
METRICS: tuple[tuple[str, str, bool], ...] = (
    ("decode1_tps", "decode tok/s, 1 request", True),
    ("decode32_tps", "decode tok/s, 32 at once", True),
    ("ttft60_s", "TTFT, 60-token prompt (s)", False),
    ("ttft1500_s", "TTFT, 1,500-token prompt (s)", False),
    ("peak_rss_bytes", "peak RSS (MiB)", False),
    ("load_s", "load, start to /health 200 (s)", False),
    ("disk_bytes", "bytes written during load (MiB)", False),
)
SHORT_PROMPT = 16  # tokens of the decode requests' prompts


@dataclass(frozen=True, slots=True)
class Plan:
    """How much work each measurement does."""

    tokens: int = 128
    batch: int = 32
    ttft_lengths: tuple[int, ...] = (60, 1500)
    ttft_repeats: int = 3
    kv_tokens: int = KV_TOKENS
    threads: int = THREADS


QUICK = Plan(tokens=32, ttft_repeats=1)


class Prompts:
    """Seeded random prompts, each starting with a token no other prompt starts with.

    A new first token defeats both servers' prefix caches; the same seed gives both
    systems the same prompts in the same order.
    """

    def __init__(self, seed: int = 0) -> None:
        """Start the sequence; ids stay inside SmolLM2's 49,152 real tokens."""
        self.rng = random.Random(seed)
        self.count = 0

    def fresh(self, length: int) -> list[int]:
        """A prompt of ``length`` tokens whose first token is new."""
        first = 1000 + self.count  # past the special tokens, never repeated in a run
        self.count += 1
        return [first, *(self.rng.randrange(1000, 49000) for _ in range(length - 1))]


def written_bytes(pid: int) -> int:
    """Bytes a process has caused to be written to storage (/proc/PID/io), 0 if unknown."""
    try:
        with open(f"/proc/{pid}/io") as io:
            for line in io:
                if line.startswith("write_bytes:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def folder_bytes(folder: Path) -> int:
    """Total size of the files under ``folder``."""
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def use_install(install: str) -> None:
    """Start paged-llm as ``install`` (install.INSTALLS) gives it from now on."""
    _USING.update(install=install, program=program(install))
    built_kernels.cache_clear()


def paged_llm() -> Path:
    """The ``paged-llm`` program the runs start."""
    return Path(_USING["program"])


def serve_flags() -> str:
    """``paged-llm serve --help``: which flags this checkout's server has (no torch import)."""
    return subprocess.run(
        [str(paged_llm()), "serve", "--help"], capture_output=True, text=True, check=True
    ).stdout


class PagedServer(ServerProcess):
    """``paged-llm serve`` on one GGUF file: 2 threads, a fresh cache folder, INFO log."""

    def __init__(self, gguf: Path, shape: Shape, plan: Plan, cache_dir: Path, log: Path) -> None:
        """Work out the command: the same context and KV tokens as llama.cpp gets."""
        flags = serve_flags()
        # float16 K and V as llama.cpp holds them, where this checkout can; else the
        # engine's float32 pool, which then takes twice the bytes for the same tokens.
        self.kv_dtype = "float16" if "--kv-cache-dtype" in flags else "float32"
        self.kv_bytes = plan.kv_tokens * shape.kv_bytes_per_token(
            2 if self.kv_dtype == "float16" else 4
        )
        port = free_port()
        command = [
            str(paged_llm()), "serve", str(gguf), "--device", "cpu", "--weights", "auto",
            "--kv-budget", str(self.kv_bytes), "--max-model-len", str(plan.kv_tokens),
            "--max-num-seqs", str(plan.batch), "--cache-dir", str(cache_dir),
            "--host", "127.0.0.1", "--port", str(port), "--log-level", "INFO",
        ]  # fmt: skip
        if "--kv-cache-dtype" in flags:
            command += ["--kv-cache-dtype", self.kv_dtype]
        if "--threads" in flags:
            command += ["--threads", str(plan.threads)]
        threads = str(plan.threads)
        # torch reads these at start; the machine has 2 cores, llama.cpp gets -t 2 -tb 2.
        env = {
            **os.environ,
            "OMP_NUM_THREADS": threads,
            "MKL_NUM_THREADS": threads,
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
        }
        # A checkout that converts GGUF files at first load takes minutes: allow 30.
        super().__init__(
            "paged-llm serve", command, port, env=env, log_path=log, timeout=1800, stop_seconds=60
        )
        self.cache_dir = cache_dir


async def paged_completion(
    session: Any, url: str, prompt_ids: list[int], max_tokens: int
) -> tuple[float, float, int]:
    """One greedy completion streamed from /v1/completions: (TTFT s, end-to-end s, tokens).

    The first token's time is when the response headers arrive: the server opens its
    stream only once the engine gave the request's first token, and a random model's
    first tokens may decode to no text, which the server does not send.
    """
    body = {
        "prompt": prompt_ids,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    started = time.monotonic()
    tokens = 0
    async with session.post(f"{url}/v1/completions", json=body) as reply:
        reply.raise_for_status()
        first = time.monotonic()
        async for raw in reply.content:
            data = raw.decode().removeprefix("data: ").strip()
            if not data or data == "[DONE]":
                continue
            chunk = json.loads(data)
            if chunk.get("usage"):
                tokens = int(chunk["usage"]["completion_tokens"])
    end = time.monotonic()
    return first - started, end - started, tokens


Complete = Callable[[Any, str, list[int], int], Coroutine[Any, Any, tuple[float, float, int]]]


def http_session() -> Any:
    """A benchmark's aiohttp session (opened in a coroutine): no time limit, a connection each.

    A connection per request: llama-server (cpp-httplib) drops idle keep-alive connections
    after a few seconds, and a reused dead one fails the next request.
    """
    import aiohttp

    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None))


async def measure(
    url: str, complete: Complete, plan: Plan, prompts: Prompts, out: dict[str, Any]
) -> None:
    """Warm-up, TTFT at each prompt length, decode of 1 and of ``plan.batch`` requests.

    Figures go into ``out`` as they come, so a failure late keeps the earlier ones.
    """
    async with http_session() as session:
        started = time.monotonic()
        await complete(session, url, prompts.fresh(SHORT_PROMPT), 8)
        out["warmup_s"] = time.monotonic() - started
        for length in plan.ttft_lengths:
            times = [
                (await complete(session, url, prompts.fresh(length), 2))[0]
                for _ in range(plan.ttft_repeats)
            ]
            out[f"ttft{length}_s"] = statistics.median(times)
            out[f"ttft{length}_all_s"] = times
        ttft, e2e, n = await complete(session, url, prompts.fresh(SHORT_PROMPT), plan.tokens)
        out["decode1_tps"] = (n - 1) / (e2e - ttft)
        out["decode1_tokens"] = n
        done = await asyncio.gather(
            *(
                complete(session, url, prompts.fresh(SHORT_PROMPT), plan.tokens)
                for _ in range(plan.batch)
            )
        )
        decoding = max(e for _, e, _ in done) - max(t for t, _, _ in done)
        out["decode32_tps"] = sum(n - 1 for _, _, n in done) / decoding
        out["decode32_tokens"] = sum(n for _, _, n in done)


def quiet(label: str) -> dict[str, Any]:
    """The machine's quiet check, with a warning line when others use the CPU."""
    from .machine import quiet_check

    check = quiet_check()
    if not check["quiet"]:
        print(
            f"WARNING: the machine is busy before the {label} run "
            f"({check['other_cpu_share']:.0%} CPU used by others, load {check['loadavg_1min']})"
        )
    return check


def llama_version(binary: Path) -> str:
    """``llama-server --version``'s line naming the build."""
    run = subprocess.run([str(binary), "--version"], capture_output=True, text=True, check=False)
    lines = [ln for ln in (run.stdout + run.stderr).splitlines() if "version" in ln]
    return lines[0].strip() if lines else "unknown"


def paged_version(url: str) -> str:
    """The server's ``/version`` and the checkout's commit (the code is what is measured)."""
    with urllib.request.urlopen(f"{url}/version", timeout=5) as reply:
        version = json.loads(reply.read())["version"]
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "describe", "--always", "--dirty"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return f"{version} ({commit or 'no git'})"


_WEIGHTS_LINE = re.compile(r"weight|linear|convert|ready in|kv blocks|dtype|attention", re.I)


def run_llama(
    binary: Path, gguf: Path, shape: Shape, plan: Plan, seed: int, result: dict[str, Any]
) -> None:
    """llama-server on ``gguf``: 32 slots sharing one ``kv_tokens`` cache, 2 threads."""
    result["quiet"] = quiet("llama.cpp")
    result["version"] = llama_version(binary)
    result["weights"] = f"{gguf} (memory-mapped as stored)"
    result["kv"] = {
        "tokens": plan.kv_tokens,
        "dtype": "f16",
        "bytes": plan.kv_tokens * shape.kv_bytes_per_token(LLAMA_KV_BYTES),
    }
    with LlamaServer(binary, gguf, plan.kv_tokens, plan.batch, plan.threads) as server:
        assert server.process is not None
        result["disk_bytes"] = 0  # it maps the file and writes nothing
        result["written_bytes_proc"] = written_bytes(server.process.pid)
        result["load_s"] = server.load_s
        result["command"] = " ".join(server.command)
        try:
            asyncio.run(measure(server.url, stream_completion, plan, Prompts(seed), result))
        finally:
            result["peak_rss_bytes"] = server.peak_rss


@functools.cache
def built_kernels() -> Path:
    """The engine's kernels built (once a run) into KERNELS, and its bytecode compiled."""
    KERNELS.mkdir(parents=True, exist_ok=True)
    python = paged_llm().parent / "python"
    subprocess.run([str(python), "-c", _BUILD_KERNELS, str(KERNELS)], check=True)
    if _USING["install"] != "checkout":
        return KERNELS  # installed with its bytecode
    # An installed wheel comes with bytecode (pip compiles it); an editable checkout where
    # Python may not write it (PYTHONDONTWRITEBYTECODE) would compile every module at each
    # start, ~0.1 s of a first load that llama-server does not pay.
    folders = [str(ROOT / name) for name in ("package", "engine", "kernels", "protocol", "server")]
    subprocess.run([str(python), "-m", "compileall", "-q", *folders], check=True)
    return KERNELS


def run_paged(
    gguf: Path, shape: Shape, plan: Plan, seed: int, out: Path, result: dict[str, Any]
) -> None:
    """``paged-llm serve`` on ``gguf`` with a fresh cache folder, removed afterwards."""
    result["quiet"] = quiet("paged-llm")
    log = out / f"paged-llm-{gguf.stem}.log"
    result["log"] = str(log)
    with tempfile.TemporaryDirectory(prefix="paged-llm-cache-") as tmp:
        cache = Path(tmp)
        (cache / "kernels").symlink_to(built_kernels(), target_is_directory=True)
        server = PagedServer(gguf, shape, plan, cache, log)
        result["kv"] = {"tokens": None, "dtype": server.kv_dtype, "bytes": server.kv_bytes}
        result["command"] = " ".join(server.command)
        try:
            with server:
                assert server.process is not None
                result["load_s"] = server.load_s
                result["disk_bytes"] = folder_bytes(cache)
                result["written_bytes_proc"] = written_bytes(server.process.pid)
                result["cache_dir_contents"] = {
                    str(p.relative_to(cache)): p.stat().st_size
                    for p in sorted(cache.rglob("*"))
                    if p.is_file() and p.stat().st_size > 2**20
                }
                result["version"] = paged_version(server.url)
                try:
                    measure_run = measure(server.url, paged_completion, plan, Prompts(seed), result)
                    asyncio.run(measure_run)
                finally:
                    result["peak_rss_bytes"] = server.peak_rss
        finally:
            text = server.log_text()
            result["weights"] = [
                ln.strip()[:300] for ln in text.splitlines() if _WEIGHTS_LINE.search(ln)
            ][:12]
            if blocks := re.search(r"(\d+) KV blocks of (\d+) tokens", text):
                result["kv"]["tokens"] = int(blocks[1]) * int(blocks[2])


def best_of(results: list[dict[str, Any]]) -> dict[str, Any]:
    """One system's rounds as one result: each metric at its best, the rest from a good round.

    A round that failed counts only when every round failed; the rounds themselves stay
    under ``rounds``.
    """
    if len(results) == 1:
        return results[0]
    good = [r for r in results if "error" not in r] or results[:1]
    best = dict(good[0])
    for key, _, higher in METRICS:
        values = [r[key] for r in good if r.get(key) is not None]
        if values:
            best[key] = max(values) if higher else min(values)
    best["rounds"] = results
    return best


def ratio(ours: float | None, theirs: float | None) -> float | None:
    """Our figure over llama.cpp's, or None where either is missing or llama.cpp's is zero."""
    if ours is None or theirs is None or theirs == 0:
        return None
    return ours / theirs


def ratios(entry: dict[str, Any]) -> dict[str, float | None]:
    """Every metric's ours / llama.cpp for one file's entry (either side may have failed)."""
    ours = entry["systems"].get("paged-llm", {})
    theirs = entry["systems"].get("llama.cpp", {})
    return {key: ratio(ours.get(key), theirs.get(key)) for key, _, _ in METRICS}


def _shown(key: str, value: float | None) -> str:
    """A metric's value as the table shows it."""
    if value is None:
        return "-"
    if key.endswith("_bytes"):
        return f"{value / 2**20:,.0f}"
    if key.endswith("_tps"):
        return f"{value:.1f}"
    return f"{value:.2f}"


def table(entry: dict[str, Any]) -> str:
    """One file's markdown table: both systems, the ratio and which way is better."""
    systems = entry["systems"]
    title = f"### {entry['shape_name']} {entry['format']} ({entry['file_bytes'] / 2**20:,.0f} MiB)"
    lines = [
        title,
        "",
        "| metric | llama.cpp | paged-llm | ours / llama.cpp | better |",
        "| --- | --- | --- | --- | --- |",
    ]
    shares = ratios(entry)
    for key, label, higher in METRICS:
        r = shares[key]
        lines.append(
            f"| {label} | {_shown(key, systems.get('llama.cpp', {}).get(key))} "
            f"| {_shown(key, systems.get('paged-llm', {}).get(key))} "
            f"| {'-' if r is None else f'{r:.2f}'} | {'higher' if higher else 'lower'} |"
        )
    for name in SYSTEMS:
        if error := systems.get(name, {}).get("error"):
            lines.append(f"\n{name} failed: {error[:500]}")
    rounds = [systems.get(name, {}).get("rounds") or [] for name in SYSTEMS]
    if len(rounds[0]) > 1 and len(rounds[0]) == len(rounds[1]):
        lines.append(
            f"\nbest of {len(rounds[0])} rounds, the servers taking turns; each round's ratios:"
        )
        for key, label, _ in METRICS:
            each = [ratio(p.get(key), t.get(key)) for t, p in zip(*rounds, strict=True)]
            shown = ", ".join("-" if r is None else f"{r:.2f}" for r in each)
            lines.append(f"- {label}: {shown}")
    kv = {name: systems.get(name, {}).get("kv") for name in SYSTEMS}
    lines.append(
        f"\nKV cache on both: {entry['kv_tokens']} tokens of context, 32 sequences "
        + "; ".join(
            f"{name} {v['dtype']} {v['bytes'] / 2**20:,.0f} MiB" for name, v in kv.items() if v
        )
    )
    return "\n".join(lines)


def plot(entries: list[dict[str, Any]], img: Path) -> list[Path]:
    """Bar charts: decode tok/s (1 and 32 at once) and TTFT (60 and 1,500 tokens) per file."""
    from .report import pyplot  # here: the report's module imports torch, as this one need not

    plt = pyplot()
    img.mkdir(parents=True, exist_ok=True)
    labels = [f"{e['shape_name']}\n{e['format']}" for e in entries]
    written = []
    for name, keys, ylabel, log in (
        ("gguf_decode.png", ("decode1_tps", "decode32_tps"), "decode tokens/s", False),
        ("gguf_ttft.png", ("ttft60_s", "ttft1500_s"), "time to first token (s)", True),
    ):
        fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(entries) + 2), 4.2))
        width = 0.2
        bars = [(system, key) for key in keys for system in SYSTEMS]
        for i, (system, key) in enumerate(bars):
            values = [e["systems"].get(system, {}).get(key) or 0.0 for e in entries]
            xs = [x + (i - (len(bars) - 1) / 2) * width for x in range(len(entries))]
            what = next(label for k, label, _ in METRICS if k == key)
            ax.bar(xs, values, width, label=f"{system}: {what}")
        ax.set_xticks(range(len(entries)), labels)
        ax.set_ylabel(ylabel)
        if log and any(p.get_height() > 0 for p in ax.patches):
            ax.set_yscale("log")
        ax.set_title(f"{ylabel}, {THREADS} threads, same GGUF file")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(img / name, dpi=110)
        plt.close(fig)
        written.append(img / name)
    return written


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    import platform

    from .machine import cpu_name

    return {
        "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "kernel": platform.release(),
    }


def add_install_option(parser: argparse.ArgumentParser) -> None:
    """``--install``: the checkout's venv (the default, as every published figure), or a user's.

    On 2026-12-07 (bundled file, quiet, 2 rounds each) the user install started slower (0.79
    against 0.64 s) and decoded one request slower (96 against 108 tok/s) than the checkout's
    venv, with numpy 2.5.5 against 2.3.2 the plain difference; not yet explained.
    """
    parser.add_argument(
        "--install",
        choices=INSTALLS,
        default="checkout",
        help="checkout: the checkout's own .venv; user: the checkout's wheel with the cpu "
        "extra in a venv of its own (as pip install 'paged-llm[cpu]' gives it)",
    )


def main(argv: list[str] | None = None) -> None:
    """Command line: make the files that are missing, run both systems on each, report."""
    parser = argument_parser("gguf", __doc__)
    parser.add_argument(
        "--shapes", default=None, help=f"comma-separated, default {','.join(DEFAULT_SHAPES)}"
    )
    parser.add_argument("--formats", default=None, help="comma-separated, default all")
    parser.add_argument("--quick", action="store_true", help="32 tokens, 360m Q4_0 only")
    parser.add_argument(
        "--bundled", action="store_true", help="the bundled 135M model's own file only"
    )
    parser.add_argument("--tokens", type=int, help="decode tokens per request (default 128)")
    parser.add_argument("--repeats", type=int, help="first-token repeats per length (default 3)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--rounds", type=int, default=1, help="turns each server takes per file (best kept)"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench_results")
    parser.add_argument("--img", type=Path, default=ROOT / "docs" / "img")
    add_install_option(parser)
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else Plan()
    if args.tokens is not None:
        plan = dataclasses.replace(plan, tokens=args.tokens)
    if args.repeats is not None:
        plan = dataclasses.replace(plan, ttft_repeats=args.repeats)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    default_shapes, default_formats = ("360m", "Q4_0") if args.quick else (None, None)
    shapes = parse_list(args.shapes or default_shapes or ",".join(DEFAULT_SHAPES), SHAPES, "shapes")
    formats = parse_list(args.formats or default_formats or ",".join(FORMATS), FORMATS, "formats")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    binary = build_server()
    if binary is None:
        raise SystemExit(skip_reason())
    use_install(args.install)
    if args.bundled:
        from paged_llm.defaults import BUNDLED_PREFIX, DEFAULT_MODEL, bundled_gguf

        bundled = bundled_gguf(DEFAULT_MODEL.removeprefix(BUNDLED_PREFIX))
        files = {(BUNDLED_SHAPE.key, "Q4_1"): bundled}
    else:
        files = ensure_models(shapes, formats, args.seed)
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    args.out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "started": stamp,
        "machine": machine(),
        "plan": asdict(plan),
        "quick": args.quick,
        "rounds": args.rounds,
        "install": args.install,
        "files": [],
    }
    path = args.out / f"gguf-{stamp}.json"
    for (key, fmt), gguf in files.items():
        shape = BUNDLED_SHAPE if args.bundled else shape_of(gguf)[0]
        entry: dict[str, Any] = {
            "shape": key,
            "shape_name": shape.name,
            "format": fmt,
            "file": str(gguf),
            "file_bytes": gguf.stat().st_size,
            "kv_tokens": plan.kv_tokens,
            "systems": {},
        }
        results: dict[str, list[dict[str, Any]]] = {name: [] for name in SYSTEMS}
        for turn in range(args.rounds):
            for name in SYSTEMS:
                of = f" (round {turn + 1} of {args.rounds})" if args.rounds > 1 else ""
                print(f"{shape.name} {fmt}: {name}{of} ...", flush=True)
                result: dict[str, Any] = {}
                results[name].append(result)
                try:
                    if name == "llama.cpp":
                        run_llama(binary, gguf, shape, plan, args.seed, result)
                    else:
                        run_paged(gguf, shape, plan, args.seed, args.out, result)
                except Exception as err:  # one failure must not lose the other figures
                    result["error"] = f"{type(err).__name__}: {err}"
        entry["systems"] = {name: best_of(results[name]) for name in SYSTEMS}
        entry["ratios"] = ratios(entry)
        report["files"].append(entry)
        path.write_text(json.dumps(report, indent=1) + "\n")  # after each file: partial runs
        print(table(entry), "\n", flush=True)
    images = plot(report["files"], args.img)
    print(f"wrote {path} and {', '.join(str(p) for p in images)}")


if __name__ == "__main__":
    sys.exit(main())
