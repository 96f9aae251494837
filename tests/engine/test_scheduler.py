"""Scheduler scenarios: prefix sharing, preemption, priority, chunked prefill, admission, abort."""

from __future__ import annotations

import random

import pytest

from paged_llm.engine.config import SchedulerConfig
from paged_llm.engine.core.kv.block_pool import ROOT_HASH, hash_block
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
from paged_llm.engine.errors import InvalidSamplingParams, RequestRejected

INT, AUT, BG = Priority.INTERACTIVE, Priority.AUTOMATION, Priority.BACKGROUND


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def tokens(seed: str, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(10, 30000) for _ in range(n)]


def make_seq(
    rid: str,
    prompt: int | list[int],
    max_tokens: int = 4,
    priority: Priority = INT,
    **params: object,
) -> Sequence:
    ids = tokens(rid, prompt) if isinstance(prompt, int) else prompt
    return Sequence(rid, ids, SamplingParams(max_tokens=max_tokens, **params), priority, 0.0)  # type: ignore[arg-type]


def make_sched(
    num_blocks: int = 256,
    block_size: int = 16,
    clock: FakeClock | None = None,
    prefix: bool = True,
    **cfg: int | float,
) -> Scheduler:
    cfg.setdefault("interactive_kv_reserve", 0.0)  # tests of the reserve set it themselves
    config = SchedulerConfig(**cfg)  # type: ignore[arg-type]
    return Scheduler(config, KVCacheManager(num_blocks, block_size, prefix), clock or FakeClock())


def step(sched: Scheduler, token: int = 1) -> tuple[SchedulerOutput, list[Sequence]]:
    out = sched.schedule()
    sampled = {c.seq.request_id: token for c in out.chunks if c.samples}
    return out, sched.update(out, sampled)


def rows(sched: Scheduler, token: int = 1) -> list[tuple[str, int, int, bool]]:
    """Run a step; return (id, start, num_tokens, samples) per chunk as scheduled."""
    out = sched.schedule()
    shape = [(c.seq.request_id, c.start, c.num_tokens, c.samples) for c in out.chunks]
    sched.update(out, {rid: token for rid, _, _, samples in shape if samples})
    return shape


def run_to_end(sched: Scheduler, limit: int = 5000) -> list[Sequence]:
    done: list[Sequence] = []
    for i in range(limit):
        if not sched.has_unfinished():
            return done
        done += step(sched, token=100 + i)[1]
    raise AssertionError("scheduler did not drain")


def ids(out: SchedulerOutput) -> list[str]:
    return [c.seq.request_id for c in out.chunks]


# --- prefix sharing ---------------------------------------------------------------


def test_same_prefix_shares_blocks_and_second_computes_only_its_suffix() -> None:
    sched = make_sched(num_blocks=200, block_size=16, max_num_batched_tokens=2048)
    kv = sched.kv_manager
    assert isinstance(kv, KVCacheManager)
    prefix = tokens("system", 512)
    a = make_seq("a", prefix + tokens("sa", 20), max_tokens=8)
    b = make_seq("b", prefix + tokens("sb", 30), max_tokens=8)
    sched.add(a)
    out, _ = step(sched)
    assert [(c.start, c.num_tokens) for c in out.chunks] == [(0, 532)]
    sched.add(b)
    out = sched.schedule()
    chunk_b = next(c for c in out.chunks if c.seq is b)
    assert (chunk_b.start, chunk_b.num_tokens) == (512, 30)
    assert chunk_b.samples
    sched.update(out, {"a": 1, "b": 1})
    assert b.num_cached_tokens == 512
    ta, tb = kv.block_table(a), kv.block_table(b)
    assert ta[:32] == tb[:32]
    assert ta[32] != tb[32]
    assert all(kv.pool.ref_count(x) == 2 for x in ta[:32])
    assert kv.prefix_cache_hits == 512
    assert kv.prefix_cache_queries == 532 + 542
    assert sched.prompt_tokens_total == 532 + 30
    assert kv.num_used_blocks == len(set(ta) | set(tb))
    run_to_end(sched)
    assert kv.num_used_blocks == 0


