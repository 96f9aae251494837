"""Engine metrics: counters and recent-window latencies, published as one immutable snapshot."""

from __future__ import annotations

from collections import deque

from paged_llm.protocol.snapshot import MetricsSnapshot, Percentiles, percentiles

from .sequence import Priority, Sequence

__all__ = ["MetricsRecorder", "MetricsSnapshot", "Percentiles", "percentiles"]

WINDOW_REQUESTS = 256
THROUGHPUT_WINDOW_S = 10.0


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
        self._steps: deque[tuple[float, int]] = deque()
        self._window_tokens = 0
        self.num_finished = 0

    def record_step(self, now: float, generated: int) -> None:
        """Count tokens generated in a step, for the recent-window throughput."""
        self._steps.append((now, generated))
        self._window_tokens += generated
        while self._steps and self._steps[0][0] < now - THROUGHPUT_WINDOW_S:
            self._window_tokens -= self._steps.popleft()[1]

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

    def throughput(self, now: float) -> float:
        """Generated tokens per second over the recent window."""
        if not self._steps:
            return 0.0
        span = max(now - self._steps[0][0], 1e-3)
        if now - self._steps[-1][0] > THROUGHPUT_WINDOW_S:
            return 0.0
        return self._window_tokens / span

    def latencies(
        self,
    ) -> tuple[dict[str, Percentiles], dict[str, Percentiles], dict[str, Percentiles]]:
        """Per-class percentiles of time to first token, queue time and end-to-end latency."""

        def per_class(windows: dict[Priority, deque[float]]) -> dict[str, Percentiles]:
            return {p.name.lower(): percentiles(list(w)) for p, w in windows.items()}

        return per_class(self._ttft), per_class(self._queue), per_class(self._e2e)
