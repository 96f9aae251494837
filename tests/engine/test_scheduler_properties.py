"""Stateful property tests: random add/step/abort/finish/time over both KV managers."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from paged_llm.engine.config import SchedulerConfig
from paged_llm.engine.core.kv.block_pool import cdiv
from paged_llm.engine.core.kv.contiguous import ContiguousKVCacheManager
from paged_llm.engine.core.kv.paged import KVCacheManager
from paged_llm.engine.core.scheduler import Scheduler, SchedulerOutput
from paged_llm.engine.core.sequence import (
    FinishReason,
    Priority,
    SamplingParams,
    Sequence,
    SequenceStatus,
)
from paged_llm.engine.errors import RequestRejected

EOS = 0
# Shared prefixes over a tiny vocabulary, so prompts (and outputs) repeat and share blocks.
PREFIXES = [[], [1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3, 4, 5, 6, 7]]


REQUEST = st.fixed_dictionaries(
    {
        "prefix": st.sampled_from(PREFIXES),
        "suffix": st.lists(st.integers(1, 6), max_size=16),
        "max_tokens": st.integers(1, 12),
        "priority": st.sampled_from(list(Priority)),
        "eos": st.booleans(),
        "ignore_eos": st.booleans(),
    }
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class SchedulerMachine(RuleBasedStateMachine):
    """Drives a scheduler like an engine would and checks the KV bookkeeping after each op."""

    contiguous = False

    def __init__(self) -> None:
        super().__init__()
        self.seqs: list[Sequence] = []
        self.clock = FakeClock()
        self.next_id = 0
        # What the attention would read: the token whose K/V sits in each slot.
        self.slots: dict[int, list[int | None]] = {}

    @initialize(
        block_size=st.sampled_from([2, 4, 8]),
        pool_tokens=st.integers(12, 64),
        budget=st.integers(1, 40),
        max_seqs=st.integers(1, 6),
        max_model_len=st.integers(12, 64),
        caching=st.booleans(),
        reserve=st.sampled_from(["request", "max_model_len"]),
        interactive_share=st.sampled_from([0.0, 0.1, 0.5]),
        policy=st.sampled_from(["latency", "fixed"]),
        initial=st.lists(REQUEST, max_size=8),
    )
    def setup(
        self,
        block_size: int,
        pool_tokens: int,
        budget: int,
        max_seqs: int,
        max_model_len: int,
        caching: bool,
        reserve: str,
        interactive_share: float,
        policy: str,
        initial: list[dict[str, Any]],
    ) -> None:
        kv: KVCacheManager | ContiguousKVCacheManager
        num_blocks = cdiv(pool_tokens, block_size)
        if self.contiguous:
            kv = ContiguousKVCacheManager(num_blocks, block_size, max_model_len, reserve)
        else:
            kv = KVCacheManager(num_blocks, block_size, caching)
        config = SchedulerConfig(
            max_num_seqs=max_seqs,
            max_num_batched_tokens=budget,
            max_model_len=max_model_len,
            max_waiting=6,
            aging_seconds=1.0,
            interactive_kv_reserve=interactive_share,
            step_policy=policy,  # type: ignore[arg-type]
            interactive_step_seconds=0.05,
        )
        self.kv = kv
        # Every step "takes" 0.01 s per token fed, so the latency policy's plan is
        # deterministic: it must cut chunks yet never break an invariant.
        self.fed = 0

        def timer() -> float:
            return self.fed * 0.01

        self.sched = Scheduler(config, kv, self.clock, timer)
        for request in initial:
            self.add(**request)

    # --- operations --------------------------------------------------------------

    @rule(request=REQUEST)
    def add_request(self, request: dict[str, Any]) -> None:
        self.add(**request)

    def add(
        self,
        prefix: list[int],
        suffix: list[int],
        max_tokens: int,
        priority: Priority,
        eos: bool,
        ignore_eos: bool,
    ) -> None:
        """Submit a request; a rejection must name exactly the limit it breaks."""
        prompt = prefix + suffix or [1]
        self.next_id += 1
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos)
        seq = Sequence(f"r{self.next_id}", prompt, params, priority, self.clock.now)
        if eos:
            seq.extra_stop_token_ids = (EOS,)
        cfg = self.sched.config
        if seq.max_total_tokens > cfg.max_model_len:
            expected = "context_too_long"
        elif self.kv.max_blocks(seq) > self.kv.num_blocks - (
            0 if priority is Priority.INTERACTIVE else self.sched.interactive_reserve_blocks
        ):
            expected = "exceeds_kv_pool"
        elif self.sched.num_waiting >= cfg.max_waiting:
            expected = "queue_full"
        else:
            expected = ""
        if expected:
            with pytest.raises(RequestRejected) as err:
                self.sched.add(seq)
            assert err.value.code == expected
            return
        self.sched.add(seq)
        assert seq.status is SequenceStatus.WAITING
        self.seqs.append(seq)

    def feed(self, out: SchedulerOutput) -> None:
        """Act as the model runner: check what attention would read, write the new K/V."""
        b = self.kv.block_size
        budget = self.sched.config.max_num_batched_tokens
        assert out.num_batched_tokens == sum(c.num_tokens for c in out.chunks) <= budget
        assert len({c.seq.request_id for c in out.chunks}) == len(out.chunks)
        preempted = {s.request_id for s in out.preempted}
        for chunk in out.chunks:
            seq = chunk.seq
            assert seq.request_id not in preempted
            assert seq.status is SequenceStatus.RUNNING
            assert chunk.start == seq.num_computed_tokens
            assert chunk.num_tokens >= 1
            assert chunk.start + chunk.num_tokens <= seq.num_tokens
            table = self.kv.block_table(seq)
            assert len(table) * b >= chunk.start + chunk.num_tokens
            for pos in range(chunk.start):  # the cached context must be this sequence's own
                assert self.slots[table[pos // b]][pos % b] == seq.token_ids[pos]
            for pos in range(chunk.start, chunk.start + chunk.num_tokens):
                block = self.slots.setdefault(table[pos // b], [None] * b)
                block[pos % b] = seq.token_ids[pos]
        for seq in out.preempted:
            assert seq.status is SequenceStatus.PREEMPTED
            assert seq.num_computed_tokens == 0
            assert not self.kv.has_blocks(seq)

    @rule(token=st.integers(0, 6), drop=st.booleans())
    def step(self, token: int, drop: bool = False) -> None:
        out = self.sched.schedule()
        self.fed += out.num_batched_tokens
        self.feed(out)
        sampled = {c.seq.request_id: (token + i) % 7 for i, c in enumerate(out.chunks) if c.samples}
        if drop and sampled:  # a token the runner did not return is asked for again
            del sampled[next(iter(sampled))]
        for seq in self.sched.update(out, sampled):
            assert seq.status is SequenceStatus.FINISHED
            assert not self.kv.has_blocks(seq)

    @rule(index=st.integers(0, 50))
    def abort_mid_step(self, index: int) -> None:
        out = self.sched.schedule()
        self.feed(out)
        if out.chunks:
            gone = out.chunks[index % len(out.chunks)].seq
            assert self.sched.abort(gone.request_id) is gone
        self.sched.update(out, {c.seq.request_id: 3 for c in out.chunks if c.samples})
        if out.chunks:
            assert gone.finish_reason is FinishReason.ABORT

    @rule(index=st.integers(0, 50))
    def abort(self, index: int) -> None:
        if not self.seqs:
            return
        seq = self.seqs[index % len(self.seqs)]
        was_live = not seq.is_finished
        got = self.sched.abort(seq.request_id)
        assert (got is seq) == was_live
        assert seq.is_finished

    @rule(index=st.integers(0, 50))
    def finish_running(self, index: int) -> None:
        running = self.sched.running
        if running:
            seq = running[index % len(running)]
            self.sched.finish(seq, FinishReason.ERROR)
            assert seq.status is SequenceStatus.FINISHED

    @rule(dt=st.sampled_from([0.1, 0.5, 1.0, 3.0]))
    def tick(self, dt: float) -> None:
        self.clock.now += dt

    # --- invariants --------------------------------------------------------------

    @invariant()
    def blocks_are_accounted_for(self) -> None:
        kv = self.kv
        assert kv.num_free_blocks + kv.num_used_blocks == kv.num_blocks
        assert 0.0 <= kv.usage <= 1.0
        holders: Counter[int] = Counter()
        stored: set[tuple[int, int]] = set()
        for seq in self.seqs:
            if not self.kv.has_blocks(seq):
                assert seq.status is not SequenceStatus.RUNNING
                continue
            assert seq.status is SequenceStatus.RUNNING
            table = kv.block_table(seq)
            assert len(set(table)) == len(table)
            assert len(table) * kv.block_size >= seq.num_computed_tokens
            holders.update(table)
            b = kv.block_size
            stored.update((table[p // b], p % b) for p in range(seq.num_computed_tokens))
        assert kv.num_used_blocks == len(holders)
        assert kv.num_allocated_slots == len(holders) * kv.block_size
        assert kv.num_live_tokens == len(stored) <= kv.num_allocated_slots
        if isinstance(kv, KVCacheManager):
            pool = kv.pool
            if pool.num_extra_refs:
                event("a block is shared")
            for block_id in range(kv.num_blocks):
                assert pool.ref_count(block_id) == holders.get(block_id, 0) >= 0
                if holders.get(block_id, 0) > 1:  # shared only through its content hash
                    block_hash = pool.block_hash(block_id)
                    assert block_hash is not None
                    assert pool.get_cached(block_hash) == block_id
            assert kv.prefix_cache_hits <= kv.prefix_cache_queries
        else:
            assert max(holders.values(), default=1) == 1
            for seq in self.seqs:
                if kv.has_blocks(seq):
                    table = kv.block_table(seq)
                    assert table == list(range(table[0], table[0] + len(table)))
            free = sum(length for _, length in kv.free_extents)
            assert free == kv.num_free_blocks

    @invariant()
    def queues_are_consistent(self) -> None:
        sched = self.sched
        assert sched.num_running <= sched.config.max_num_seqs
        live = [s for s in self.seqs if not s.is_finished]
        assert sched.num_running + sched.num_waiting == len(live)
        assert sched.has_unfinished() == bool(live)
        assert sum(sched.num_waiting_by_class().values()) == sched.num_waiting
        assert sched.num_preemptions == sum(s.num_preemptions for s in self.seqs)
        for seq in live:
            assert sched.get(seq.request_id) is seq
            assert seq.num_computed_tokens <= seq.num_tokens
            if seq.status is not SequenceStatus.RUNNING:
                assert seq.request_id in sched.waiting

    def teardown(self) -> None:
        if not hasattr(self, "sched"):
            return
        for n in range(3000):  # every request must end, whatever the pool size
            if not self.sched.has_unfinished():
                break
            self.step(n % 7)
            self.blocks_are_accounted_for()
        assert not self.sched.has_unfinished()
        assert self.kv.num_used_blocks == 0
        event(f"requests: {min(len(self.seqs), 8)}{'+' if len(self.seqs) >= 8 else ''}")
        if self.sched.num_preemptions:
            event("preempted")
        if self.kv.prefix_cache_hits:
            event("prefix hit")
        for seq in self.seqs:
            assert seq.is_finished
            assert seq.finished_time is not None
            if seq.finish_reason is FinishReason.LENGTH:
                assert seq.num_output_tokens == seq.params.max_tokens
            if seq.finish_reason is FinishReason.STOP:
                assert seq.output_token_ids[-1] == EOS
                assert not seq.params.ignore_eos


class ContiguousMachine(SchedulerMachine):
    """The same machine over the contiguous-reservation baseline."""

    contiguous = True


PROPERTY_SETTINGS = settings(
    max_examples=200,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

TestPagedScheduler = SchedulerMachine.TestCase
TestPagedScheduler.settings = PROPERTY_SETTINGS
TestContiguousScheduler = ContiguousMachine.TestCase
TestContiguousScheduler.settings = PROPERTY_SETTINGS