def test_full_prompt_hit_still_computes_the_last_block() -> None:
    sched = make_sched(num_blocks=64, block_size=16)
    prompt = tokens("p", 64)
    sched.add(make_seq("a", prompt, max_tokens=1))
    run_to_end(sched)
    sched.add(make_seq("b", list(prompt), max_tokens=1))
    assert rows(sched) == [("b", 48, 16, True)]


def test_hit_on_an_evicted_block_is_a_miss_and_the_tail_goes_first() -> None:
    # 10 blocks of 4: A's 4 cached blocks, then C overwrites all but A's first block.
    sched = make_sched(num_blocks=10, block_size=4, max_num_batched_tokens=64)
    kv = sched.kv_manager
    assert isinstance(kv, KVCacheManager)
    prompt_a = tokens("a", 16)
    hashes_a = [hash_block(ROOT_HASH, prompt_a[:4])]
    for n in range(1, 4):
        hashes_a.append(hash_block(hashes_a[-1], prompt_a[4 * n : 4 * n + 4]))
    sched.add(make_seq("a", prompt_a, max_tokens=1))
    run_to_end(sched)
    table_a = [kv.pool.get_cached(h) for h in hashes_a]
    assert None not in table_a
    sched.add(make_seq("c", 36, max_tokens=1))
    step(sched)
    # A was freed tail first, so its first block is the last to go.
    assert kv.pool.get_cached(hashes_a[0]) == table_a[0]
    assert all(kv.pool.get_cached(h) is None for h in hashes_a[1:])
    d = make_seq("d", list(prompt_a), max_tokens=2)
    assert kv.get_computed_blocks(d).num_tokens == 4
    sched.add(d)
    out, _ = step(sched)
    assert [(c.start, c.num_tokens) for c in out.chunks] == [(4, 12)]
    assert kv.block_table(d)[0] == table_a[0]
    # Wipe everything cached: a new lookup finds nothing at all.
    run_to_end(sched)
    sched.add(make_seq("e", 39, max_tokens=1))
    run_to_end(sched)
    assert kv.get_computed_blocks(make_seq("f", list(prompt_a))).num_tokens == 0


# --- preemption -------------------------------------------------------------------


def test_lowest_class_is_preempted_first() -> None:
    sched = make_sched(num_blocks=6, block_size=4, max_num_batched_tokens=64)
    g, a, i = make_seq("g", 8, 8, BG), make_seq("a", 8, 8, AUT), make_seq("i", 8, 8, INT)
    for s in (g, a, i):
        sched.add(s)
    out, _ = step(sched)
    assert ids(out) == ["i", "a", "g"]
    out, _ = step(sched)
    # i and a ask for a block before g does, yet g is the one to go.
    assert out.preempted == [g]
    assert ids(out) == ["i", "a"]
    assert g.status is SequenceStatus.PREEMPTED
    assert g.num_computed_tokens == 0
    assert g.preempted_times == [0.0]
    assert sched.num_preemptions == 1
    assert sched.num_waiting_by_class()[BG] == 1


def test_most_recently_started_is_preempted_within_a_class() -> None:
    clock = FakeClock()
    sched = make_sched(num_blocks=5, block_size=4, clock=clock, max_num_batched_tokens=64)
    x, y = make_seq("x", 11, 8, AUT), make_seq("y", 6, 8, AUT)
    sched.add(x)
    step(sched)  # x: 3 blocks
    clock.now = 1.0
    sched.add(y)
    step(sched)  # y: 2 blocks, pool full
    out, _ = step(sched)  # x needs a fourth block
    # x (earlier in the batch) asked for a block first, yet y started later and goes.
    assert out.preempted == [y]
    assert ids(out) == ["x"]


