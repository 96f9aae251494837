"""Continuous batching: decodes first, then chunked prefills by class, preemption by recompute."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from paged_llm.engine.config import SchedulerConfig, StepPolicy
from paged_llm.engine.core.kv.manager import NO_HITS, ComputedBlocks, KVManager
from paged_llm.engine.core.request_queue import RequestQueue, Ticket
from paged_llm.engine.core.sequence import FinishReason, Priority, Sequence, SequenceStatus
from paged_llm.engine.core.step_cost import StepCostModel, StepShape
from paged_llm.engine.errors import RequestRejected

RUNNING = SequenceStatus.RUNNING
# Aging periods a waiting sequence that cannot start may be passed by higher classes.
PASSING_AGING_PERIODS = 3
# The latency policy's budget follows the measured focus steps (a voice query's own first
# step), smoothed with this weight for the newest, and never below this share of
# interactive_step_seconds (a tiny cached prompt must not stall background prefill).
FOCUS_SMOOTHING = 0.25
BUDGET_FLOOR_SHARE = 0.5
# After the hold the step budget grows back by this many seconds per second of quiet: a
# query soon after the hold finds short steps, while a long quiet gets long, efficient ones.
QUIET_GROWTH = 0.1
# No step under the latency policy lasts longer than this, however long the quiet: a request
# that arrives unannounced waits for the step in flight (a 512-token prefill of a 1-4B model
# takes several seconds on a few CPU cores), and per-step costs are small at this length.
LONGEST_STEP_SECONDS = 2.0


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
    # Seconds other classes' prefill chunks must fit in, None when the token budget rules.
    seconds: float | None
    shape: StepShape = field(default_factory=StepShape)
    chunks: dict[str, ScheduledChunk] = field(default_factory=dict)
    preempted: list[Sequence] = field(default_factory=list)
    preempted_ids: set[str] = field(default_factory=set)
    # Set when running sequences outgrew the pool: admitting more now would thrash.
    pressure: bool = False
    # Classes other than interactive that already have a prefill chunk in the step.
    other_prefill: set[Priority] = field(default_factory=set)
    # Set while interactive prefill waits under the latency policy: the step is theirs.
    focus: bool = False
    # Seconds of other classes' work the step may still add while interactive requests
    # decode (may go below zero: a debt later steps repay); None when no such limit holds.
    extra: float | None = None


class Scheduler:
    """Builds each step's batch under a token budget, a sequence limit and a time budget.

    Running decodes first, then prefill chunks in queue order (:mod:`.request_queue`); a
    share of the pool kept for interactive requests; preemption by recompute of the lowest
    class, most recently started; no overtaking within a class (:meth:`_passing` bounds
    it across classes); and the latency policy: step budgets from a :class:`StepCostModel`
    (:meth:`_budget`), focus steps for a voice query's prefill, others' work beside voice
    decodes within ``interactive_slowdown`` (:meth:`_share`), a hold after voice or an
    announcement (:meth:`hold_step_budget`). docs/design.md ("The scheduler") gives each
    rule's reason and what it measured.
    """

    def __init__(
        self,
        config: SchedulerConfig,
        kv_manager: KVManager,
        clock: Callable[[], float] = time.monotonic,
        timer: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.config = config
        self.kv_manager = kv_manager
        self._clock = clock
        self._timer = timer
        self._waiting = RequestQueue(config.aging_seconds, clock)
        self._running: list[Sequence] = []
        self._seqs: dict[str, Sequence] = {}
        # Place in line of every unfinished sequence; running prefills keep theirs.
        self._tickets: dict[str, Ticket] = {}
        # Free blocks that automation and background work must leave to interactive work.
        self._reserve = math.ceil(config.interactive_kv_reserve * kv_manager.num_blocks)
        self.cost_model = StepCostModel()
        # When interactive work last ran or waited (the latency policy's hold).
        self._last_interactive = -math.inf
        # When the current run of focus steps began (None: the last step was not one).
        self._focus_since: float | None = None
        # Smoothed seconds of the focus steps measured so far (None: none yet).
        self._focus_seconds: float | None = None
        # Seconds of other classes' work interactive decode steps still owe them (or, when
        # negative, took beyond their share): see _share.
        self._allowance = 0.0
        # Steps scheduled so far, and the step in which each sequence last had a chunk:
        # under the allowance, the least recently served goes first.
        self._num_steps = 0
        self._served: dict[str, int] = {}
        # The shape, start time and focus flag of the step between schedule() and update().
        self._measuring: tuple[StepShape, float, bool] | None = None
        self.num_preemptions = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0

    @property
    def interactive_reserve_blocks(self) -> int:
        """Free blocks that only interactive requests may take."""
        return self._reserve

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

    def has_interactive(self) -> bool:
        """Whether an interactive request waits or runs."""
        if self._waiting.count(Priority.INTERACTIVE):
            return True
        return any(seq.priority is Priority.INTERACTIVE for seq in self._running)

    def hold_step_budget(self) -> None:
        """Interactive work runs elsewhere or is on its way: hold the step budget from now.

        Engines of one process share the cores and take turns, so this engine's long steps
        delay the other's voice answer as much as its own; and a voice query announced
        before it arrives (an Assist satellite heard its wake word) finds short steps
        instead of waiting for a full token budget's step. Focus steps stay for the
        interactive requests this scheduler itself holds.
        """
        self._last_interactive = self._clock()

    def step_budget_held(self) -> bool:
        """Whether the latency policy's step budget holds now.

        It plans by time once the cost model has seen its first steps.
        """
        return self.config.step_policy is StepPolicy.LATENCY and self._held(self._clock())

    def _held(self, now: float) -> bool:
        """Whether interactive work was here, elsewhere or announced within the hold."""
        return now - self._last_interactive <= self.config.interactive_hold_seconds

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
        need, size = kv.max_blocks(seq), kv.block_size
        have = kv.num_blocks - self._keep_free(seq)
        if need > have:
            share = (
                ""
                if have == kv.num_blocks
                else " its class may use (the rest is kept for interactive requests)"
            )
            raise RequestRejected(
                "exceeds_kv_pool",
                f"request needs {need} KV blocks ({need * size} tokens; prompt "
                f"{seq.num_prompt_tokens} + max_tokens {seq.params.max_tokens}) but the "
                f"KV pool holds {have} blocks ({have * size} tokens){share}",
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
        """Build the next batch: decodes, then prefill chunks in queue order."""
        now = self._clock()
        self._num_steps += 1
        seconds, focus = self._step_time(now)
        step = _Step(now, self.config.max_num_batched_tokens, seconds, focus=focus)
        prefilling: list[Sequence] = []
        # Under a time budget, interactive decodes go first; the others' follow, or share
        # what the interactive decodes allow with the prefills (_share).
        others: list[Sequence] | None = [] if seconds is not None else None
        for seq in list(self._running):
            if seq.status is not RUNNING:
                continue  # preempted earlier in this loop
            left = seq.num_tokens - seq.num_computed_tokens
            if left > 1:
                prefilling.append(seq)
            elif left != 1 or step.budget == 0 or self._sits_out(seq, step):
                continue
            elif others is not None and seq.priority is not Priority.INTERACTIVE:
                others.append(seq)
            elif self._fit(seq, 1, NO_HITS, step):
                self._add_chunk(seq, 1, step)
        sharing: list[Sequence] = []
        if others is not None:
            sharing = self._share(others, step)
        if step.budget > 0 and (prefilling or sharing or self._waiting):
            self._schedule_prefills(prefilling + sharing, step)
        if step.extra is not None:
            self._allowance = step.extra
        elif not step.focus:
            self._allowance = 0.0
        chunks = list(step.chunks.values())
        if chunks:
            self._measuring = (step.shape, self._timer(), step.focus)
        return SchedulerOutput(
            chunks, step.preempted, self.config.max_num_batched_tokens - step.budget
        )

    def _share(self, others: list[Sequence], step: _Step) -> list[Sequence]:
        """Add other classes' decodes, or return them to share an allowance with prefills.

        While interactive requests decode, the step's other work is paid from an allowance:
        each such step adds ``interactive_slowdown - 1`` times the predicted cost of the
        interactive decodes alone, and every other decode or prefill chunk spends its
        predicted cost (one may overdraw: later steps repay it). So a voice answer's time
        per output token stays near its idle one, whatever the background reads, and the
        background still moves on, in the steps between and whenever no voice decodes.
        Those decodes are returned to be ordered with the prefills (least recently served
        first); without interactive decodes, every other decode is added here.
        """
        if any(c.seq.priority is Priority.INTERACTIVE for c in step.chunks.values()):
            alone = self.cost_model.predict(step.shape)
            earned = (self.config.interactive_slowdown - 1.0) * alone
            # Credit is capped at one step budget: a quiet stretch does not buy a long step.
            step.extra = min(self._allowance + earned, self._budget())
            return others
        for seq in others:
            if seq.status is RUNNING and step.budget > 0 and self._fit(seq, 1, NO_HITS, step):
                self._add_chunk(seq, 1, step)
        return []

    def _last_served(self, seq: Sequence) -> int:
        """The step in which ``seq`` last had a chunk (-1: never)."""
        return self._served.get(seq.request_id, -1)

    @staticmethod
    def _sits_out(seq: Sequence, step: _Step) -> bool:
        """Whether ``seq`` waits for the next step: a focus step runs interactive work only."""
        return step.focus and seq.priority is not Priority.INTERACTIVE

    def _step_time(self, now: float) -> tuple[float | None, bool]:
        """The time budget for other classes' prefill, and whether the step is a focus step.

        None means the token budget rules (the fixed policy, or a cost model still
        learning); a focus step (interactive prefill waits) runs interactive work alone,
        for at most one budget's time in a row. The budget holds while interactive work
        runs, waits or is announced, and for ``interactive_hold_seconds`` after: a
        conversation's next voice query, or one an Assist satellite announced, then never
        lands in a long step. After the hold it grows with the quiet (QUIET_GROWTH) up to
        LONGEST_STEP_SECONDS, so the change to long steps is gradual and no step is long
        enough to stall an unannounced query.
        """
        cfg = self.config
        if cfg.step_policy is not StepPolicy.LATENCY or not self.cost_model.ready:
            return None, False
        # One pass: is interactive work here at all, and is any of it still prefilling?
        present = prefill = bool(self._waiting.count(Priority.INTERACTIVE))
        for seq in () if prefill else self._running:
            if seq.priority is Priority.INTERACTIVE:
                present = True
                if seq.num_tokens - seq.num_computed_tokens > 1:
                    prefill = True
                    break
        if present:
            self._last_interactive = now
        if not self._held(now):
            self._focus_since = None
            quiet = now - self._last_interactive - cfg.interactive_hold_seconds
            return min(LONGEST_STEP_SECONDS, self._budget() + QUIET_GROWTH * quiet), False
        seconds = self._budget()
        # Focus steps in a row end once they have lasted interactive_step_seconds; the
        # others then run a step, so a stream of voice queries or one long voice prompt
        # cannot stall them.
        run = cfg.interactive_step_seconds
        if not prefill or (self._focus_since is not None and now - self._focus_since >= run):
            self._focus_since = None
            return seconds, False
        if self._focus_since is None:
            self._focus_since = now
        return seconds, True

    def _budget(self) -> float:
        """The step budget while interactive work is about: as long as its own first steps.

        A voice query that arrives mid-step waits for that step, then runs its own focus
        step; a budget near the focus step's measured time keeps that wait about as long
        as its own work, on a fast CPU as on a slow one. ``interactive_step_seconds`` is the
        most, and half of it the least (before any focus step was measured: the most).
        """
        most = self.config.interactive_step_seconds
        if self._focus_seconds is None:
            return most
        return min(most, max(BUDGET_FLOOR_SHARE * most, self._focus_seconds))

    def _schedule_prefills(self, running: list[Sequence], step: _Step) -> None:
        """Give the rest of the budget to running sequences and waiting ones, in order.

        ``running`` holds the running prefills and the decodes that share the interactive
        decodes' allowance.
        """
        aging = self.config.aging_seconds
        tickets = [self._tickets[seq.request_id] for seq in running]
        tickets.extend(self._waiting.ordered(step.now))
        tickets.sort(key=lambda ticket: ticket.rank(step.now, aging))
        if step.extra is not None:
            # The least recently served go first, so the first in rank (an aged summary)
            # does not spend every allowance while an automation waits.
            tickets.sort(key=lambda ticket: self._last_served(ticket.seq))
        # Base classes that may still start behind a waiting sequence that could not.
        passing = len(Priority)
        for ticket in tickets:
            if step.budget == 0:
                break
            seq = ticket.seq
            if seq.request_id in step.preempted_ids or self._sits_out(seq, step):
                continue  # not in the step that preempted it, nor in the voice's step
            if seq.status is RUNNING:
                start = seq.num_computed_tokens
                if seq.num_tokens - start == 1:  # a decode, under the allowance (_share)
                    spare = step.extra is None or step.extra > 0
                    if spare and self._fit(seq, 1, NO_HITS, step):
                        self._add_chunk(seq, 1, step)
                    continue
                num_tokens = self._chunk_size(seq, start, seq.num_tokens - start, step)
                if num_tokens and self._fit(seq, num_tokens, NO_HITS, step):
                    self._add_chunk(seq, num_tokens, step)
            elif seq.priority < passing and not self._admit(seq, step):
                passing = self._passing(ticket, passing, step)

    def _passing(self, blocked: Ticket, passing: int, step: _Step) -> int:
        """Return the bound below which base classes may still start behind ``blocked``.

        An aged summary that waits for memory ranks with automations; were it to end
        admissions, automations that could start (they are short) would queue behind it
        for as long as the summaries before it hold the pool. Passing ends once it has
        waited ``PASSING_AGING_PERIODS`` aging periods, so it cannot starve.
        """
        waited = step.now - blocked.since
        if step.pressure or waited >= PASSING_AGING_PERIODS * self.config.aging_seconds:
            return 0
        return min(passing, int(blocked.seq.priority))

    def _chunk_size(self, seq: Sequence, start: int, left: int, step: _Step) -> int:
        """Tokens of a prefill chunk: the token budget, and for other classes the time one."""
        num_tokens = min(left, step.budget)
        if step.seconds is None or seq.priority is Priority.INTERACTIVE:
            return num_tokens
        model = self.cost_model
        fits = model.max_chunk(step.shape, start, step.seconds)
        if step.extra is not None:
            if step.extra <= 0:
                return 0  # the interactive decodes' share is spent: a later step
            fits = min(
                fits, model.max_chunk(step.shape, start, model.predict(step.shape) + step.extra)
            )
        block = self.kv_manager.block_size
        if fits < min(num_tokens, block):
            # Over the budget already: each class's first chunk still gets a block, so its
            # work progresses even when a step of voice alone exceeds the budget, and an
            # automation still starts beside a summary that aging ranked before it.
            if seq.priority in step.other_prefill:
                return 0
            fits = block
        step.other_prefill.add(seq.priority)
        return min(num_tokens, fits)

    def _admit(self, seq: Sequence, step: _Step) -> bool:
        """Try to start a waiting sequence; False means admit nothing more this step."""
        if step.pressure:
            return False
        # One prefix lookup per admission: the hits are taken or the admission waits.
        computed = self.kv_manager.get_computed_blocks(seq)
        start = computed.num_tokens
        num_tokens = self._chunk_size(seq, start, seq.num_tokens - start, step)
        if num_tokens == 0:
            return False  # no time for it this step: take no one's seat for nothing
        if len(self._running) >= self.config.max_num_seqs:
            victim = self._victim(seq, strictly_lower=True)
            if victim is None:
                return False
            self._preempt(victim, step)
        if not self._fit(seq, num_tokens, computed, step):
            return False
        self._waiting.remove(seq.request_id)
        seq.status = RUNNING
        if seq.first_scheduled_time is None:
            seq.first_scheduled_time = step.now
        seq.last_started_time = step.now
        self._running.append(seq)
        self._add_chunk(seq, num_tokens, step)
        return True

    def _keep_free(self, seq: Sequence) -> int:
        """Free blocks ``seq`` must leave untouched: the interactive reserve, unless it is one."""
        return 0 if seq.priority is Priority.INTERACTIVE else self._reserve

    def _fit(self, seq: Sequence, num_tokens: int, computed: ComputedBlocks, step: _Step) -> bool:
        """Allocate slots for ``seq``, preempting victims until they fit; False if they cannot.

        A waiting sequence only preempts strictly lower classes; a running one may preempt
        its equals and, as the last resort, itself.
        """
        waiting = seq.status is not RUNNING
        kv = self.kv_manager
        keep_free = self._keep_free(seq)
        while not kv.allocate_slots(seq, num_tokens, computed, keep_free):
            victim = self._victim(seq, strictly_lower=waiting)
            if victim is None:
                return False
            self._preempt(victim, step)
            if not waiting:
                step.pressure = True
            if victim is seq:
                return False
        return True

    def _victim(self, seq: Sequence, strictly_lower: bool) -> Sequence | None:
        """The running sequence to give up for ``seq``: lowest class, then latest started.

        Only sequences of a lower base class qualify (or of the same class, ``seq``
        included, when ``strictly_lower`` is False); None when there is none.
        """
        floor = seq.priority + 1 if strictly_lower else seq.priority
        best: Sequence | None = None
        for cand in self._running:
            if cand.priority < floor:
                continue
            # Later in the list means admitted later: among equals it wins.
            if best is None or (cand.priority, cand.last_started_time or 0.0) >= (
                best.priority,
                best.last_started_time or 0.0,
            ):
                best = cand
        return best

    def _add_chunk(self, seq: Sequence, num_tokens: int, step: _Step) -> None:
        """Put ``num_tokens`` of ``seq`` (blocks already allocated) into the step."""
        start = seq.num_computed_tokens
        step.chunks[seq.request_id] = ScheduledChunk(seq, start, num_tokens)
        self._served[seq.request_id] = self._num_steps
        step.budget -= num_tokens
        if step.extra is None or seq.priority is Priority.INTERACTIVE:
            step.shape.add(start, num_tokens)
            return
        before = self.cost_model.predict(step.shape)
        step.shape.add(start, num_tokens)
        step.extra -= self.cost_model.predict(step.shape) - before

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
            step.shape.num_tokens -= chunk.num_tokens
            step.shape.num_seqs -= 1
            step.shape.attention -= chunk.num_tokens * (chunk.start + chunk.num_tokens)
        step.preempted.append(seq)
        step.preempted_ids.add(rid)

    def update(self, output: SchedulerOutput, sampled: dict[str, int]) -> list[Sequence]:
        """Account for a finished forward pass; returns the sequences that ended in it."""
        if self._measuring is not None:
            shape, started, focus = self._measuring
            self._measuring = None
            seconds = self._timer() - started
            self.cost_model.observe(shape, seconds)
            if focus:
                last = self._focus_seconds
                self._focus_seconds = (
                    seconds if last is None else last + FOCUS_SMOOTHING * (seconds - last)
                )
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
            if seq.params.max_tokens == 0:
                # A scoring request (prompt_logprobs only): done once its prompt is read.
                self._finish_running(seq, FinishReason.LENGTH, now)
                finished.append(seq)
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
        self._served.pop(rid, None)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        seq.finished_time = now
