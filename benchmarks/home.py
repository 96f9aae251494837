"""The home-workload benchmark: this engine against transformers and contiguous reservation.

Run through ``scripts/bench [--quick|--full]`` (``python -m benchmarks [home] ...``). Writes
results.json, report.md and PNG plots to bench_results/<mode>/ and prints the report. The
parts: ``benchmarks.workload`` (the requests), ``benchmarks.runners`` (the systems),
``benchmarks.experiments`` (focused experiments), ``benchmarks.machine`` (the machine's
figures), ``benchmarks.llama_cpp`` (the llama.cpp peer), ``benchmarks.server`` (the HTTP
comparison) and ``benchmarks.report`` (tables and plots).
"""

from __future__ import annotations

import functools
import gc
import json
import os
import platform
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch

from paged_llm.engine.config import (
    DEFAULT_MODEL,
    INTERACTIVE_HOLD_SECONDS,
    INTERACTIVE_SLOWDOWN,
    WEIGHT_CHOICES,
    EngineConfig,
    KVLayout,
)
from paged_llm.engine.model.loader import load_model
from paged_llm.engine.model.runner import kv_bytes_per_block, resolve_kv_dtype

from . import ROOT, argument_parser
from .experiments import (
    batch32_experiment,
    capacity_experiment,
    idle_voice_experiment,
    overhead_experiment,
    prefix_experiment,
    summary_experiment,
)
from .llama_cpp import build_server, decode_rate, run_workload, skip_reason
from .machine import cpu_name, in_own_thread, machine_limits, quiet_check
from .report import report, runs_from_json, write_plots
from .runners import (
    CLASSES,
    VOICE_CONTEXT,
    RequestResult,
    SystemRun,
    engine_config,
    run_engine,
    run_hf_continuous,
    run_sequential,
)
from .server import server_experiment, server_report
from .workload import MODES, build_workload


def run_llama_cpp(workload: list[Any], rounds: int) -> dict[str, Any]:
    """Run llama.cpp's llama-server on the same GGUF file: the home mix, then 1 and 32 at once.

    The decode rates are each the best of ``rounds``, as the engine's own are.

    Built from the llama-cpp-python sdist on first use (benchmarks/llama_cpp.py); skipped with
    a line saying why when cmake or a C++ compiler is missing or the build fails.
    """
    from paged_llm.defaults import BUNDLED_PREFIX, bundled_gguf

    try:
        binary = build_server()
    except Exception as err:  # a peer that cannot be built here is reported, not fatal
        print(f"bench: llama.cpp skipped: the build failed: {err!r}", flush=True)
        return {"skipped": f"build failed: {err!r}"}
    if binary is None:
        reason = skip_reason() or "llama.cpp skipped: llama-server was not built"
        print(f"bench: {reason}", flush=True)
        return {"skipped": reason}
    gguf = bundled_gguf(DEFAULT_MODEL.removeprefix(BUNDLED_PREFIX))
    mix = run_workload(binary, gguf, workload)
    slot = mix["kv_tokens"] // mix["slots"]
    name = f"llama.cpp llama-server (-t 2, same GGUF, {mix['slots']} slots of {slot} tokens)"
    run = SystemRun(name, [], mix["makespan"])
    run.results = [RequestResult(**row) for row in mix["results"]]
    run.peak_rss = mix["peak_rss"]
    prompt = list(range(1000, 1064))  # the overhead experiment's 64-token prompt shape
    voice = list(range(1000, 1000 + VOICE_CONTEXT))  # a Home Assistant voice prompt's length
    one = max(decode_rate(binary, gguf, prompt, 1, 64) for _ in range(rounds))
    many = max(decode_rate(binary, gguf, prompt, 32, 64) for _ in range(rounds))
    long = max(decode_rate(binary, gguf, voice, 1, 64) for _ in range(rounds))
    print(
        f"bench: llama.cpp decode tokens/s: 1 request {one:.1f}, 32 at once {many:.1f}, "
        f"1 request after {VOICE_CONTEXT} prompt tokens {long:.1f}"
    )
    return {
        "run": run,
        "one_request_tokens_per_s": one,
        "batch32_tokens_per_s": many,
        "one_request_voice_context_tokens_per_s": long,
    }


