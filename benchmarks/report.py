"""The home benchmark's report: markdown tables and PNG plots from one run's results.

:func:`pyplot` serves every benchmark that draws (the GGUF comparison too).
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

from .runners import CLASSES, VOICE_CONTEXT, RequestResult, SystemRun


def fmt(value: float | None, scale: float = 1.0, digits: int = 2) -> str:
    """A number for a table cell; '–' when missing."""
    return "–" if value is None else f"{value * scale:.{digits}f}"


def span(m: dict[str, float | None], metric: str, scale: float = 1.0, digits: int = 2) -> str:
    """'p50 / p95' of one metric for a table cell."""
    return f"{fmt(m[f'{metric}_p50'], scale, digits)} / {fmt(m[f'{metric}_p95'], scale, digits)}"


def pyplot() -> ModuleType:
    """Matplotlib's pyplot drawing to files only (no display here), imported when first plotted."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def write_plots(runs: list[SystemRun], out: Path) -> list[str]:
    """PNG plots: running sequences and KV blocks over time, TTFT by class, throughput."""
    plt = pyplot()
    names = []
    engine_runs = [r for r in runs if r.trace]
    fig, axes = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    for run in engine_runs:
        ts = [p["t"] for p in run.trace]
        axes[0].plot(ts, [p["running"] for p in run.trace], label=run.name)
        axes[1].plot(ts, [p["blocks"] for p in run.trace], label=run.name)
    axes[0].set_ylabel("running sequences")
    axes[1].set_ylabel("KV blocks in use")
    axes[1].set_xlabel("seconds")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(out / "running_and_blocks.png", dpi=110)
    plt.close(fig)
    names.append("running_and_blocks.png")

    fig, axes = plt.subplots(1, 3, figsize=(12, 4))
    for ax, cls in zip(axes, CLASSES, strict=True):
        data = [[r.ttft for r in run.results if r.priority == cls] or [0.0] for run in runs]
        ax.boxplot(data)
        ax.set_xticks(
            range(1, len(runs) + 1),
            [run.name.split(" (")[0][:18] for run in runs],
            rotation=30,
            ha="right",
            fontsize=7,
        )
        ax.set_title(f"{cls}: time to first token (s)")
        ax.set_yscale("log")
    fig.tight_layout()
    fig.savefig(out / "ttft_by_class.png", dpi=110)
    plt.close(fig)
    names.append("ttft_by_class.png")

    fig, ax = plt.subplots(figsize=(8, 3.5))
    ax.barh([r.name for r in runs], [r.tokens_per_s for r in runs])
    ax.set_xlabel("generated tokens / s (home mix)")
    fig.tight_layout()
    fig.savefig(out / "throughput.png", dpi=110)
    plt.close(fig)
    names.append("throughput.png")
    return names


