"""Continuous batching: decodes first, then chunked prefills by class, preemption by recompute."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .config import SchedulerConfig
from .errors import RequestRejected
from .kv_cache_manager import KVManager
from .request_queue import RequestQueue, Ticket
from .sequence import FinishReason, Priority, Sequence, SequenceStatus

RUNNING = SequenceStatus.RUNNING


@dataclass(slots=True)
class ScheduledChunk:
    """Tokens ``seq.token_ids[start:start + num_tokens]`` to feed at positions from ``start``."""

    seq: Sequence
    start: int
    num_tokens: int

    @property
    def samples(self) -> bool:
        """Whether the chunk ends at the last known token, so a new token is sampled."""
        return self.start + self.num_tokens == self.seq.num_tokens


@dataclass(slots=True)
class SchedulerOutput:
    """One step's batch: chunks in batch order (decodes first) and who was preempted."""

    chunks: list[ScheduledChunk] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    num_batched_tokens: int = 0

    @property
    def is_empty(self) -> bool:
        """Whether there is nothing to run."""
        return not self.chunks


@dataclass(slots=True)
class _Step:
    """Working state while one batch is built."""

    now: float
    budget: int
    chunks: dict[str, ScheduledChunk] = field(default_factory=dict)
    preempted: list[Sequence] = field(default_factory=list)
    preempted_ids: set[str] = field(default_factory=set)
    # Set when running sequences outgrew the pool: admitting more now would thrash.
    pressure: bool = False


