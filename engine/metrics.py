"""Engine metrics: counters and recent-window latencies, published as one immutable snapshot."""

from __future__ import annotations

from collections import deque

from paged_llm.protocol.snapshot import EngineState, MetricsSnapshot, Percentiles, percentiles

from .sequence import Priority, Sequence

__all__ = ["EngineState", "MetricsRecorder", "MetricsSnapshot", "Percentiles", "percentiles"]

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