def report(data: dict[str, Any], runs: list[SystemRun]) -> str:
    """The markdown report of one benchmark run."""
    lines = [f"# Home workload benchmark ({data['mode']})", ""]
    q = data["quiet"]
    lines += [
        f"Machine: {data['machine']}; torch {data['torch']}; "
        f"model {data['model']} ({data['dtype']}, weights {data.get('weights', 'float')}; "
        f"decode attention {data.get('attention', 'torch')}); "
        f"KV budget {data.get('kv_blocks', '?')} blocks ({data['kv_mib']:.0f} MiB); "
        f"garbage collector {data.get('gc', 'as Python starts it')}; "
        f"quiet check: {'quiet' if q['quiet'] else 'BUSY'} "
        f"(other processes used {100 * q['other_cpu_share']:.0f}% of the CPU before the run, "
        f"{100 * data['quiet_after']['other_cpu_share']:.0f}% after).",
        f"Workload: {data['workload']}.",
        "",
        "| system | tokens/s | vs sequential | preemptions | KV utilization | peak RSS MiB |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    seq = next((r for r in runs if "sequential" in r.name), None)
    for r in runs:
        ratio = r.tokens_per_s / seq.tokens_per_s if seq and seq.tokens_per_s else None
        lines.append(
            f"| {r.name} | {r.tokens_per_s:.1f} | {fmt(ratio)}x | {r.preemptions} | "
            f"{fmt(r.kv_utilization, 100, 1)}{'%' if r.kv_utilization is not None else ''} | "
            f"{r.peak_rss / 2**20:.0f} |"
        )
    lines += [
        "",
        "Latency per class, seconds (p50 / p95):",
        "",
        "| system | class | time to first token | end-to-end | time per output token (ms) "
        "| queue wait |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in runs:
        for cls, m in r.per_class().items():
            lines.append(
                f"| {r.name} | {cls} | {span(m, 'ttft')} | {span(m, 'e2e')} | "
                f"{span(m, 'tpot', 1000, 1)} | {span(m, 'queue')} |"
            )
    lines += policy_section(data, runs)
    lines += [
        "",
        "## Concurrent sequences under one KV budget (home mix, all queued at once)",
        "",
        "| manager | blocks | peak running | mean running | KV utilization | preemptions |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in data["capacity"]:
        lines.append(
            f"| {row['manager']} | {row['blocks']} | {row['peak_running']} | "
            f"{row['mean_running']:.1f} | "
            f"{100 * row['kv_utilization']:.1f}% | {row['preemptions']} |"
        )
    p = data["prefix"]
    lines += [
        "",
        "## Voice time to first token, system prompt cached against uncached",
        "",
        f"Prompt {p['prompt_tokens']} tokens: cached {1000 * p['cached']:.0f} ms, "
        f"uncached {1000 * p['uncached']:.0f} ms, ratio {p['ratio']:.1f}x.",
    ]
    lines += [
        "",
        "## Engine cost outside the model forward (decode steps)",
        "",
        "| sequences | step ms | forward ms | outside forward | tokens/s |",
        "| ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in data["overhead"]:
        lines.append(
            f"| {row['sequences']} | {row['step_ms']:.1f} | {row['forward_ms']:.1f} | "
            f"{fmt(row['outside_share'], 100, 1)}% | {fmt(row['tokens_per_s'], 1, 1)} |"
        )
    for row in data.get("overhead_voice_context", []):
        lines += [
            "",
            f"One request after a {VOICE_CONTEXT}-token prompt (a voice query's context): "
            f"{row['step_ms']:.1f} ms a step, {fmt(row['tokens_per_s'], 1, 1)} tokens/s.",
        ]
    lines += llama_cpp_section(data, runs)
    if "batch32" in data:
        b = data["batch32"]
        lines += [
            "",
            "## 32 chat requests at once: this engine against generate_batch",
            "",
            f"{b['requests']} requests x {b['new_tokens']} new tokens: this engine "
            f"{b['engine_tokens_per_s']:.1f} tokens/s, transformers generate_batch "
            f"{b['generate_batch_tokens_per_s']:.1f} tokens/s, ratio {b['ratio']:.2f}x.",
        ]
    m = data["limits"]
    lines += [
        "",
        "## The machine's limit",
        "",
        f"Matrix multiply {m['matmul_gflops']:.0f} GFLOP/s ({data['dtype']}, 2048³); "
        "copy bandwidth "
        f"{m['copy_gbps']:.1f} GB/s. For {m['params'] / 1e6:.0f}M parameters "
        f"({m['weight_bytes'] / 2**20:.0f} MiB of weights): batch-1 decode limit "
        f"{m['batch1_tokens_per_s_limit']:.0f} tokens/s (weights read once per token), "
        f"compute limit {m['compute_tokens_per_s_limit']:.0f} tokens/s "
        "(2 FLOPs per parameter per token).",
        "",
    ]
    for row in data["overhead"]:
        # One step reads the weights once for all its sequences; compute grows with them.
        memory_limit = m["batch1_tokens_per_s_limit"] * row["sequences"]
        limit = min(memory_limit, m["compute_tokens_per_s_limit"])
        bound = "memory" if memory_limit < m["compute_tokens_per_s_limit"] else "compute"
        if row["tokens_per_s"] is None:
            continue
        lines.append(
            f"- {row['sequences']} sequences: {row['tokens_per_s']:.0f} tokens/s = "
            f"{100 * row['tokens_per_s'] / limit:.0f}% of the {bound} limit "
            f"({limit:.0f} tokens/s)"
        )
    if "bursty" in data:
        b = data["bursty"]
        lines += [
            "",
            "## Bursty variant (voice arrives in bursts), this engine",
            "",
            "| system | class | TTFT p50 / p95 | queue p50 / p95 |",
            "| --- | --- | --- | --- |",
        ]
        for name, per in b.items():
            for cls, mm in per.items():
                lines.append(f"| {name} | {cls} | {span(mm, 'ttft')} | {span(mm, 'queue')} |")
    return "\n".join(lines) + "\n"


def llama_cpp_section(data: dict[str, Any], runs: list[SystemRun]) -> list[str]:
    """The section on this engine against llama.cpp on the same GGUF file: decode, mix, memory."""
    peer = data.get("llama_cpp") or {}
    if "one_request_tokens_per_s" not in peer:
        return ["", f"## Against llama.cpp: {peer.get('skipped', 'not run')}"]
    ours = next((r for r in runs if r.name == "paged engine (this project)"), None)
    theirs = next((r for r in runs if r.name.startswith("llama.cpp")), None)
    decode = {row["sequences"]: row["tokens_per_s"] for row in data.get("overhead", [])}
    rows: list[tuple[str, float | None, float | None, bool]] = [
        ("one request, decode tokens/s", peer["one_request_tokens_per_s"], decode.get(1), True),
        ("32 at once, decode tokens/s", peer["batch32_tokens_per_s"], decode.get(32), True),
    ]
    voice_decode = {
        r["sequences"]: r["tokens_per_s"] for r in data.get("overhead_voice_context", [])
    }
    if "one_request_voice_context_tokens_per_s" in peer:
        rows.append(
            (
                f"one request after a {VOICE_CONTEXT}-token prompt, decode tokens/s",
                peer["one_request_voice_context_tokens_per_s"],
                voice_decode.get(1),
                True,
            )
        )
    if ours is not None and theirs is not None:
        voice = {r.name: r.per_class().get("interactive", {}) for r in (ours, theirs)}
        rows += [
            ("home mix, tokens/s", theirs.tokens_per_s, ours.tokens_per_s, True),
            (
                "home mix, voice time to first token p95 (s)",
                voice[theirs.name].get("ttft_p95"),
                voice[ours.name].get("ttft_p95"),
                False,
            ),
            ("peak memory (MiB)", theirs.peak_rss / 2**20, ours.peak_rss / 2**20, False),
        ]
    lines = [
        "",
        f"## Against llama.cpp on the same GGUF file (weights {data.get('weights', 'float')})",
        "",
        "| | llama.cpp | this engine | this engine / llama.cpp |",
        "| --- | ---: | ---: | ---: |",
    ]
    for label, them, us, higher_is_better in rows:
        ratio = us / them if us and them else None
        note = "" if higher_is_better else " (lower is better)"
        lines.append(f"| {label} | {fmt(them, 1, 2)} | {fmt(us, 1, 2)} | {fmt(ratio)}x{note} |")
    return lines


def policy_section(data: dict[str, Any], runs: list[SystemRun]) -> list[str]:
    """Latency-aware against fixed-budget steps, the saturated mix, and the long summary."""
    lines: list[str] = []
    # The same queries alone through the same path; older results only have the prefix
    # experiment's median (a bare engine loop).
    alone = data.get("idle_voice")
    idle = alone["ttft_p95"] if alone else data.get("prefix", {}).get("cached")
    idle_text = (
        f"{fmt(alone['ttft_p50'])} / {fmt(alone['ttft_p95'])} s p50 / p95 ({alone['queries']} "
        "queries, each alone, same path as the mix)"
        if alone
        else f"{fmt(idle)} s"
    )
    engines = [r for r in runs if r.name.startswith("paged engine") and "saturated" not in r.name]
    fixed = next((r for r in engines if "fixed" in r.name), None)
    if len(engines) > 1 and fixed is not None:
        lines += [
            "",
            "## Step policies side by side (same workload, same run)",
            "",
            f"Idle voice time to first token (system prompt cached): {idle_text}. "
            f"Latency policy step budget: at most {data.get('step_seconds', '?')} s (it "
            "follows the measured voice steps down to half of that).",
            "",
            "| system | interactive TTFT p50 / p95 | p95 vs idle | background tokens/s "
            "| vs fixed | automation tokens/s | automation TTFT p50 / p95 | preemptions |",
            "| --- | --- | ---: | ---: | ---: | ---: | --- | ---: |",
        ]
        fixed_bg = fixed.class_tokens_per_s("background")
        for r in engines:
            classes = r.per_class()
            m = classes["interactive"]
            p95 = m["ttft_p95"]
            bg = r.class_tokens_per_s("background")
            lines.append(
                f"| {r.name} | {span(m, 'ttft')} | "
                f"{fmt(p95 / idle if p95 is not None and idle else None)}x | {bg:.1f} | "
                f"{fmt(bg / fixed_bg if fixed_bg else None)}x | "
                f"{r.class_tokens_per_s('automation'):.1f} | "
                f"{span(classes['automation'], 'ttft')} | {r.preemptions} |"
            )
    saturated = next((r for r in runs if "saturated" in r.name), None)
    seq = next((r for r in runs if "sequential" in r.name), None)
    if saturated is not None:
        rate = seq.service_tokens_per_s if seq is not None else None
        lines += [
            "",
            "## Saturated home mix (every request queued at once)",
            "",
            "| system | tokens/s | vs sequential generate | preemptions |",
            "| --- | ---: | ---: | ---: |",
            f"| {saturated.name} | {saturated.tokens_per_s:.1f} | "
            f"{fmt(saturated.tokens_per_s / rate if rate else None)}x | "
            f"{saturated.preemptions} |",
            "",
            "Sequential generate's rate here is its tokens over its summed service times "
            "(queue left out): one request at a time, as if all were queued at once.",
        ]
    if "summary" in data:
        s = data["summary"]
        lines += [
            "",
            "## Voice while the real summarizer reads a document larger than the pool",
            "",
            f"Document {s['document_tokens']} tokens, pool {s['pool_tokens']} tokens: "
            f"{s['parts']} parts, {s['requests']} requests, {s['summary_s']:.0f} s; "
            f"{s['busy_queries']} voice queries during it, policy {s['policy']}.",
            "",
            "| voice | TTFT p50 | TTFT p95 | p95 vs idle | longest queue wait s "
            "| voice preempted | preemptions |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
            f"| idle | {fmt(s['idle_ttft_p50'])} | {fmt(s['idle_ttft_p95'])} | 1.00x | – | – | – |",
            f"| during the summary | {fmt(s['busy_ttft_p50'])} | {fmt(s['busy_ttft_p95'])} | "
            f"{fmt(s['busy_ratio_p95'])}x | {fmt(s['busy_queue_max'], 1, 3)} | "
            f"{s['busy_preempted']} | {s['preemptions']} |",
        ]
        if "busy_e2e_p95" in s:
            lines += [
                "",
                "The whole voice answer (what a person waits for), seconds:",
                "",
                "| voice | answer p50 | answer p95 | p95 vs idle "
                "| time per output token p50 | p95 | p95 vs idle |",
                "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
            ]
            for key, label in (("idle", "idle"), ("busy", "during the summary")):
                lines.append(
                    f"| {label} | {fmt(s[f'{key}_e2e_p50'])} | {fmt(s[f'{key}_e2e_p95'])} | "
                    f"{fmt(s.get(f'{key}_e2e_ratio_p95', 1.0))}x | "
                    f"{fmt(s[f'{key}_tpot_p50'], 1000, 1)} ms | "
                    f"{fmt(s[f'{key}_tpot_p95'], 1000, 1)} ms | "
                    f"{fmt(s.get(f'{key}_tpot_ratio_p95', 1.0))}x |"
                )
        if "announced_queries" in s:
            lines += [
                "",
                f"A second summary of the same document ({s['quiet_summary_s']:.0f} s), voice "
                f"queries each {s['hold_s']:g} s + 0.5 s after the last one ended (the latency "
                "policy's hold lapsed, a home's usual pace); every other one announced "
                f"{s['satellite_lead_s']:g} s before it, as an Assist satellite does at its "
                "wake word:",
                "",
                "| voice after quiet | queries | TTFT p50 | TTFT p95 | p95 vs idle "
                "| longest queue wait s | voice preempted |",
                "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
            ]
            for key, label in (
                ("unannounced", "unannounced"),
                ("announced", "satellite announced"),
            ):
                lines.append(
                    f"| {label} | {s[f'{key}_queries']} | {fmt(s[f'{key}_ttft_p50'])} | "
                    f"{fmt(s[f'{key}_ttft_p95'])} | {fmt(s[f'{key}_ratio_p95'])}x | "
                    f"{fmt(s[f'{key}_queue_max'], 1, 3)} | {s[f'{key}_preempted']} |"
                )
    return lines


def runs_from_json(data: dict[str, Any]) -> list[SystemRun]:
    """Rebuild the systems' runs from a results.json, for --report-only."""
    runs = []
    for sysdata in data["systems"]:
        run = SystemRun(
            sysdata["name"],
            [RequestResult(**r) for r in sysdata["requests"]],
            sysdata["makespan"],
            sysdata["peak_rss"],
            sysdata["preemptions"],
            sysdata["kv_utilization"],
        )
        runs.append(run)
    return runs