@pytest.mark.parametrize("prefix", [True, False])
def test_preempted_request_resumes_with_all_its_tokens(prefix: bool) -> None:
    clock = FakeClock()
    # The fixed policy: recompute in one chunk, whatever the (real) step timer measures.
    sched = make_sched(
        num_blocks=8,
        block_size=4,
        clock=clock,
        prefix=prefix,
        max_num_batched_tokens=64,
        step_policy="fixed",
    )
    g = make_seq("g", 10, 12, BG)
    i = make_seq("i", 10, 12, INT)
    sched.add(g)
    step(sched, token=1)
    step(sched, token=2)
    clock.now = 1.0
    sched.add(i)
    recomputed = None
    for n in range(3, 100):
        preempted_before = g.num_preemptions
        shape = rows(sched, token=n)
        if preempted_before and recomputed is None:
            recomputed = next((r for r in shape if r[0] == "g"), None)
            recomputed_len = g.num_tokens - 1  # as fed: before this step's token
        if not sched.has_unfinished():
            break
    assert g.num_preemptions >= 1
    assert sched.num_preemptions == g.num_preemptions + i.num_preemptions
    assert g.finish_reason is FinishReason.LENGTH
    assert g.num_output_tokens == 12
    assert g.output_token_ids[:2] == [1, 2]
    assert recomputed is not None
    # The recompute feeds prompt plus every generated token, minus what the cache kept.
    _, start, count, samples = recomputed
    assert samples
    assert start + count == recomputed_len
    assert start % 4 == 0
    if not prefix:
        assert start == 0
    assert i.finish_reason is FinishReason.LENGTH
    assert i.num_output_tokens == 12
    assert sched.kv_manager.num_used_blocks == 0


def test_preemption_never_schedules_the_victim_in_the_same_step() -> None:
    sched = make_sched(num_blocks=5, block_size=4, max_num_batched_tokens=64)
    for n in range(3):
        sched.add(make_seq(f"s{n}", 6, 10, BG))
    for _ in range(50):
        out = sched.schedule()
        scheduled = {c.seq.request_id for c in out.chunks}
        assert not scheduled & {s.request_id for s in out.preempted}
        sched.update(out, {c.seq.request_id: 1 for c in out.chunks if c.samples})
        if not sched.has_unfinished():
            break
    assert not sched.has_unfinished()
    assert sched.num_preemptions > 0


def test_interactive_takes_a_seat_from_background_when_seats_are_full() -> None:
    sched = make_sched(max_num_seqs=2, max_num_batched_tokens=64)
    g1, g2 = make_seq("g1", 4, 20, BG), make_seq("g2", 4, 20, BG)
    sched.add(g1)
    sched.add(g2)
    step(sched)
    sched.add(make_seq("a", 4, 20, BG))
    out, _ = step(sched)
    assert ids(out) == ["g1", "g2"]  # same class: waits for a seat
    sched.add(make_seq("i", 4, 20, INT))
    out, _ = step(sched)
    assert out.preempted == [g2]
    assert ids(out) == ["g1", "i"]
    assert sched.num_running == 2


# --- priority and aging -----------------------------------------------------------


def test_interactive_arrival_runs_in_the_next_step_before_background_prefill() -> None:
    sched = make_sched(num_blocks=512, max_num_batched_tokens=64)
    sched.add(make_seq("g1", 1000, 4, BG))
    sched.add(make_seq("g2", 1000, 4, BG))
    out, _ = step(sched)
    assert out.num_batched_tokens == 64
    sched.add(make_seq("i", 10, 4, INT))
    out, _ = step(sched)
    assert ids(out)[0] == "i"
    assert [(c.start, c.num_tokens) for c in out.chunks] == [(0, 10), (64, 54)]
    out, _ = step(sched)
    assert ids(out) == ["i", "g1"]  # i decodes first, g1 gets the rest


def test_background_is_scheduled_within_the_aging_bound_under_endless_automation_load() -> None:
    clock = FakeClock()
    aging = 2.0
    sched = make_sched(clock=clock, max_num_batched_tokens=32, aging_seconds=aging)
    bg = make_seq("bg", 32, 1, BG)
    sched.add(bg)
    scheduled_at = None
    for n in range(40):
        sched.add(make_seq(f"a{n}", 32, 1, AUT))  # fills the whole budget every step
        out, _ = step(sched)
        if any(c.seq is bg for c in out.chunks):
            scheduled_at = clock.now
            break
        assert ids(out) == [f"a{n}"]
        clock.now += 0.5
    # Background reaches the automation class after one aging period, then wins on arrival.
    assert scheduled_at == aging


