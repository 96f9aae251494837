"""Small arithmetic helpers shared by the engine's modules."""

from __future__ import annotations


def cdiv(a: int, b: int) -> int:
    """Ceiling division of non-negative ``a`` by positive ``b``: blocks for ``a`` tokens."""
    return -(-a // b)
