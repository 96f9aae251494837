"""Priority classes by name, and vLLM's integer priority mapped onto them."""

from __future__ import annotations

import enum


class PriorityClass(enum.StrEnum):
    """The engine's three priority classes, most urgent first (names match the engine's)."""

    INTERACTIVE = "interactive"
    AUTOMATION = "automation"
    BACKGROUND = "background"


PRIORITY_NAMES: tuple[str, ...] = tuple(p.value for p in PriorityClass)
DEFAULT_PRIORITY = PriorityClass.INTERACTIVE


def from_vllm(value: int) -> PriorityClass:
    """Map vLLM's integer priority (lower runs first, 0 by default) onto a class.

    0 and below is interactive, 1 automation, 2 and above background: the engine's own
    class numbers, with anything beyond them clamped to the nearest end.
    """
    if value <= 0:
        return PriorityClass.INTERACTIVE
    if value == 1:
        return PriorityClass.AUTOMATION
    return PriorityClass.BACKGROUND


def to_vllm(priority: PriorityClass | str) -> int:
    """The vLLM integer for a class, for a client talking to a vLLM-style server."""
    return list(PriorityClass).index(parse_priority(priority))


def parse_priority(value: object) -> PriorityClass:
    """A class from its name (any case) or vLLM's integer; ValueError naming the choices."""
    if isinstance(value, PriorityClass):
        return value
    if isinstance(value, bool):
        pass
    elif isinstance(value, int):
        return from_vllm(value)
    elif isinstance(value, float) and value.is_integer():
        return from_vllm(int(value))
    elif isinstance(value, str):
        try:
            return PriorityClass(value.strip().lower())
        except ValueError:
            pass
    names = ", ".join(PRIORITY_NAMES)
    raise ValueError(f"priority must be an integer (vLLM's, lower runs first) or one of: {names}")
