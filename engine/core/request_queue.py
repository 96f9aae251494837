"""The waiting queue: priority classes, first come first served, aging against starvation.

Aging is computed here and only here (:meth:`Ticket.effective_class`): automation and
background work rises one class per ``aging_seconds`` waited, up to the automation class,
never to the interactive one, so no aged work is ever served before a voice request.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from paged_llm.engine.core.sequence import Priority, Sequence


@dataclass(slots=True)
class Ticket:
    """A sequence's place in line: its order within its class and when it began waiting."""

    seq: Sequence
    order: int
    since: float

    def effective_class(self, now: float, aging_seconds: float) -> int:
        """Return the class after aging: one better per ``aging_seconds`` waited.

        Interactive stays interactive; other work rises at most to the automation class.
        """
        base = int(self.seq.priority)
        floor = min(base, int(Priority.AUTOMATION))
        waited = max(0.0, now - self.since)
        return max(floor, base - math.floor(waited / aging_seconds))

    def rank(self, now: float, aging_seconds: float) -> tuple[int, int]:
        """Sort key: effective class, then order (lower goes first)."""
        return (self.effective_class(now, aging_seconds), self.order)


class RequestQueue:
    """Waiting sequences ordered by effective class, then arrival.

    A preempted sequence goes back to the head of its class (its order is negative, and
    the latest preemption comes first). The queue holds a few hundred entries at most,
    so it sorts on demand rather than keeping a heap whose keys change as time passes.
    """

    __slots__ = ("_aging_seconds", "_clock", "_counts", "_next_order", "_tickets")

    def __init__(self, aging_seconds: float, clock: Callable[[], float] = time.monotonic):
        if aging_seconds <= 0:
            raise ValueError(f"aging_seconds must be > 0, got {aging_seconds}")
        self._aging_seconds = aging_seconds
        self._clock = clock
        self._tickets: dict[str, Ticket] = {}
        self._counts = dict.fromkeys(Priority, 0)
        self._next_order = 1

    @property
    def aging_seconds(self) -> float:
        """Seconds of waiting that raise a request by one class."""
        return self._aging_seconds

    def _add(self, seq: Sequence, order: int) -> Ticket:
        """Insert a ticket for ``seq`` with the given order."""
        if seq.request_id in self._tickets:
            raise ValueError(f"request {seq.request_id!r} is already waiting")
        ticket = Ticket(seq, order, self._clock())
        self._tickets[seq.request_id] = ticket
        self._counts[seq.priority] += 1
        return ticket

    def push(self, seq: Sequence) -> Ticket:
        """Queue ``seq`` at the tail of its class."""
        self._next_order += 1
        return self._add(seq, self._next_order)

    def push_front(self, seq: Sequence) -> Ticket:
        """Queue ``seq`` at the head of its class (a preempted sequence)."""
        self._next_order += 1
        return self._add(seq, -self._next_order)

    def effective_class(self, ticket: Ticket, now: float | None = None) -> int:
        """Return the aged class of a ticket at ``now`` (default: the clock)."""
        return ticket.effective_class(self._clock() if now is None else now, self._aging_seconds)

    def ordered(self, now: float | None = None) -> list[Ticket]:
        """Return the tickets in service order at ``now`` (default: the clock)."""
        t = self._clock() if now is None else now
        aging = self._aging_seconds
        return sorted(self._tickets.values(), key=lambda ticket: ticket.rank(t, aging))

    def ticket(self, request_id: str) -> Ticket | None:
        """Return the ticket of a waiting request."""
        return self._tickets.get(request_id)

    def peek(self) -> Sequence | None:
        """Return the sequence that would be served next, or None when empty."""
        if not self._tickets:
            return None
        t = self._clock()
        aging = self._aging_seconds
        return min(self._tickets.values(), key=lambda ticket: ticket.rank(t, aging)).seq

    def pop(self) -> Sequence:
        """Remove and return the sequence served next; IndexError when empty."""
        seq = self.peek()
        if seq is None:
            raise IndexError("pop from an empty request queue")
        self.remove(seq.request_id)
        return seq

    def remove(self, request_id: str) -> Sequence | None:
        """Take a request out of the queue wherever it is; None when it is not waiting."""
        ticket = self._tickets.pop(request_id, None)
        if ticket is None:
            return None
        self._counts[ticket.seq.priority] -= 1
        return ticket.seq

    def count(self, priority: Priority) -> int:
        """Count waiting requests of one (base) class."""
        return self._counts[priority]

    def counts(self) -> dict[Priority, int]:
        """Count waiting requests per (base) class."""
        return dict(self._counts)

    def __len__(self) -> int:
        """Count waiting requests."""
        return len(self._tickets)

    def __bool__(self) -> bool:
        """Whether anything waits."""
        return bool(self._tickets)

    def __contains__(self, request_id: object) -> bool:
        """Whether the request id is waiting."""
        return request_id in self._tickets

    def __iter__(self) -> Iterator[Sequence]:
        """Iterate over the waiting sequences in service order."""
        return iter([ticket.seq for ticket in self.ordered()])