def test_aged_work_never_goes_before_an_interactive_request() -> None:
    clock = FakeClock()
    sched = make_sched(clock=clock, max_num_batched_tokens=32, max_num_seqs=1, aging_seconds=1.0)
    sched.add(make_seq("bg", 32, 1, BG))
    sched.add(make_seq("a", 32, 1, AUT))
    clock.now = 100.0  # both aged far past every class boundary
    sched.add(make_seq("i", 32, 1, INT))
    out, _ = step(sched)
    assert ids(out) == ["i"]
    out, _ = step(sched)
    assert ids(out) == ["bg"]  # aged to automation, and it came before a


def summary_waiting_for_memory(clock: FakeClock) -> Scheduler:
    """One summary holds 10 of 16 blocks; a second (8 blocks) waits for memory since t=0."""
    sched = make_sched(num_blocks=16, clock=clock, aging_seconds=10.0)
    sched.add(make_seq("summary-1", 160, 60, BG))
    step(sched)
    sched.add(make_seq("summary-2", 120, 4, BG))
    return sched


def test_an_automation_passes_an_aged_summary_that_waits_for_memory() -> None:
    clock = FakeClock()
    sched = summary_waiting_for_memory(clock)
    clock.now = 15.0  # summary-2 has aged to the automation class, ahead of newer ones
    sched.add(make_seq("a", 40, 4, AUT))
    sched.add(make_seq("g", 20, 4, BG))  # fits too, but the same class does not pass
    out, _ = step(sched)
    assert ids(out) == ["summary-1", "a"]
    assert sched.get("summary-2").status is SequenceStatus.WAITING
    assert out.preempted == []


def test_passing_a_summary_that_waits_for_memory_ends_after_three_aging_periods() -> None:
    clock = FakeClock()
    sched = summary_waiting_for_memory(clock)
    clock.now = 30.0
    sched.add(make_seq("a", 40, 4, AUT))
    out, _ = step(sched)
    assert ids(out) == ["summary-1"]  # now the automation waits its turn
    first_step: dict[str, int] = {}
    for n in range(200):
        out, _ = step(sched)
        for rid in ids(out):
            first_step.setdefault(rid, n)
        if not sched.has_unfinished():
            break
    assert first_step["summary-2"] <= first_step["a"]


# --- chunked prefill --------------------------------------------------------------


def test_long_prompt_is_prefilled_in_chunks_while_every_sequence_decodes() -> None:
    sched = make_sched(num_blocks=512, block_size=16, max_num_batched_tokens=64)
    decoders = [make_seq(f"d{n}", 8, 100) for n in range(4)]
    for d in decoders:
        sched.add(d)
    step(sched)
    long = make_seq("long", 256, 4, BG)
    sched.add(long)
    prefill_steps = 0
    expected_start = 0
    while long.num_output_tokens == 0:
        shape = rows(sched)
        # Every decoder decodes, ahead of the prefill chunk.
        assert [(r[2], r[3]) for r in shape[:4]] == [(1, True)] * 4
        assert {r[0] for r in shape[:4]} == {d.request_id for d in decoders}
        ((rid, start, count, _),) = shape[4:]
        assert rid == "long"
        assert start == expected_start
        expected_start += count
        assert sum(r[2] for r in shape) <= 64
        prefill_steps += 1
    assert prefill_steps >= 4
    assert expected_start == 256


# --- admission control and parameters ---------------------------------------------


def test_context_too_long_is_rejected_with_the_numbers() -> None:
    sched = make_sched(num_blocks=4096, max_model_len=2048)
    with pytest.raises(RequestRejected) as err:
        sched.add(make_seq("x", 4000, 1000))
    assert err.value.code == "context_too_long"
    assert str(err.value) == (
        "request needs 5000 tokens (prompt 4000 + max_tokens 1000) "
        "but the model's context is 2048 tokens"
    )


def test_request_larger_than_the_pool_is_rejected_with_blocks_and_tokens() -> None:
    sched = make_sched(num_blocks=10, block_size=16, max_model_len=2048)
    with pytest.raises(RequestRejected) as err:
        sched.add(make_seq("x", 150, 20))
    assert err.value.code == "exceeds_kv_pool"
    msg = str(err.value)
    assert "11 KV blocks (176 tokens" in msg
    assert "10 blocks (160 tokens)" in msg


