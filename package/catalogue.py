"""Recommended GGUF files for home control, and what each needs on this box (no torch).

Each entry names a real file on the Hugging Face Hub in Q4_K_M (the quantization llama.cpp
recommends for quality per byte), with the model's shape as its config states it, so the
memory it needs can be shown before anything is downloaded; once the file is here its own
header gives the shape instead.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

# Bytes of one K or V value as the engine's automatic KV dtype holds them: float16 on a CPU
# running a file's quantized weights in place (every recommended file, by default) and the
# model's 16-bit dtype on a GPU; only dense float weights on a CPU keep a float32 pool.
KV_DTYPE_BYTES = 2
# Decoding one token reads every weight once: a CPU's decode speed is its memory bandwidth
# over the file's bytes, times how the engine's kernels (2 threads) compare with the probe
# (one numpy thread). 0.9: Qwen2.5 1.5B Q4_K_M decoded 17.3 tokens/s on the 2-core Zen 3
# box of docs/performance.md, whose probe read 19 GB/s (2026-12-07).
BANDWIDTH_USE = 0.9
# The bandwidth measurement: big enough to leave the CPU caches, short enough for a form.
_PROBE_BYTES = 64 * 2**20
_PROBE_ROUNDS = 3


@dataclass(frozen=True, slots=True)
class Shape:
    """What the KV cache of a model depends on: layers, KV heads, head size, context."""

    layers: int
    kv_heads: int
    head_dim: int
    context: int

    def kv_bytes_per_token(self, dtype_bytes: int = KV_DTYPE_BYTES) -> int:
        """Bytes of keys and values one token takes in every layer."""
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes


@dataclass(frozen=True, slots=True)
class Recommended:
    """One recommended file: where it is on the Hub, its size and shape, why it is listed."""

    key: str  # the form's value
    name: str
    repo: str
    filename: str
    size: int  # bytes, about (the Hub lists it rounded); a download checks the exact figure
    shape: Shape
    tools: bool  # whether its chat template calls tools ("Control Home Assistant")
    why: str


# Small instruct models, 1-4B, in Q4_K_M. Sizes and shapes from the Hub (file listing and
# the model's config.json); the sizes are these repositories' files (unsloth's Qwen3 4B and
# Gemma 3 4B differ by a few kB from the files of the same name elsewhere), as other
# projects that pin them list them (2026-12-07; no Hub access here to ask it directly).
RECOMMENDED: tuple[Recommended, ...] = (
    Recommended(
        key="qwen2.5-1.5b",
        name="Qwen2.5 1.5B Instruct",
        repo="bartowski/Qwen2.5-1.5B-Instruct-GGUF",
        filename="Qwen2.5-1.5B-Instruct-Q4_K_M.gguf",
        size=986_048_768,
        shape=Shape(layers=28, kv_heads=2, head_dim=128, context=32768),
        tools=True,
        why="the smallest model that calls Home Assistant's tools reliably; fast on any CPU",
    ),
    Recommended(
        key="qwen2.5-3b",
        name="Qwen2.5 3B Instruct",
        repo="bartowski/Qwen2.5-3B-Instruct-GGUF",
        filename="Qwen2.5-3B-Instruct-Q4_K_M.gguf",
        size=1_929_903_264,
        shape=Shape(layers=36, kv_heads=2, head_dim=128, context=32768),
        tools=True,
        why="better tool calls and answers than 1.5B at twice the memory; tiny KV per token",
    ),
    Recommended(
        key="qwen3-1.7b",
        name="Qwen3 1.7B",
        repo="unsloth/Qwen3-1.7B-GGUF",
        filename="Qwen3-1.7B-Q4_K_M.gguf",
        size=1_107_409_472,
        shape=Shape(layers=28, kv_heads=8, head_dim=128, context=40960),
        tools=True,
        why="newer than Qwen2.5 1.5B, trained for tool calls; thinking stays off for voice",
    ),
    Recommended(
        key="qwen3-4b",
        name="Qwen3 4B",
        repo="unsloth/Qwen3-4B-GGUF",
        filename="Qwen3-4B-Q4_K_M.gguf",
        size=2_497_281_312,
        shape=Shape(layers=36, kv_heads=8, head_dim=128, context=40960),
        tools=True,
        why="the best home control of this list, for a box with 6 GB or more to spare",
    ),
    Recommended(
        key="llama3.2-3b",
        name="Llama 3.2 3B Instruct",
        repo="bartowski/Llama-3.2-3B-Instruct-GGUF",
        filename="Llama-3.2-3B-Instruct-Q4_K_M.gguf",
        size=2_019_377_696,
        shape=Shape(layers=28, kv_heads=8, head_dim=128, context=131072),
        tools=True,
        why="Meta's small model with tool calls in its template; strong English answers",
    ),
    Recommended(
        key="gemma3-1b",
        name="Gemma 3 1B it",
        repo="unsloth/gemma-3-1b-it-GGUF",
        filename="gemma-3-1b-it-Q4_K_M.gguf",
        size=806_058_272,
        shape=Shape(layers=26, kv_heads=1, head_dim=256, context=32768),
        tools=False,
        why="answers questions well for its size, but its template has no tool calls",
    ),
    Recommended(
        key="gemma3-4b",
        name="Gemma 3 4B it",
        repo="unsloth/gemma-3-4b-it-GGUF",
        filename="gemma-3-4b-it-Q4_K_M.gguf",
        size=2_489_894_016,
        shape=Shape(layers=34, kv_heads=4, head_dim=256, context=131072),
        tools=False,
        why="good multilingual answers and summaries; no tool calls in its template",
    ),
)
BY_KEY = {model.key: model for model in RECOMMENDED}


@dataclass(frozen=True, slots=True)
class Fit:
    """What a model needs here with a KV budget: memory, context, whether it fits, speed."""

    memory: int  # bytes: the weights (the file, memory-mapped) and the KV pool
    context: int  # tokens one sequence may hold: the model's, or what the pool holds
    free: int  # bytes of memory free on this box now
    tokens_per_s: float | None  # estimated decode speed of one request; None: not measured

    @property
    def fits(self) -> bool:
        """Whether the weights and the KV pool fit the memory free now."""
        return self.memory <= self.free


def kv_dtype_bytes(weights: str, device: str) -> int:
    """Bytes per K or V value the engine's automatic KV dtype gives these form settings.

    The engine's own rule (loaded.kv_dtype_name) on what the form knows before a load: a CPU
    model is float32; a GPU one 16-bit. A box whose "auto" device turns out a GPU then holds
    half the counted bytes (the safe side).
    """
    from paged_llm.engine.model.loaded import kv_dtype_name

    on_gpu = device == "cuda"
    model_dtype = "float16" if on_gpu else "float32"
    kv = kv_dtype_name("auto", "cuda" if on_gpu else "cpu", model_dtype, weights)
    return 4 if kv == "float32" else 2


def fit(
    size: int,
    shape: Shape,
    kv_budget: int,
    max_model_len: int = 0,
    free: int | None = None,
    bandwidth: float | None = None,
    dtype_bytes: int = KV_DTYPE_BYTES,
) -> Fit:
    """What a file of ``size`` bytes and ``shape`` needs with a KV pool of ``kv_budget`` bytes.

    ``max_model_len`` 0 takes the model's own context, shortened to what the pool holds, as
    the engine does; ``dtype_bytes`` is :func:`kv_dtype_bytes`' figure.
    """
    held = kv_budget // shape.kv_bytes_per_token(dtype_bytes)
    context = min(max_model_len or shape.context, shape.context)
    if not max_model_len:
        context = min(context, held)
    free = free_memory() if free is None else free
    speed = bandwidth * BANDWIDTH_USE / size if bandwidth and size else None
    return Fit(memory=size + kv_budget, context=context, free=free, tokens_per_s=speed)


# The automatic KV budget (the form's 0): room for this many tokens of one sequence (an
# Assist prompt with some 100 exposed entities and its answer), never below the floor (the
# bundled model's whole context and more), capped so weights and KV fit the memory free.
AUTO_KV_TOKENS = 4096
AUTO_KV_FLOOR = 512 * 2**20


def auto_kv_budget(
    size: int, shape: Shape, free: int | None = None, dtype_bytes: int = KV_DTYPE_BYTES
) -> int:
    """The automatic KV budget in bytes for a file of ``size`` bytes and ``shape``.

    What :data:`AUTO_KV_TOKENS` tokens need (the model's whole context if shorter) at
    ``dtype_bytes`` a value, whole MiB, at least :data:`AUTO_KV_FLOOR`; above the floor, no
    more than the memory free beside the weights.
    """
    tokens = min(AUTO_KV_TOKENS, shape.context)
    need = -(-tokens * shape.kv_bytes_per_token(dtype_bytes) // 2**20) * 2**20
    free = free_memory() if free is None else free
    room = (free - size) // 2**20 * 2**20
    return max(AUTO_KV_FLOOR, min(need, room))


def shape_of(path: Path) -> Shape:
    """A GGUF file's shape from its own header (needs the engine's light extra)."""
    from paged_llm.engine.model.gguf_config import read_config

    config = read_config(path)
    return Shape(
        layers=config.num_hidden_layers,
        kv_heads=config.num_key_value_heads,
        head_dim=config.head_dim,
        context=config.max_position_embeddings,
    )


def free_memory() -> int:
    """Bytes of memory free for a new process: MemAvailable, else free pages."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0


def measure_bandwidth() -> float | None:
    """The memory read bandwidth of this machine in bytes/s (a short numpy probe).

    None where numpy is not installed (the engine's extra brings it).
    """
    try:
        import numpy as np
    except ImportError:
        return None
    data = np.ones(_PROBE_BYTES // 8, dtype=np.float64)
    best = float("inf")
    for _ in range(_PROBE_ROUNDS):
        start = time.perf_counter()
        data.sum()
        best = min(best, time.perf_counter() - start)
    return _PROBE_BYTES / best if best > 0 else None
