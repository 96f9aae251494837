"""Recent-window figures shared by the engine and the remote backend: rates and latencies."""

from __future__ import annotations

from collections import deque

from paged_llm.protocol.priority import Priority, parse_priority
from paged_llm.protocol.snapshot import Percentiles, percentiles

# Latencies: the last this many requests of each class.
WINDOW_REQUESTS = 256
# Token rates: over the last this many seconds.
THROUGHPUT_WINDOW_S = 10.0


class RateWindow:
    """Counts of the last ``span_s`` seconds (one or more kinds), read as rates per second."""

    def __init__(self, kinds: int = 1, span_s: float = THROUGHPUT_WINDOW_S) -> None:
        """Count ``kinds`` quantities side by side (generated and prompt tokens, say)."""
        self.span_s = span_s
        self._events: deque[tuple[float, tuple[int, ...]]] = deque()
        self._totals = [0] * kinds

    def add(self, now: float, *counts: int) -> None:
        """Count what arrived at ``now`` (one count per kind)."""
        self._events.append((now, counts))
        for i, count in enumerate(counts):
            self._totals[i] += count
        self._evict(now)

    def _evict(self, now: float) -> None:
        """Drop what fell out of the window."""
        while self._events and self._events[0][0] < now - self.span_s:
            _, counts = self._events.popleft()
            for i, count in enumerate(counts):
                self._totals[i] -= count

    def rate(self, now: float, kind: int = 0) -> float:
        """Per second over the window; 0 once nothing arrived for a whole window."""
        self._evict(now)
        if not self._events:
            return 0.0
        # At least a second, so the first event of a burst does not read as a huge rate.
        return self._totals[kind] / max(now - self._events[0][0], 1.0)


class LatencyWindows:
    """The latest ``WINDOW_REQUESTS`` latencies of each priority class."""

    def __init__(self) -> None:
        """Start with an empty window per class."""
        self._windows = {p: deque[float](maxlen=WINDOW_REQUESTS) for p in Priority}

    def add(self, priority: Priority | str, seconds: float) -> None:
        """Record one request's latency in its class's window."""
        self._windows[parse_priority(priority)].append(seconds)

    def percentiles(self) -> dict[str, Percentiles]:
        """p50 and p95 of each class, by the class's name."""
        return {p.label: percentiles(list(window)) for p, window in self._windows.items()}
