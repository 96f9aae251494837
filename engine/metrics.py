"""Engine metrics: counters and recent-window latencies, published as one immutable snapshot."""

from __future__ import annotations

from paged_llm.engine.core.sequence import Sequence
from paged_llm.metric_windows import THROUGHPUT_WINDOW_S, LatencyWindows, RateWindow
from paged_llm.protocol.snapshot import EngineState, MetricsSnapshot, Percentiles, percentiles

__all__ = ["EngineState", "MetricsRecorder", "MetricsSnapshot", "Percentiles", "percentiles"]


class MetricsRecorder:
    """Keeps the recent latencies per class and the token rates; owned by the engine thread."""

    def __init__(self) -> None:
        """Start with empty windows."""
        self._ttft = LatencyWindows()
        self._queue = LatencyWindows()
        self._e2e = LatencyWindows()
        # Generated and prompt tokens; the window's width is read here so tests can shorten it.
        self._tokens = RateWindow(kinds=2, span_s=THROUGHPUT_WINDOW_S)
        self.num_finished = 0

    def record_step(self, now: float, generated: int, prompt_tokens: int = 0) -> None:
        """Count tokens generated and prompt tokens read in a step, for recent throughputs."""
        self._tokens.add(now, generated, prompt_tokens)

    def record_first_token(self, seq: Sequence) -> None:
        """Record time to first token and queue time when a sequence's first token arrives."""
        if seq.first_token_time is not None:
            self._ttft.add(seq.priority, seq.first_token_time - seq.arrival_time)
        if seq.first_scheduled_time is not None:
            self._queue.add(seq.priority, seq.first_scheduled_time - seq.arrival_time)

    def record_finished(self, seq: Sequence) -> None:
        """Record end-to-end latency of a sequence that ended."""
        self.num_finished += 1
        if seq.finished_time is not None and seq.first_token_time is not None:
            self._e2e.add(seq.priority, seq.finished_time - seq.arrival_time)

    def throughput(self, now: float) -> float:
        """Generated tokens per second over the recent window."""
        return self._tokens.rate(now, 0)

    def prompt_throughput(self, now: float) -> float:
        """Prompt tokens read per second over the recent window."""
        return self._tokens.rate(now, 1)

    def latencies(
        self,
    ) -> tuple[dict[str, Percentiles], dict[str, Percentiles], dict[str, Percentiles]]:
        """Per-class percentiles of time to first token, queue time and end-to-end latency."""
        return self._ttft.percentiles(), self._queue.percentiles(), self._e2e.percentiles()
