"""A model load's progress: the callback that takes the fraction done, and its parts."""

from __future__ import annotations

from collections.abc import Callable

Progress = Callable[[float], None]


def part(progress: Progress | None, start: float, end: float = 1.0) -> Progress | None:
    """``progress`` for a part of the load spanning the fractions ``start`` to ``end``."""
    if progress is None:
        return None
    return lambda fraction: progress(start + (end - start) * fraction)
