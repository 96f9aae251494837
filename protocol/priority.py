"""The request priority classes: one enum for the engine and every host, and its parser."""

from __future__ import annotations

import enum


class Priority(enum.IntEnum):
    """A request's class, most urgent first; the value is vLLM's integer (lower runs first)."""

    INTERACTIVE = 0
    AUTOMATION = 1
    BACKGROUND = 2

    @property
    def label(self) -> str:
        """The class's name as requests, metrics and Home Assistant spell it."""
        return self.name.lower()


PRIORITY_NAMES: tuple[str, ...] = tuple(p.label for p in Priority)
DEFAULT_PRIORITY = Priority.INTERACTIVE


def parse_priority(value: object) -> Priority:
    """A class from its name (any case) or vLLM's integer; ValueError naming the choices.

    vLLM's integers map 0 and below to interactive, 1 to automation, 2 and above to
    background: the classes' own numbers, anything beyond them clamped to the nearest end.
    """
    if isinstance(value, Priority):
        return value
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return Priority(min(max(value, Priority.INTERACTIVE), Priority.BACKGROUND))
    if isinstance(value, str):
        name = value.strip().upper()
        if name in Priority.__members__:
            return Priority[name]
    names = ", ".join(PRIORITY_NAMES)
    raise ValueError(
        f"priority must be an integer (vLLM's, lower runs first) or one of: {names}; got {value!r}"
    )


def to_vllm(priority: Priority | str) -> int:
    """The vLLM integer for a class, for a client talking to a vLLM-style server."""
    return int(parse_priority(priority))
