"""Waiting queue: class then arrival order, aging, head-of-class requeue, removal, counts."""

from __future__ import annotations

import pytest

from paged_llm.engine.core.request_queue import RequestQueue
from paged_llm.engine.core.sequence import Priority, SamplingParams, Sequence


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make_seq(rid: str, priority: Priority) -> Sequence:
    return Sequence(rid, [1, 2], SamplingParams(), priority, 0.0)


def order(queue: RequestQueue) -> list[str]:
    return [s.request_id for s in queue]


def test_class_first_then_arrival() -> None:
    queue = RequestQueue(aging_seconds=10.0, clock=FakeClock())
    for rid, p in [("g1", 2), ("a1", 1), ("i1", 0), ("g2", 2), ("i2", 0)]:
        queue.push(make_seq(rid, Priority(p)))
    assert order(queue) == ["i1", "i2", "a1", "g1", "g2"]
    assert len(queue) == 5
    assert queue.counts() == {
        Priority.INTERACTIVE: 2,
        Priority.AUTOMATION: 1,
        Priority.BACKGROUND: 2,
    }
    peeked = queue.peek()
    assert peeked is not None
    assert peeked.request_id == "i1"
    assert queue.pop().request_id == "i1"
    assert queue.count(Priority.INTERACTIVE) == 1


def test_aging_raises_a_waiting_request_one_class_per_period_never_above_interactive() -> None:
    clock = FakeClock()
    queue = RequestQueue(aging_seconds=5.0, clock=clock)
    queue.push(make_seq("g", Priority.BACKGROUND))
    clock.now = 4.9
    queue.push(make_seq("i", Priority.INTERACTIVE))
    queue.push(make_seq("a", Priority.AUTOMATION))
    ticket = queue.ticket("g")
    assert ticket is not None
    assert queue.effective_class(ticket) == 2
    assert order(queue) == ["i", "a", "g"]
    clock.now = 5.0
    assert queue.effective_class(ticket) == 1
    assert order(queue) == ["i", "g", "a"]  # same class as a now, and g came first
    clock.now = 100.0
    assert queue.effective_class(ticket) == 1  # never up to the interactive class
    assert order(queue) == ["i", "g", "a"]
    assert queue.count(Priority.BACKGROUND) == 1  # counts stay by base class


def test_preempted_request_goes_to_the_head_of_its_class() -> None:
    queue = RequestQueue(aging_seconds=10.0, clock=FakeClock())
    queue.push(make_seq("a1", Priority.AUTOMATION))
    queue.push(make_seq("i1", Priority.INTERACTIVE))
    queue.push_front(make_seq("a0", Priority.AUTOMATION))
    assert order(queue) == ["i1", "a0", "a1"]
    queue.push_front(make_seq("a_last", Priority.AUTOMATION))
    assert order(queue) == ["i1", "a_last", "a0", "a1"]


def test_remove_and_membership() -> None:
    queue = RequestQueue(aging_seconds=1.0, clock=FakeClock())
    s = make_seq("x", Priority.AUTOMATION)
    queue.push(s)
    assert "x" in queue
    with pytest.raises(ValueError, match="already waiting"):
        queue.push(s)
    assert queue.remove("x") is s
    assert queue.remove("x") is None
    assert "x" not in queue
    assert not queue
    assert queue.peek() is None
    assert queue.count(Priority.AUTOMATION) == 0
    with pytest.raises(IndexError):
        queue.pop()
    with pytest.raises(ValueError, match="aging_seconds"):
        RequestQueue(aging_seconds=0)
