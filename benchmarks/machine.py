"""The benchmark's machine: is it quiet, what is it, how fast can it multiply and copy.

Also what every timing benchmark shares: a thread per phase, and steps up to the decodes.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from paged_llm.engine.llm_engine import LLMEngine
from paged_llm.engine.model.gguf_layers import GGUFLinear
from paged_llm.engine.model.loader import LoadedModel

from .process import stop_all


def in_own_thread[T](fn: Callable[..., T], *args: Any) -> T:
    """Run ``fn`` in a thread that ends with it, so the torch threads it used go too.

    torch's OpenMP runtime keeps a worker pool for every live thread that ran parallel
    ops; with more pool threads than cores its workers stop spinning between parallel
    regions and the engine thread decodes at about half speed. The benchmark's main
    thread therefore never runs torch ops itself: each phase gets a thread that exits.
    """
    with ThreadPoolExecutor(max_workers=1) as pool:
        future = pool.submit(fn, *args)
        try:
            return future.result()
        except KeyboardInterrupt:
            # Ctrl-C lands here, not in the phase's thread: stop the servers it started
            # (the llama.cpp peer, paged-llm serve), whose requests then fail and end it.
            stop_all()
            raise


def step_until_decoding(engine: LLMEngine) -> None:
    """Step until every request has its first token: what follows is decode steps only."""
    sched = engine.scheduler
    while sched.num_waiting or any(s.num_output_tokens == 0 for s in sched.running):
        engine.step()


def _busy_jiffies() -> tuple[int, int]:
    """(busy, total) CPU jiffies of the whole machine since boot."""
    with open("/proc/stat") as stat:
        fields = [int(x) for x in stat.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def _own_jiffies() -> int:
    """CPU jiffies this process (all its threads) has used."""
    with open("/proc/self/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def quiet_check(seconds: float = 2.0) -> dict[str, Any]:
    """Measure how much CPU other processes use; the machine is quiet when it is near none."""
    busy0, total0 = _busy_jiffies()
    own0 = _own_jiffies()
    time.sleep(seconds)
    busy1, total1 = _busy_jiffies()
    own1 = _own_jiffies()
    others = max(0, (busy1 - busy0) - (own1 - own0)) / max(1, total1 - total0)
    return {
        "other_cpu_share": round(others, 3),
        "loadavg_1min": round(os.getloadavg()[0], 2),
        "cores": os.cpu_count(),
        "quiet": others < 0.05,
    }


def cpu_name() -> str:
    """The processor's model name from /proc/cpuinfo."""
    with open("/proc/cpuinfo") as info:
        for line in info:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def machine_limits(loaded: LoadedModel) -> dict[str, float]:
    """Measured matmul rate and memory bandwidth, and the decode rates they allow."""
    dtype = loaded.dtype
    a = torch.randn(2048, 2048, dtype=dtype)
    b = torch.randn(2048, 2048, dtype=dtype)
    torch.mm(a, b)
    reps, began = 10, time.perf_counter()
    for _ in range(reps):
        torch.mm(a, b)
    flops = 2 * 2048**3 * reps / (time.perf_counter() - began)
    src = torch.empty(256 * 2**20, dtype=torch.uint8)
    dst = torch.empty_like(src)
    dst.copy_(src)
    began = time.perf_counter()
    for _ in range(5):
        dst.copy_(src)
    bandwidth = 2 * src.numel() * 5 / (time.perf_counter() - began)
    model = loaded.model
    # Packed 4/8-bit layers hold their weights as buffers: count their bytes as read, and
    # their out x in products as computed.
    params = sum(p.numel() for p in model.parameters()) + sum(
        m.in_features * m.out_features
        for m in model.modules()
        if hasattr(m, "in_features") and not isinstance(getattr(m, "weight", None), torch.Tensor)
    )
    # GGUF layers read their file's blocks, which are neither parameters nor buffers (a
    # head tied to the embedding shares its matrix: counted once).
    matrices = {id(m.matrix): m.matrix.data for m in model.modules() if isinstance(m, GGUFLinear)}
    tensors = [*model.parameters(), *model.buffers()]
    weight_bytes = sum(t.numel() * t.element_size() for t in tensors)
    weight_bytes += sum(data.nbytes for data in matrices.values())  # numpy arrays
    return {
        "matmul_gflops": flops / 1e9,
        "copy_gbps": bandwidth / 1e9,
        "params": params,
        "weight_bytes": weight_bytes,
        "batch1_tokens_per_s_limit": bandwidth / weight_bytes,
        "compute_tokens_per_s_limit": flops / (2 * params),
    }