def test_full_queue_rejects_and_the_others_still_complete() -> None:
    sched = make_sched(max_waiting=3)
    for n in range(3):
        sched.add(make_seq(f"r{n}", 5, 3))
    with pytest.raises(RequestRejected) as err:
        sched.add(make_seq("late", 5, 3))
    assert err.value.code == "queue_full"
    assert str(err.value) == "waiting queue is full (3 requests); try again later"
    done = run_to_end(sched)
    assert sorted(s.request_id for s in done) == ["r0", "r1", "r2"]
    assert all(s.finish_reason is FinishReason.LENGTH for s in done)


def test_rejections_leave_other_requests_untouched() -> None:
    sched = make_sched(num_blocks=32, block_size=16, max_model_len=1024, max_num_batched_tokens=64)
    ok = make_seq("ok", 20, 5)
    sched.add(ok)
    step(sched)
    for bad in (make_seq("long", 1000, 100), make_seq("huge", 600, 10), make_seq("ok", 3, 1)):
        with pytest.raises(RequestRejected):
            sched.add(bad)
    assert sched.num_running == 1
    assert sched.num_waiting == 0
    run_to_end(sched)
    assert ok.finish_reason is FinishReason.LENGTH
    assert ok.num_output_tokens == 5


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"temperature": -0.5}, "temperature must be >= 0, got -0.5"),
        ({"temperature": float("nan")}, "temperature must be >= 0"),
        ({"temperature": "hot"}, "temperature must be a number"),
        ({"top_p": 0.0}, "top_p must be in (0, 1], got 0.0"),
        ({"top_p": 1.5}, "top_p must be in (0, 1], got 1.5"),
        ({"top_k": -1}, "top_k must be an integer >= 0, got -1"),
        (
            {"max_tokens": 0},
            "max_tokens must be an integer >= 1 (0 only with prompt_logprobs), got 0",
        ),
        ({"stop": "END"}, "stop must be a sequence of non-empty strings"),
        ({"stop": ("ok", "")}, "stop must be a sequence of non-empty strings"),
        ({"seed": 1.5}, "seed must be an integer or None, got 1.5"),
        ({"seed": True}, "seed must be an integer or None, got True"),
        ({"stop_token_ids": (-1,)}, "stop_token_ids must be non-negative integers"),
    ],
)
def test_each_invalid_sampling_parameter_has_its_own_message(
    params: dict[str, object], message: str
) -> None:
    sched = make_sched()
    other = make_seq("other", 6, 3)
    sched.add(other)
    step(sched)
    with pytest.raises(InvalidSamplingParams) as err:
        SamplingParams(**params)  # type: ignore[arg-type]
    assert message in str(err.value)
    assert err.value.code == "invalid_sampling_params"
    run_to_end(sched)
    assert other.finish_reason is FinishReason.LENGTH


def test_empty_prompt_and_duplicate_id_are_refused() -> None:
    with pytest.raises(InvalidSamplingParams, match="prompt is empty"):
        Sequence("e", [], SamplingParams(), INT, 0.0)
    sched = make_sched()
    sched.add(make_seq("dup", 4))
    with pytest.raises(RequestRejected) as err:
        sched.add(make_seq("dup", 4))
    assert err.value.code == "duplicate_request"


# --- stopping ---------------------------------------------------------------------


def test_stop_token_eos_ignore_eos_and_length() -> None:
    sched = make_sched()
    stop = make_seq("stop", 4, 10, stop_token_ids=(7,))
    eos = make_seq("eos", 4, 10)
    eos.extra_stop_token_ids = (7,)
    ignore = make_seq("ignore", 4, 3, ignore_eos=True)
    ignore.extra_stop_token_ids = (7,)
    for s in (stop, eos, ignore):
        sched.add(s)
    _, done = step(sched, token=7)
    assert {s.request_id for s in done} == {"stop", "eos"}
    assert stop.finish_reason is eos.finish_reason is FinishReason.STOP
    assert stop.first_token_time == 0.0
    assert sched.generation_tokens_total == 3
    run_to_end(sched)
    assert ignore.finish_reason is FinishReason.LENGTH
    assert ignore.output_token_ids == [7, 100, 101]


