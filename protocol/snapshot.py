"""The metrics snapshot the embedded engine publishes and the remote client rebuilds."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field


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
    # Free blocks that still hold a cached prefix: reclaimable, but a later hit.
    kv_blocks_cached: int = 0

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
