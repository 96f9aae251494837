"""Voice never waits behind background work for memory, and no preemption storm follows."""

from __future__ import annotations

import pytest

from paged_llm.engine.config import SchedulerConfig
from paged_llm.engine.core.kv.paged import KVCacheManager
from paged_llm.engine.core.scheduler import Scheduler
from paged_llm.engine.core.sequence import Priority, SamplingParams, Sequence
from paged_llm.engine.errors import RequestRejected


def make(now: list[float], reserve: float, num_blocks: int = 16) -> Scheduler:
    config = SchedulerConfig(
        max_num_seqs=8,
        max_num_batched_tokens=512,
        max_model_len=256,
        aging_seconds=10.0,
        interactive_kv_reserve=reserve,
    )
    return Scheduler(config, KVCacheManager(num_blocks, 16), clock=lambda: now[0])


def seq(rid: str, n: int, prio: Priority, t: float, max_tokens: int = 8) -> Sequence:
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    # Tokens unique to the request, so no prefix is shared and blocks really run out.
    base = 1000 * (1 + sum(map(ord, rid)))
    return Sequence(rid, list(range(base, base + n)), params, prio, t)


def step(s: Scheduler) -> list[str]:
    out = s.schedule()
    s.update(out, {c.seq.request_id: 7 for c in out.chunks if c.samples})
    return [c.seq.request_id for c in out.chunks]


def test_aged_background_still_gives_way_to_voice_for_memory() -> None:
    """Without a reserve, voice preempts a summary of a lower base class, however old."""
    now = [0.0]
    s = make(now, reserve=0.0)
    s.add(seq("summary", 200, Priority.BACKGROUND, 0.0))  # 13 of the 16 blocks
    step(s)
    now[0] = 125.0  # the summary has been in the system for 12.5 aging periods
    s.add(seq("voice", 70, Priority.INTERACTIVE, 125.0))
    assert "voice" in step(s)
    assert s.num_preemptions == 1
    assert s.get("summary").status.value == "preempted"
    while s.has_unfinished():
        step(s)
    assert s.kv_manager.num_used_blocks == 0


def test_reserve_admits_every_voice_query_at_once_without_preempting() -> None:
    """Background fills all it may; voice queries keep arriving; none waits, none preempts."""
    now = [0.0]
    s = make(now, reserve=0.25, num_blocks=64)  # 16 blocks only voice may use
    for n in range(4):  # 12 blocks each at their longest: 4 fit in the 48 others may use
        s.add(seq(f"summary-{n}", 180, Priority.BACKGROUND, 0.0, max_tokens=12))
    while s.num_waiting:
        step(s)
    assert s.num_running == 4
    assert s.kv_manager.num_free_blocks == 16  # all others may use is in use
    for n in range(12):
        now[0] += 1.0
        s.add(seq(f"voice-{n}", 100, Priority.INTERACTIVE, now[0], max_tokens=4))
        scheduled = step(s)
        assert f"voice-{n}" in scheduled, "voice waited for memory"
        assert s.num_waiting_by_class()[Priority.INTERACTIVE] == 0
        while any(q.priority is Priority.INTERACTIVE for q in s.running):
            step(s)
    assert s.num_preemptions == 0
    while s.has_unfinished():
        step(s)
    assert s.kv_manager.num_used_blocks == 0


def test_background_that_outgrows_its_share_preempts_its_own_class_not_voice() -> None:
    now = [0.0]
    s = make(now, reserve=0.25)  # 4 of 16 blocks kept for voice
    summary = seq("summary", 150, Priority.BACKGROUND, 0.0, max_tokens=40)  # 10 -> 12 blocks
    voice = seq("voice", 40, Priority.INTERACTIVE, 0.0, max_tokens=80)  # 3 -> 8 blocks
    s.add(summary)
    step(s)
    s.add(voice)
    while s.has_unfinished():
        step(s)
        held = sum(len(s.kv_manager.block_table(q)) for q in s.running if q.priority)
        assert held <= 12
    # 12 + 8 blocks do not fit in 16: the summary gave way to itself, never the voice query.
    assert voice.num_preemptions == 0
    assert summary.num_preemptions >= 1
    assert voice.finish_reason == summary.finish_reason == "length"


def test_background_too_large_for_its_share_is_rejected_naming_the_reserve() -> None:
    now = [0.0]
    s = make(now, reserve=0.25)
    with pytest.raises(RequestRejected, match="kept for interactive") as err:
        s.add(seq("summary", 200, Priority.BACKGROUND, 0.0))  # 13 blocks > 12
    assert err.value.code == "exceeds_kv_pool"
    s.add(seq("voice", 200, Priority.INTERACTIVE, 0.0))  # the whole pool is voice's