def test_engine_finish_frees_blocks() -> None:
    sched = make_sched()
    s = make_seq("s", 40, 10)
    sched.add(s)
    step(sched)
    sched.finish(s, FinishReason.ERROR)
    assert s.status is SequenceStatus.FINISHED
    assert s.finish_reason is FinishReason.ERROR
    assert sched.kv_manager.num_used_blocks == 0
    assert not sched.has_unfinished()
    sched.finish(s, FinishReason.STOP)  # already finished: no change
    assert s.finish_reason is FinishReason.ERROR


# --- abort --------------------------------------------------------------------------


def test_abort_in_every_state_frees_everything() -> None:
    clock = FakeClock()
    sched = make_sched(
        num_blocks=12, block_size=4, clock=clock, max_num_seqs=2, max_num_batched_tokens=8
    )
    decoding = make_seq("decoding", 4, 30, INT)
    prefilling = make_seq("prefilling", 20, 4, AUT)
    victim = make_seq("victim", 4, 30, BG)
    waiting = make_seq("waiting", 4, 4, BG)
    sched.add(decoding)
    sched.add(victim)
    step(sched)
    clock.now = 1.0
    sched.add(prefilling)  # takes the background sequence's seat
    out, _ = step(sched)
    assert out.preempted == [victim]
    sched.add(waiting)  # no seat, no better class: waits
    step(sched)
    assert victim.status is SequenceStatus.PREEMPTED
    assert waiting.status is SequenceStatus.WAITING
    assert decoding.num_tokens - decoding.num_computed_tokens == 1
    assert prefilling.status is SequenceStatus.RUNNING
    assert prefilling.num_tokens - prefilling.num_computed_tokens > 1
    clock.now = 2.0
    for s in (waiting, prefilling, decoding, victim):
        assert sched.abort(s.request_id) is s
        assert s.status is SequenceStatus.FINISHED
        assert s.finish_reason is FinishReason.ABORT
        assert s.finished_time == 2.0
        assert sched.abort(s.request_id) is None
    assert sched.kv_manager.num_used_blocks == 0
    assert sched.num_running == sched.num_waiting == 0
    assert not sched.has_unfinished()
    assert sched.abort("nobody") is None


def test_abort_between_schedule_and_update_is_skipped() -> None:
    sched = make_sched()
    a, b = make_seq("a", 8, 3), make_seq("b", 8, 3)
    sched.add(a)
    sched.add(b)
    out = sched.schedule()
    sched.abort("a")
    done = sched.update(out, {"a": 5, "b": 5})
    assert done == []
    assert a.output_token_ids == []
    assert b.output_token_ids == [5]
    run_to_end(sched)
    assert sched.kv_manager.num_used_blocks == 0


def test_a_sampling_chunk_without_a_token_is_fed_again() -> None:
    sched = make_sched()
    s = make_seq("s", 8, 2)
    sched.add(s)
    out = sched.schedule()
    assert sched.update(out, {}) == []
    assert (s.num_computed_tokens, s.num_tokens) == (7, 8)
    assert rows(sched) == [("s", 7, 1, True)]
    run_to_end(sched)
    assert s.num_output_tokens == 2


# --- limits and the contiguous baseline -------------------------------------------


def test_max_num_seqs_and_budget_are_respected() -> None:
    sched = make_sched(max_num_seqs=3, max_num_batched_tokens=20)
    for n in range(8):
        sched.add(make_seq(f"r{n}", 9, 5))
    while sched.has_unfinished():
        out, _ = step(sched)
        assert sched.num_running <= 3
        assert out.num_batched_tokens == sum(c.num_tokens for c in out.chunks) <= 20


def test_contiguous_reservation_admits_fewer_sequences_than_pages() -> None:
    def peak(kv: KVCacheManager | ContiguousKVCacheManager) -> int:
        sched = Scheduler(SchedulerConfig(max_num_batched_tokens=256, max_model_len=512), kv)
        for n in range(12):
            sched.add(make_seq(f"r{n}", 16, 200))
        most = 0
        while sched.has_unfinished():
            step(sched)
            most = max(most, sched.num_running)
        assert kv.num_used_blocks == 0
        return most

    paged = peak(KVCacheManager(64, 16))
    contiguous = peak(ContiguousKVCacheManager(64, 16, max_model_len=512))
    # 216 tokens reserve 14 blocks each: 4 fit; pages grow with the real length.
    assert contiguous == 4
    assert paged > contiguous
