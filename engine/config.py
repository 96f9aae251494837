"""Engine settings: model, device, KV pool size, batching limits and fairness."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path

from paged_llm.defaults import DEFAULT_MODEL, WEIGHT_CHOICES
from paged_llm.engine.structured.json_bounds import JsonBounds

__all__ = [
    "DEFAULT_MODEL",
    "KV_CACHE_DTYPES",
    "RUNNERS",
    "WEIGHT_CHOICES",
    "EngineConfig",
    "JsonBounds",
    "KVLayout",
    "SchedulerConfig",
]

# What the KV pool may hold (model_runner.resolve_kv_dtype turns auto into one of the others).
KV_CACHE_DTYPES = ("auto", "float32", "float16", "bfloat16")
# Model runners (engine/model/selector.py): auto picks numpy for a GGUF file on a CPU.
RUNNERS = ("auto", "torch", "numpy")


# How long the latency policy's step budget holds after the last interactive request: a
# conversation's next question comes once the spoken answer is over, seconds later. In
# the full home mix 4 s kept voice p95 at 2.10x idle against 2.38x with 2 s (the slowest
# queries had come just after a 2 s hold ran out), with the same background throughput.
INTERACTIVE_HOLD_SECONDS = 4.0

# How much longer an interactive request's decode steps may take, on average, than alone.
# The target for a voice answer's time per output token under load is 1.5x idle; this
# value meets it in the home mix with no loss for automations or summaries (they run mostly
# while no voice decodes); the measurement is in docs/performance.md.
INTERACTIVE_SLOWDOWN = 1.1


class KVLayout(enum.StrEnum):
    """How KV memory is handed to requests."""

    PAGED = "paged"
    CONTIGUOUS = "contiguous"


class StepPolicy(enum.StrEnum):
    """How the scheduler sizes a step."""

    # While interactive work runs or waits, fit other prefill chunks to a time budget.
    LATENCY = "latency"
    # Every step takes up to the token budget, whoever runs.
    FIXED = "fixed"


@dataclass(slots=True)
class SchedulerConfig:
    """Limits the scheduler enforces every step.

    ``interactive_kv_reserve`` is the share of the KV pool that only interactive requests
    may use, so a voice query finds room however much background work holds.
    ``interactive_step_seconds`` bounds the step time budget of the latency policy (which
    follows the measured time of a voice query's own first step, down to half of it); the
    budget holds for ``interactive_hold_seconds`` after the last interactive request, as a
    voice query that arrives during a full-budget step waits for that step to end. It
    also bounds a run of steps that interactive prefill takes alone.
    ``interactive_slowdown`` is how much longer, on average, an interactive request's
    decode steps may take than its own decode alone would: other classes' decodes and
    prefill chunks share those steps only within that margin.
    """

    max_num_seqs: int = 32
    max_num_batched_tokens: int = 512
    max_model_len: int = 2048
    max_waiting: int = 256
    aging_seconds: float = 10.0
    interactive_kv_reserve: float = 0.1
    step_policy: StepPolicy = StepPolicy.LATENCY
    interactive_step_seconds: float = 0.1
    interactive_hold_seconds: float = INTERACTIVE_HOLD_SECONDS
    interactive_slowdown: float = INTERACTIVE_SLOWDOWN

    def __post_init__(self) -> None:
        """Reject limits that could never schedule anything."""
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_model_len", "max_waiting"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.aging_seconds <= 0:
            raise ValueError(f"aging_seconds must be > 0, got {self.aging_seconds}")
        _check_settings(self)


def _check_settings(config: SchedulerConfig | EngineConfig) -> None:
    """Validate the fairness settings both configs carry, naming the setting."""
    if not 0 <= config.interactive_kv_reserve < 1:
        raise ValueError(
            f"interactive_kv_reserve must be in [0, 1), got {config.interactive_kv_reserve}"
        )
    if not config.interactive_step_seconds > 0:
        raise ValueError(
            f"interactive_step_seconds must be > 0, got {config.interactive_step_seconds}"
        )
    if not config.interactive_hold_seconds >= 0:
        raise ValueError(
            f"interactive_hold_seconds must be >= 0, got {config.interactive_hold_seconds}"
        )
    if not config.interactive_slowdown >= 1:
        raise ValueError(f"interactive_slowdown must be >= 1, got {config.interactive_slowdown}")
    try:
        config.step_policy = StepPolicy(config.step_policy)
    except ValueError:
        names = ", ".join(StepPolicy)
        raise ValueError(
            f"step_policy must be one of {names}, got {config.step_policy!r}"
        ) from None


@dataclass(slots=True)
class EngineConfig:
    """Everything needed to start an engine.

    ``kv_budget`` is the KV pool size: bytes when above 1, else a fraction of the memory
    free after the weights are loaded. ``interactive_kv_reserve``, ``step_policy``,
    ``interactive_step_seconds``, ``interactive_hold_seconds`` and ``interactive_slowdown``
    are the scheduler's (see
    :class:`SchedulerConfig`). ``kv_cache_dtype`` is what the KV pool holds: ``auto`` is
    float16 on a CPU engine whose float32 model runs quantized weights (half the bytes per
    block, so twice the blocks for a budget, and half the bytes a decode reads), else the
    model's dtype (see model_runner.resolve_kv_dtype). ``json_bounds`` caps the free values
    of structured JSON answers (digits, string length, items; see json_bounds.py).
    """

    model: str = DEFAULT_MODEL
    device: str = "auto"
    dtype: str = "auto"
    block_size: int = 16
    kv_budget: float = 256 * 2**20
    max_num_seqs: int = 32
    max_num_batched_tokens: int = 512
    max_model_len: int | None = None
    max_waiting: int = 256
    aging_seconds: float = 10.0
    kv_layout: KVLayout = KVLayout.PAGED
    attention_backend: str = "auto"
    cache_dir: Path | None = None
    enable_prefix_caching: bool = True
    interactive_kv_reserve: float = 0.1
    step_policy: StepPolicy = StepPolicy.LATENCY
    interactive_step_seconds: float = 0.1
    interactive_hold_seconds: float = INTERACTIVE_HOLD_SECONDS
    interactive_slowdown: float = INTERACTIVE_SLOWDOWN
    weights: str = "auto"
    kv_cache_dtype: str = "auto"
    json_bounds: JsonBounds = field(default_factory=JsonBounds)
    # Which model runner: "auto" (the numpy runner for a GGUF file on a CPU, else torch),
    # "torch" or "numpy" (engine/model/selector.py says when auto takes which).
    runner: str = "auto"

    def __post_init__(self) -> None:
        """Reject settings that cannot work, naming the setting."""
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(f"device must be auto, cpu or cuda, got {self.device!r}")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(
                f"dtype must be auto, float32, bfloat16 or float16, got {self.dtype!r}"
            )
        # Block size 1 is token-granular paging: useless for speed, but the sharpest test.
        if self.block_size not in (1, 8, 16, 32, 64, 128):
            raise ValueError(
                f"block_size must be one of 1, 8, 16, 32, 64, 128, got {self.block_size}"
            )
        if self.kv_budget <= 0:
            raise ValueError(f"kv_budget must be > 0, got {self.kv_budget}")
        if self.attention_backend not in ("auto", "torch", "triton"):
            raise ValueError(
                f"attention_backend must be auto, torch or triton, got {self.attention_backend!r}"
            )
        if self.weights not in WEIGHT_CHOICES:
            raise ValueError(
                f"weights must be one of {', '.join(WEIGHT_CHOICES)}, got {self.weights!r}"
            )
        if self.runner not in RUNNERS:
            raise ValueError(f"runner must be one of {', '.join(RUNNERS)}, got {self.runner!r}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(
                f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, "
                f"got {self.kv_cache_dtype!r}"
            )
        self.kv_layout = KVLayout(self.kv_layout)
        _check_settings(self)
        if self.cache_dir is not None:
            self.cache_dir = Path(self.cache_dir)

    def scheduler_config(self, max_model_len: int) -> SchedulerConfig:
        """The scheduler's share of the settings, once the model's context is known."""
        return SchedulerConfig(
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            max_model_len=max_model_len,
            max_waiting=self.max_waiting,
            aging_seconds=self.aging_seconds,
            interactive_kv_reserve=self.interactive_kv_reserve,
            step_policy=self.step_policy,
            interactive_step_seconds=self.interactive_step_seconds,
            interactive_hold_seconds=self.interactive_hold_seconds,
            interactive_slowdown=self.interactive_slowdown,
        )
