"""The CPU forward's thread count, chosen from how fast the steps run.

A step's threads meet at a barrier after every operation, so one core that another
process keeps busy (Home Assistant itself, an add-on, a backup) holds every barrier for
its time slices: one request on the bundled model fell from 113 to 26-33 tokens/s on 2
threads beside one busy process, where 1 thread kept 75 (llama.cpp falls the same way).
The tuner runs the steps on its chosen count and now and then probes a neighbouring count
on a few of them, interleaved with the chosen count's steps of the same shape so that a
growing context or a changing batch does not count as speed; a neighbour that is clearly
faster takes over. Each probe that finds nothing waits twice as long for the next one, so
a quiet machine pays little for the watch.
"""

from __future__ import annotations

import logging
import statistics
from dataclasses import dataclass, field

_LOGGER = logging.getLogger(__name__)

# Steps between probes: the first wait and the longest (each failed probe doubles it).
FIRST_WAIT = 128
LONGEST_WAIT = 1024
# Pairs of like steps (chosen count, then the neighbour) a probe compares.
PROBE_PAIRS = 4
# A probe gives up after this many steps without its pairs (shapes that keep changing).
PROBE_STEPS = 8 * PROBE_PAIRS
# The neighbour takes over when its median time over the pairs is below this fraction of
# the chosen count's: one step's time varies by a few percent on a quiet machine.
SWITCH_BELOW = 0.9


@dataclass(slots=True)
class ThreadTuner:
    """Picks each step's thread count between 1 and ``most``.

    ``pick`` before the step and ``record`` after it, with the step's shape key: steps of
    equal keys are comparable (the runner uses the number of decoding sequences for a step
    that only decodes, None for one that prefills).
    """

    most: int
    threads: int = field(init=False)
    _wait: int = FIRST_WAIT
    _countdown: int = FIRST_WAIT
    _down: bool = True  # which neighbour the next probe tries first
    _candidate: int | None = None
    _probe_steps: int = 0
    _pending: tuple[int, float] | None = None  # the chosen count's last step: key, seconds
    _ratios: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        """Start on every thread the machine offers."""
        self.most = max(1, self.most)
        self.threads = self.most

    def pick(self, key: int | None) -> int:
        """The thread count for the next step, whose shape key is ``key``."""
        if self._candidate is None or key is None:
            return self.threads
        # The neighbour runs right after a step of the chosen count with the same shape.
        if self._pending is not None and self._pending[0] == key:
            return self._candidate
        return self.threads

    def record(self, key: int | None, threads: int, seconds: float) -> None:
        """Note how long a step of shape ``key`` took on ``threads`` threads."""
        if self.most == 1:
            return
        if self._candidate is None:
            if key is not None:
                self._countdown -= 1
                if self._countdown <= 0:
                    self._start_probe()
            return
        self._probe_steps += 1
        if key is None:
            self._pending = None
        elif threads == self.threads:
            self._pending = (key, seconds)
        else:
            if self._pending is not None and self._pending[0] == key and self._pending[1] > 0:
                self._ratios.append(seconds / self._pending[1])
            self._pending = None
        if len(self._ratios) >= PROBE_PAIRS:
            self._decide(statistics.median(self._ratios))
        elif self._probe_steps >= PROBE_STEPS:
            self._end_probe(switched=False)

    def _start_probe(self) -> None:
        """Try a neighbouring count: fewer threads and more in turn, within 1..most."""
        fewer, more = self.threads - 1, self.threads + 1
        if (self._down and fewer >= 1) or more > self.most:
            self._candidate = fewer
        else:
            self._candidate = more
        self._down = not self._down
        self._probe_steps = 0
        self._pending = None
        self._ratios.clear()

    def _decide(self, ratio: float) -> None:
        """Take the neighbour if its steps were clearly faster; else wait longer to ask again."""
        assert self._candidate is not None
        if ratio < SWITCH_BELOW:
            _LOGGER.info(
                "CPU forward on %d threads instead of %d: its steps took %.0f%% of the time "
                "(another process may be keeping a core busy, or have stopped)",
                self._candidate,
                self.threads,
                100 * ratio,
            )
            self.threads = self._candidate
            self._end_probe(switched=True)
        else:
            self._end_probe(switched=False)

    def _end_probe(self, switched: bool) -> None:
        """Back to the chosen count until the next probe."""
        self._wait = FIRST_WAIT if switched else min(2 * self._wait, LONGEST_WAIT)
        self._countdown = self._wait
        self._candidate = None
        self._pending = None
        self._ratios.clear()
