"""A step's time from its shape, learned online from measured steps (decayed least squares).

The model is linear in four features of a step: a constant, the tokens it feeds, the
sequences it carries and the attention work (query tokens times the context each one
reads). The scheduler plans each step with it while interactive work runs or waits, so
automation and background prefill chunks are cut to what fits a time budget.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Attention work is counted in units of this many token pairs so every feature is of the
# same order (hundreds) and the ridge term weighs them alike.
ATTENTION_UNIT = 4096

# Forget old steps with this factor per observation: about the last 200 steps count.
DECAY = 0.995

# Steps to observe before planning by time; until then the token budget alone applies.
MIN_OBSERVATIONS = 8

# Ridge regularisation, relative to each feature's scale: keeps the solve defined while
# some features never varied yet.
RIDGE = 1e-6

NUM_FEATURES = 4


@dataclass(slots=True)
class StepShape:
    """What a step feeds: tokens, sequences, and attention work in token pairs."""

    num_tokens: int = 0
    num_seqs: int = 0
    attention: int = 0

    def add(self, start: int, num_tokens: int) -> None:
        """Count one chunk of ``num_tokens`` query tokens at positions from ``start``."""
        self.num_tokens += num_tokens
        self.num_seqs += 1
        self.attention += num_tokens * (start + num_tokens)

    def features(self) -> list[float]:
        """The model's inputs for this shape."""
        return [1.0, float(self.num_tokens), float(self.num_seqs), self.attention / ATTENTION_UNIT]


def _solve(a: list[list[float]], b: list[float]) -> list[float]:
    """Solve the small symmetric positive definite system ``a x = b`` (Gaussian elimination)."""
    n = len(b)
    m = [[*row, b[i]] for i, row in enumerate(a)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        m[col], m[pivot] = m[pivot], m[col]
        if m[col][col] == 0.0:
            continue
        for r in range(col + 1, n):
            f = m[r][col] / m[col][col]
            for c in range(col, n + 1):
                m[r][c] -= f * m[col][c]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        if m[r][r] == 0.0:
            continue
        x[r] = (m[r][n] - sum(m[r][c] * x[c] for c in range(r + 1, n))) / m[r][r]
    return x


class StepCostModel:
    """Predicts a step's seconds from its :class:`StepShape`; learns from each measured step."""

    __slots__ = ("_coef", "_dirty", "_gram", "_rhs", "num_observations")

    def __init__(self) -> None:
        self._gram = [[0.0] * NUM_FEATURES for _ in range(NUM_FEATURES)]
        self._rhs = [0.0] * NUM_FEATURES
        self._coef = [0.0] * NUM_FEATURES
        self._dirty = False
        self.num_observations = 0

    @property
    def ready(self) -> bool:
        """Whether enough steps were seen to plan by time."""
        return self.num_observations >= MIN_OBSERVATIONS

    def observe(self, shape: StepShape, seconds: float) -> None:
        """Add one measured step."""
        if not math.isfinite(seconds) or seconds < 0 or shape.num_tokens == 0:
            return
        x = shape.features()
        for i in range(NUM_FEATURES):
            row = self._gram[i]
            for j in range(NUM_FEATURES):
                row[j] = DECAY * row[j] + x[i] * x[j]
            self._rhs[i] = DECAY * self._rhs[i] + x[i] * seconds
        self.num_observations += 1
        self._dirty = True

    @property
    def coefficients(self) -> list[float]:
        """Seconds per unit of each feature (constant, token, sequence, attention unit) >= 0."""
        if self._dirty:
            gram = [row[:] for row in self._gram]
            for i in range(NUM_FEATURES):
                # Relative to each feature's own scale, plus a floor for unseen ones.
                gram[i][i] += RIDGE * gram[i][i] + 1e-9
            # A negative cost would let the planner add work for free: clamp to zero.
            self._coef = [max(0.0, c) for c in _solve(gram, self._rhs)]
            self._dirty = False
        return self._coef

    def predict(self, shape: StepShape) -> float:
        """Seconds a step of this shape takes."""
        return sum(c * x for c, x in zip(self.coefficients, shape.features(), strict=True))

    def max_chunk(self, shape: StepShape, start: int, seconds: float) -> int:
        """Most query tokens one more chunk from ``start`` may have so the step fits ``seconds``."""
        _, per_token, per_seq, per_attention = self.coefficients
        left = seconds - self.predict(shape) - per_seq
        if left <= 0:
            return 0
        # Cost of n tokens: per_token * n + per_attention * n * (start + n) / ATTENTION_UNIT.
        qa = per_attention / ATTENTION_UNIT
        qb = per_token + qa * start
        if qa == 0.0:
            return int(left / qb) if qb > 0 else 1 << 30
        return int((-qb + math.sqrt(qb * qb + 4 * qa * left)) / (2 * qa))
