"""Engine metrics: counters and recent-window latencies, published as one immutable snapshot."""

from __future__ import annotations

import enum
import math
from collections import deque
from dataclasses import dataclass, field

from .sequence import Priority, Sequence

WINDOW_REQUESTS = 256
THROUGHPUT_WINDOW_S = 10.0


class EngineState(enum.StrEnum):
    """What the engine is doing, for a person watching it."""

    UNLOADED = "unloaded"
    LOADING = "loading"
    IDLE = "idle"
    READING_PROMPTS = "reading_prompts"
    GENERATING = "generating"


@dataclass(slots=True, frozen=True)
class Percentiles:
    """p50 and p95 of a recent window, in seconds; None when the window is empty."""

    p50: float | None = None
    p95: float | None = None
    count: int = 0


def percentiles(values: list[float]) -> Percentiles:
    """Nearest-rank p50 and p95 of ``values``."""
    if not values:
        return Percentiles()
    ordered = sorted(values)

    def rank(q: float) -> float:
        return ordered[max(0, math.ceil(q * len(ordered)) - 1)]

    return Percentiles(p50=rank(0.50), p95=rank(0.95), count=len(ordered))


@dataclass(slots=True, frozen=True)
class MetricsSnapshot:
    """Everything the engine reports at one moment; names follow vLLM's where one exists."""

    timestamp: float = 0.0
    kv_blocks_used: int = 0
    kv_blocks_total: int = 0
    kv_cache_usage_perc: float = 0.0
    kv_live_tokens: int = 0
    kv_allocated_slots: int = 0
    num_requests_running: int = 0
    num_requests_waiting: int = 0
    num_requests_waiting_by_class: dict[str, int] = field(default_factory=dict)
    num_preemptions: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    prompt_tokens_total: int = 0
    generation_tokens_total: int = 0
    num_requests_finished: int = 0
    time_to_first_token_seconds: dict[str, Percentiles] = field(default_factory=dict)
    request_queue_time_seconds: dict[str, Percentiles] = field(default_factory=dict)
    e2e_request_latency_seconds: dict[str, Percentiles] = field(default_factory=dict)
    generation_throughput: float = 0.0
    # Added after the first release: prompt tokens read per second over the same window,
    # and what the engine is doing (the last step read prompt tokens, or only decoded).
    prompt_throughput: float = 0.0
    engine_state: EngineState = EngineState.UNLOADED

    @property
    def prefix_cache_hit_rate(self) -> float:
        """Share of looked-up prompt tokens found in the prefix cache (0 to 1)."""
        if not self.prefix_cache_queries:
            return 0.0
        return self.prefix_cache_hits / self.prefix_cache_queries

    @property
    def kv_utilization(self) -> float:
        """Live tokens over allocated token slots: how much of the held KV memory is used."""
        if not self.kv_allocated_slots:
            return 0.0
        return self.kv_live_tokens / self.kv_allocated_slots

    def worst(self, family: dict[str, Percentiles]) -> float | None:
        """The highest p95 across classes of one latency family (None when nothing is known)."""
        values = [p.p95 for p in family.values() if p.p95 is not None]
        return max(values) if values else None


class MetricsRecorder:
    """Keeps the recent latencies per class and the token rate; owned by the engine thread."""

    def __init__(self) -> None:
        """Start with empty windows."""
        self._ttft: dict[Priority, deque[float]] = {
            p: deque(maxlen=WINDOW_REQUESTS) for p in Priority
        }
        self._queue: dict[Priority, deque[float]] = {
            p: deque(maxlen=WINDOW_REQUESTS) for p in Priority
        }
        self._e2e: dict[Priority, deque[float]] = {
            p: deque(maxlen=WINDOW_REQUESTS) for p in Priority
        }
        self._steps: deque[tuple[float, int, int]] = deque()
        self._window_tokens = 0
        self._window_prompt_tokens = 0
        self.num_finished = 0

    def record_step(self, now: float, generated: int, prompt_tokens: int = 0) -> None:
        """Count tokens generated and prompt tokens read in a step, for recent throughputs."""
        self._steps.append((now, generated, prompt_tokens))
        self._window_tokens += generated
        self._window_prompt_tokens += prompt_tokens
        while self._steps and self._steps[0][0] < now - THROUGHPUT_WINDOW_S:
            _, old_generated, old_prompt = self._steps.popleft()
            self._window_tokens -= old_generated
            self._window_prompt_tokens -= old_prompt

    def record_first_token(self, seq: Sequence) -> None:
        """Record time to first token and queue time when a sequence's first token arrives."""
        if seq.first_token_time is not None:
            self._ttft[seq.priority].append(seq.first_token_time - seq.arrival_time)
        if seq.first_scheduled_time is not None:
            self._queue[seq.priority].append(seq.first_scheduled_time - seq.arrival_time)

    def record_finished(self, seq: Sequence) -> None:
        """Record end-to-end latency of a sequence that ended."""
        self.num_finished += 1
        if seq.finished_time is not None and seq.first_token_time is not None:
            self._e2e[seq.priority].append(seq.finished_time - seq.arrival_time)

    def _span(self, now: float) -> float | None:
        """Seconds the recent window covers; None when it holds no step."""
        if not self._steps or now - self._steps[-1][0] > THROUGHPUT_WINDOW_S:
            return None
        # At least a second, so the first step of a burst does not read as a huge rate.
        return max(now - self._steps[0][0], 1.0)

    def throughput(self, now: float) -> float:
        """Generated tokens per second over the recent window."""
        span = self._span(now)
        return self._window_tokens / span if span else 0.0

    def prompt_throughput(self, now: float) -> float:
        """Prompt tokens read per second over the recent window."""
        span = self._span(now)
        return self._window_prompt_tokens / span if span else 0.0

    def latencies(
        self,
    ) -> tuple[dict[str, Percentiles], dict[str, Percentiles], dict[str, Percentiles]]:
        """Per-class percentiles of time to first token, queue time and end-to-end latency."""

        def per_class(windows: dict[Priority, deque[float]]) -> dict[str, Percentiles]:
            return {p.name.lower(): percentiles(list(w)) for p, w in windows.items()}

        return per_class(self._ttft), per_class(self._queue), per_class(self._e2e)