def main(argv: list[str] | None = None) -> None:
    """Parse arguments, run every system and experiment, write the results."""
    parser = argument_parser("home", __doc__)
    parser.add_argument("--full", action="store_true", help="the long run (default: --quick)")
    parser.add_argument("--quick", action="store_true", help="about 7 minutes on 2 cores")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument(
        "--weights",
        default="auto",
        choices=WEIGHT_CHOICES,
        help="how the linear layers hold their weights (every system that loads the model)",
    )
    parser.add_argument(
        "--kv-blocks",
        type=int,
        default=273,
        help="KV pool in blocks of 16 tokens, the same on every dtype (273: 96 MiB in bfloat16)",
    )
    parser.add_argument("--token-budget", type=int, default=256)
    parser.add_argument(
        "--policy", default="latency", choices=["latency", "fixed"], help="the main run's policy"
    )
    parser.add_argument(
        "--step-seconds", type=float, default=0.1, help="the latency policy's step budget"
    )
    parser.add_argument(
        "--hold-seconds",
        type=float,
        default=INTERACTIVE_HOLD_SECONDS,
        help="how long the latency policy's budget holds after the last interactive request",
    )
    parser.add_argument(
        "--slowdown",
        type=float,
        default=INTERACTIVE_SLOWDOWN,
        help="interactive_slowdown: how much other work may slow a decoding voice answer",
    )
    parser.add_argument(
        "--summary-words", type=int, default=0, help="summary experiment document (0: 1.5x pool)"
    )
    parser.add_argument("--max-model-len", type=int, default=3584)
    parser.add_argument(
        "--decode-rounds",
        type=int,
        default=3,
        help="the decode rates (1, 8, 32 at once; llama.cpp's too) are the best of this many",
    )
    parser.add_argument(
        "--skip",
        default="",
        help="comma-separated: sequential,hf-cb,contiguous,batch32,fixed,saturated,summary,"
        "overhead,llama.cpp",
    )
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--server",
        action="store_true",
        help="only compare paged-llm serve over HTTP with the in-process engine",
    )
    parser.add_argument(
        "--report-only", action="store_true", help="rewrite report.md from results.json"
    )
    args = parser.parse_args(argv)
    mode = "full" if args.full else "quick"
    out = args.out or ROOT / "bench_results" / mode
    out.mkdir(parents=True, exist_ok=True)
    skip = set(filter(None, args.skip.split(",")))
    if args.report_only:
        saved = json.loads((out / "results.json").read_text())
        text = report(saved, runs_from_json(saved))
        (out / "report.md").write_text(text)
        print(text)
        return

    quiet = quiet_check()
    print(
        "bench: machine "
        + ("quiet" if quiet["quiet"] else "BUSY: other processes want the CPU; figures skewed")
        + f" {quiet}",
        flush=True,
    )
    # transformers' model class, whose generate is a baseline (the engine runs it as it
    # runs its own NativeModel: the same C forward).
    loaded = in_own_thread(
        functools.partial(load_model, native_model=False),
        EngineConfig(
            model=DEFAULT_MODEL,
            device="cpu",
            dtype=args.dtype,
            weights=args.weights,
            cache_dir=ROOT / ".cache" / "converted",
        ),
    )
    args.dtype = str(loaded.dtype).removeprefix("torch.")
    args.weights = loaded.weights
    # As `paged-llm serve` does after its load (server/serve.py): a full collection over
    # what the imports and the model left took 310 ms here, landing on any step.
    gc.collect()
    gc.freeze()
    # A budget in blocks holds the same tokens whatever dtype ``auto`` picked on this CPU.
    kv_dtype = resolve_kv_dtype("auto", loaded.device, loaded.dtype, loaded.weights)
    args.kv_bytes = args.kv_blocks * kv_bytes_per_block(loaded.model.config, 16, kv_dtype)
    workload = build_workload(loaded.tokenizer, mode, args.seed)
    counts = {c: sum(r.priority == c for r in workload) for c in CLASSES}
    lengths = [len(r.prompt_ids) for r in workload]
    described = (
        f"{mode}, seed {args.seed}, {MODES[mode]['duration']:.0f} s of Poisson arrivals: "
        + ", ".join(f"{n} {c}" for c, n in counts.items())
        + f"; prompts {min(lengths)}–{max(lengths)} tokens"
    )
    print(f"bench: {described}", flush=True)
    if args.server:
        result = in_own_thread(server_experiment, loaded, workload, args, out)
        result.update(workload=described, dtype=args.dtype, quiet_after=quiet_check())
        (out / "server.json").write_text(json.dumps(result, indent=1, default=str))
        print(server_report(result))
        return
    runs: list[SystemRun] = []

    def timed(label: str, fn: Any, *a: Any) -> Any:
        began = time.monotonic()
        print(f"bench: {label} ...", flush=True)
        result = in_own_thread(fn, *a)
        print(f"bench: {label} done in {time.monotonic() - began:.0f} s", flush=True)
        return result

    runs.append(
        timed(
            "paged engine",
            run_engine,
            loaded,
            engine_config(args, KVLayout.PAGED),
            workload,
            "paged engine (this project)",
        )
    )
    if "fixed" not in skip:
        other = "fixed" if args.policy == "latency" else "latency"
        runs.append(
            timed(
                f"paged engine, {other} policy",
                run_engine,
                loaded,
                engine_config(args, KVLayout.PAGED, policy=other),
                workload,
                f"paged engine, {other} policy",
            )
        )
    if "saturated" not in skip:
        # Every request queued at once: what the engine does when arrivals do not limit it.
        saturated = [replace(r, arrival=0.0) for r in workload]
        runs.append(
            timed(
                "paged engine, saturated",
                run_engine,
                loaded,
                engine_config(args, KVLayout.PAGED),
                saturated,
                "paged engine, saturated mix",
            )
        )
    if "contiguous" not in skip:
        runs.append(
            timed(
                "contiguous engine",
                run_engine,
                loaded,
                engine_config(args, KVLayout.CONTIGUOUS),
                workload,
                "same engine, contiguous reservation",
            )
        )
    # transformers' continuous batching takes two minutes on 2 cores: the full run only.
    if "hf-cb" not in skip and mode == "full":
        try:
            runs.append(
                timed("transformers continuous batching", run_hf_continuous, loaded, workload)
            )
        except Exception as err:  # a baseline that cannot run here is reported, not fatal
            print(f"bench: transformers continuous batching failed: {err!r}", flush=True)
    llama: dict[str, Any] = {}
    if "llama.cpp" not in skip:
        llama = timed("llama.cpp", run_llama_cpp, workload, args.decode_rounds)
        if "run" in llama:
            runs.append(llama.pop("run"))
    if "sequential" not in skip:
        runs.append(timed("sequential generate", run_sequential, loaded, workload))

    data: dict[str, Any] = {
        "mode": mode,
        "quiet": quiet,
        "torch": torch.__version__,
        "model": DEFAULT_MODEL,
        "dtype": args.dtype,
        "weights": args.weights,
        "attention": loaded.attention,
        "kv_blocks": args.kv_blocks,
        "policy": args.policy,
        "step_seconds": args.step_seconds,
        "slowdown": args.slowdown,
        "hold_seconds": args.hold_seconds,
        "gc": "frozen after the load, as in paged-llm serve",
        "kv_mib": args.kv_bytes / 2**20,
        "workload": described,
        "machine": f"{cpu_name()}, {os.cpu_count()} cores ({platform.machine()})",
    }
    # The capacity experiment needs more requests than fit at once: the full mix's 90-odd.
    crowd = workload if mode == "full" else build_workload(loaded.tokenizer, "full", args.seed)
    data["capacity"] = timed("capacity experiment", capacity_experiment, loaded, crowd, args)
    data["prefix"] = timed("prefix experiment", prefix_experiment, loaded, workload, args)
    data["idle_voice"] = timed("idle voice", idle_voice_experiment, loaded, workload, args)
    if "summary" not in skip:
        words = args.summary_words or int(1.5 * args.kv_blocks * 16)
        data["summary"] = timed(
            "summary experiment", summary_experiment, loaded, workload, args, words
        )
    data["overhead"] = (
        []
        if "overhead" in skip
        else timed(
            "overhead experiment",
            overhead_experiment,
            loaded,
            args,
            [1, 8, 32] if mode == "quick" else [1, 8, 32, 128],
        )
    )
    if "overhead" not in skip:
        data["overhead_voice_context"] = timed(
            "overhead experiment, one request after a voice prompt",
            overhead_experiment,
            loaded,
            args,
            [1],
            VOICE_CONTEXT,
        )
    data["limits"] = in_own_thread(machine_limits, loaded)
    if llama:
        data["llama_cpp"] = llama
    # generate_batch alone takes minutes on 2 cores: the quick run leaves it out.
    if "batch32" not in skip and mode == "full":
        data["batch32"] = timed(
            "32 requests vs generate_batch", batch32_experiment, loaded, workload, args
        )
    if mode == "full":
        bursty = build_workload(loaded.tokenizer, mode, args.seed, bursty=True)
        brun = timed(
            "bursty paged engine",
            run_engine,
            loaded,
            engine_config(args, KVLayout.PAGED),
            bursty,
            "paged engine, bursty",
        )
        data["bursty"] = {brun.name: brun.per_class()}
    data["systems"] = [
        {
            "name": r.name,
            "tokens_per_s": r.tokens_per_s,
            "makespan": r.makespan,
            "peak_rss": r.peak_rss,
            "preemptions": r.preemptions,
            "kv_utilization": r.kv_utilization,
            "per_class": r.per_class(),
            "requests": [asdict(x) for x in r.results],
        }
        for r in runs
    ]
    # Other work that started mid-run skews figures as much as work before it.
    data["quiet_after"] = quiet_check()
    data["plots"] = write_plots(runs, out)
    (out / "results.json").write_text(json.dumps(data, indent=1, default=str))
    text = report(data, runs)
    (out / "report.md").write_text(text)
    print(text)


if __name__ == "__main__":
    sys.exit(main())
