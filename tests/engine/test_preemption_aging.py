"""A long-running background request stops being preemptible for new arrivals as it ages."""

from __future__ import annotations

from paged_llm.engine.config import SchedulerConfig
from paged_llm.engine.kv_cache_manager import KVCacheManager
from paged_llm.engine.scheduler import Scheduler
from paged_llm.engine.sequence import Priority, SamplingParams, Sequence


def make(now: list[float]) -> Scheduler:
    config = SchedulerConfig(
        max_num_seqs=8, max_num_batched_tokens=512, max_model_len=256, aging_seconds=10.0
    )
    return Scheduler(config, KVCacheManager(16, 16), clock=lambda: now[0])


def seq(rid: str, n: int, prio: Priority, t: float) -> Sequence:
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    # Tokens unique to the request, so no prefix is shared and blocks really run out.
    base = 1000 * (1 + ["summary", "voice-1", "summary-2", "voice-2"].index(rid))
    return Sequence(rid, list(range(base, base + n)), params, prio, t)


def step(s: Scheduler) -> None:
    out = s.schedule()
    s.update(out, {c.seq.request_id: 7 for c in out.chunks if c.samples})


def test_fresh_background_gives_way_but_an_aged_one_keeps_its_blocks() -> None:
    now = [0.0]
    s = make(now)
    summary = seq("summary", 200, Priority.BACKGROUND, 0.0)  # 13 of the 16 blocks
    s.add(summary)
    step(s)
    # A voice query needing 5 blocks arrives at once: the fresh summary is preempted.
    s.add(seq("voice-1", 70, Priority.INTERACTIVE, 0.0))
    step(s)
    assert s.num_preemptions == 1
    assert s.get("summary").status.value == "preempted"
    while s.has_unfinished():
        step(s)

    now[0] = 100.0
    s.add(seq("summary-2", 200, Priority.BACKGROUND, 100.0))
    step(s)
    now[0] = 125.0  # the summary has been in the system for 2.5 aging periods
    s.add(seq("voice-2", 70, Priority.INTERACTIVE, 125.0))
    step(s)
    assert s.num_preemptions == 1, "an aged summary must not be preempted by a new arrival"
    assert s.get("voice-2").status.value == "waiting"
    while s.has_unfinished():
        step(s)
    assert s.kv_manager.num_used_blocks == 0