class Scheduler:
    """Builds each step's batch under a token budget and a sequence limit.

    Preemption victims are chosen by base class (a running background job never
    outranks a voice request for memory), then the most recently started. Aging only
    orders the queue and the prefill chunks. A waiting sequence may preempt a running
    one, for a seat or for blocks, only when its effective class is strictly better than
    the victim's class; otherwise admissions stop for this step (no overtaking).
    """

    def __init__(
        self,
        config: SchedulerConfig,
        kv_manager: KVManager,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.kv_manager = kv_manager
        self._clock = clock
        self._waiting = RequestQueue(config.aging_seconds, clock)
        self._running: list[Sequence] = []
        self._seqs: dict[str, Sequence] = {}
        # Place in line of every unfinished sequence; running prefills keep theirs.
        self._tickets: dict[str, Ticket] = {}
        self.num_preemptions = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0

    @property
    def running(self) -> list[Sequence]:
        """Running sequences in admission order (the live list: do not modify)."""
        return self._running

    @property
    def waiting(self) -> RequestQueue:
        """The waiting queue (preempted sequences included)."""
        return self._waiting

    @property
    def num_running(self) -> int:
        """Sequences holding KV blocks and being stepped."""
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        """Sequences waiting for admission, preempted ones included."""
        return len(self._waiting)

    def num_waiting_by_class(self) -> dict[Priority, int]:
        """Count waiting sequences per base priority class."""
        return self._waiting.counts()

    def has_unfinished(self) -> bool:
        """Whether any sequence is waiting or running."""
        return bool(self._seqs)

    def get(self, request_id: str) -> Sequence | None:
        """Return the unfinished sequence with this id."""
        return self._seqs.get(request_id)

    def add(self, seq: Sequence) -> None:
        """Queue a new sequence, or raise RequestRejected when it can never run or must wait."""
        cfg = self.config
        rid = seq.request_id
        if rid in self._seqs:
            raise RequestRejected("duplicate_request", f"request id {rid!r} is already in use")
        total = seq.max_total_tokens
        if total > cfg.max_model_len:
            raise RequestRejected(
                "context_too_long",
                f"request needs {total} tokens (prompt {seq.num_prompt_tokens} + max_tokens "
                f"{seq.params.max_tokens}) but the model's context is {cfg.max_model_len} tokens",
            )
        kv = self.kv_manager
        need, have, size = kv.max_blocks(seq), kv.num_blocks, kv.block_size
        if need > have:
            raise RequestRejected(
                "exceeds_kv_pool",
                f"request needs {need} KV blocks ({need * size} tokens; prompt "
                f"{seq.num_prompt_tokens} + max_tokens {seq.params.max_tokens}) but the whole "
                f"KV pool holds {have} blocks ({have * size} tokens)",
            )
        if len(self._waiting) >= cfg.max_waiting:
            raise RequestRejected(
                "queue_full",
                f"waiting queue is full ({cfg.max_waiting} requests); try again later",
            )
        seq.status = SequenceStatus.WAITING
        self._tickets[rid] = self._waiting.push(seq)
        self._seqs[rid] = seq

    def abort(self, request_id: str) -> Sequence | None:
        """End a request wherever it is and free its blocks; None for an unknown id."""
        seq = self._seqs.get(request_id)
        if seq is not None:
            self._finish(seq, FinishReason.ABORT, self._clock())
        return seq

    def finish(self, seq: Sequence, reason: FinishReason) -> None:
        """End a sequence for the engine (stop string, error): free blocks, mark finished."""
        if self._seqs.get(seq.request_id) is seq:
            self._finish(seq, reason, self._clock())

    def _finish(self, seq: Sequence, reason: FinishReason, now: float) -> None:
        """Take ``seq`` out of every queue, release its blocks and mark it finished."""
        if seq.status is RUNNING:
            self._running.remove(seq)
        else:
            self._waiting.remove(seq.request_id)
        self._finish_running(seq, reason, now)

    def schedule(self) -> SchedulerOutput:
        """Build the next batch: decodes, then prefill chunks in class-then-arrival order."""
        step = _Step(self._clock(), self.config.max_num_batched_tokens)
        prefilling: list[Sequence] = []
        for seq in list(self._running):
            if seq.status is not RUNNING:
                continue  # preempted earlier in this loop
            left = seq.num_tokens - seq.num_computed_tokens
            if left > 1:
                prefilling.append(seq)
            elif left == 1 and step.budget > 0:
                self._reserve(seq, 1, step)
        if step.budget > 0 and (prefilling or self._waiting):
            self._schedule_prefills(prefilling, step)
        return SchedulerOutput(
            list(step.chunks.values()),
            step.preempted,
            self.config.max_num_batched_tokens - step.budget,
        )

    def _schedule_prefills(self, prefilling: list[Sequence], step: _Step) -> None:
        """Give the rest of the budget to running prefills and waiting sequences, best first."""
        aging = self.config.aging_seconds
        tickets = [self._tickets[seq.request_id] for seq in prefilling]
        tickets.extend(self._waiting.ordered(step.now))
        tickets.sort(key=lambda ticket: ticket.rank(step.now, aging))
        admitting = True
        for ticket in tickets:
            if step.budget == 0:
                break
            seq = ticket.seq
            if seq.request_id in step.preempted_ids:
                continue  # never run a sequence in the step that preempted it
            if seq.status is RUNNING:
                left = seq.num_tokens - seq.num_computed_tokens
                self._reserve(seq, min(left, step.budget), step)
            elif admitting:
                admitting = self._admit(ticket, ticket.effective_class(step.now, aging), step)

    def _victim(self) -> Sequence:
        """Pick the running sequence to give up: lowest class, then most recently started."""
        # Reversed so that among equals the later admitted one wins.
        return max(
            reversed(self._running),
            key=lambda s: (s.priority, s.last_started_time or 0.0),
        )

    def _aged_class(self, seq: Sequence, now: float) -> int:
        """A running sequence's class after aging since its arrival.

        A waiting request may take blocks or a seat only from a sequence whose aged class
        is worse than its own: otherwise a steady stream of voice queries could preempt
        the same long summary again and again, and it would be scheduled but never finish.
        """
        waited = max(0.0, now - seq.arrival_time)
        return max(0, int(seq.priority) - math.floor(waited / self.config.aging_seconds))

    def _reserve(self, seq: Sequence, num_tokens: int, step: _Step) -> bool:
        """Schedule a running sequence, preempting others (or itself) until its blocks fit."""
        kv = self.kv_manager
        while not kv.can_allocate(seq, num_tokens):
            victim = self._victim()
            self._preempt(victim, step)
            step.pressure = True
            if victim is seq:
                return False
        kv.allocate(seq, num_tokens)
        step.chunks[seq.request_id] = ScheduledChunk(seq, seq.num_computed_tokens, num_tokens)
        step.budget -= num_tokens
        return True

    def _admit(self, ticket: Ticket, effective_class: int, step: _Step) -> bool:
        """Try to start a waiting sequence; False means admit nothing more this step."""
        if step.pressure:
            return False
        seq = ticket.seq
        if len(self._running) >= self.config.max_num_seqs:
            victim = self._victim()
            if self._aged_class(victim, step.now) <= effective_class:
                return False
            self._preempt(victim, step)
        kv = self.kv_manager
        num_tokens = min(seq.num_tokens - kv.get_computed_tokens(seq), step.budget)
        while not kv.can_allocate(seq, num_tokens):
            if not self._running:
                return False
            victim = self._victim()
            if self._aged_class(victim, step.now) <= effective_class:
                return False
            self._preempt(victim, step)
        self._waiting.remove(seq.request_id)
        kv.allocate(seq, num_tokens)
        seq.status = RUNNING
        if seq.first_scheduled_time is None:
            seq.first_scheduled_time = step.now
        seq.last_started_time = step.now
        self._running.append(seq)
        step.chunks[seq.request_id] = ScheduledChunk(seq, seq.num_computed_tokens, num_tokens)
        step.budget -= num_tokens
        return True

    def _preempt(self, seq: Sequence, step: _Step) -> None:
        """Free a running sequence's blocks and requeue it at the head of its class."""
        rid = seq.request_id
        self._running.remove(seq)
        self.kv_manager.free(seq)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.PREEMPTED
        seq.preempted_times.append(step.now)
        self.num_preemptions += 1
        self._tickets[rid] = self._waiting.push_front(seq)
        chunk = step.chunks.pop(rid, None)
        if chunk is not None:
            step.budget += chunk.num_tokens
        step.preempted.append(seq)
        step.preempted_ids.add(rid)

    def update(self, output: SchedulerOutput, sampled: dict[str, int]) -> list[Sequence]:
        """Account for a finished forward pass; returns the sequences that ended in it."""
        now = self._clock()
        kv = self.kv_manager
        finished: list[Sequence] = []
        for chunk in output.chunks:
            seq = chunk.seq
            if seq.status is not RUNNING:
                continue  # aborted or finished since schedule()
            start, count = chunk.start, chunk.num_tokens
            samples = start + count == seq.num_tokens
            seq.num_computed_tokens = start + count
            prompt = seq.num_prompt_tokens
            if start < prompt:
                self.prompt_tokens_total += min(start + count, prompt) - start
            kv.cache_blocks(seq)
            if not samples:
                continue
            token = sampled.get(seq.request_id)
            if token is None:
                # No token came back: feed the last token again next step so the sequence
                # still has work (its K/V is rewritten with the same values).
                seq.num_computed_tokens -= 1
                continue
            seq.append_token(token)
            self.generation_tokens_total += 1
            if seq.first_token_time is None:
                seq.first_token_time = now
            reason = self._stop_reason(seq, token)
            if reason is not None:
                self._finish_running(seq, reason, now)
                finished.append(seq)
        if finished:
            self._running[:] = [s for s in self._running if s.status is RUNNING]
        return finished

    @staticmethod
    def _stop_reason(seq: Sequence, token: int) -> FinishReason | None:
        """Why ``seq`` ends after sampling ``token``, if it does."""
        params = seq.params
        if token in params.stop_token_ids:
            return FinishReason.STOP
        if not params.ignore_eos and token in seq.extra_stop_token_ids:
            return FinishReason.STOP
        if seq.num_output_tokens >= params.max_tokens:
            return FinishReason.LENGTH
        return None

    def _finish_running(self, seq: Sequence, reason: FinishReason, now: float) -> None:
        """Release a dequeued sequence's blocks and mark it finished (the caller dequeues)."""
        rid = seq.request_id
        self.kv_manager.free(seq)
        del self._seqs[rid]
        self._tickets.pop(rid, None)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        seq.finished_time = now
