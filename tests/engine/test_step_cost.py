"""Latency-aware steps: the cost model learns step times online; chunks fit the time budget."""

from __future__ import annotations

import itertools
import random

import pytest

from paged_llm.engine.config import SchedulerConfig
from paged_llm.engine.core.kv.paged import KVCacheManager
from paged_llm.engine.core.scheduler import LONGEST_STEP_SECONDS, Scheduler
from paged_llm.engine.core.sequence import Priority, SamplingParams, Sequence
from paged_llm.engine.core.step_cost import ATTENTION_UNIT, StepCostModel, StepShape

# The "true" cost of a step: 5 ms, 0.2 ms a token, 0.5 ms a sequence, attention work.
TRUE = (0.005, 0.0002, 0.0005, 0.001)


def true_cost(shape: StepShape) -> float:
    base, tok, seq, att = TRUE
    return (
        base
        + tok * shape.num_tokens
        + seq * shape.num_seqs
        + att * shape.attention / ATTENTION_UNIT
    )


def test_the_model_learns_step_times_from_measured_steps() -> None:
    model = StepCostModel()
    rng = random.Random(0)
    assert not model.ready
    for _ in range(300):
        shape = StepShape()
        for _ in range(rng.randint(1, 20)):
            shape.add(rng.randint(0, 2000), rng.choice([1, 1, 1, rng.randint(2, 256)]))
        model.observe(shape, true_cost(shape))
    assert model.ready
    assert model.coefficients == pytest.approx(TRUE, rel=0.05)
    probe = StepShape()
    probe.add(100, 200)
    probe.add(500, 1)
    assert model.predict(probe) == pytest.approx(true_cost(probe), rel=0.02)
    # The largest chunk that keeps the step within 100 ms: one token more breaks it.
    n = model.max_chunk(probe, 1000, 0.100)
    assert n > 0

    def with_chunk(size: int) -> StepShape:
        shape = StepShape(probe.num_tokens, probe.num_seqs, probe.attention)
        shape.add(1000, size)
        return shape

    assert model.predict(with_chunk(n)) <= 0.100 < model.predict(with_chunk(n + 1))
    assert model.max_chunk(probe, 0, 0.001) == 0  # already over the budget


def test_bad_measurements_are_ignored() -> None:
    model = StepCostModel()
    model.observe(StepShape(10, 1, 100), float("nan"))
    model.observe(StepShape(10, 1, 100), -1.0)
    model.observe(StepShape(), 1.0)  # an empty step says nothing
    assert model.num_observations == 0


class StepTimer:
    """A step timer: each step "takes" the true cost of what the scheduler fed."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make(policy: str) -> tuple[Scheduler, StepTimer]:
    config = SchedulerConfig(
        max_num_seqs=16,
        max_num_batched_tokens=512,
        max_model_len=8192,
        interactive_kv_reserve=0.1,
        step_policy=policy,  # type: ignore[arg-type]
        interactive_step_seconds=0.05,
    )
    timer = StepTimer()
    # Steps "take" their cost on one clock: the scheduler's time moves with them.
    return Scheduler(config, KVCacheManager(1024, 16), clock=timer, timer=timer), timer


def run_step(
    sched: Scheduler, timer: StepTimer, scale: float = 1.0
) -> tuple[list[tuple[str, int]], float]:
    out = sched.schedule()
    shape = StepShape()
    for c in out.chunks:
        shape.add(c.start, c.num_tokens)
    cost = scale * true_cost(shape)
    timer.now += cost
    sched.update(out, {c.seq.request_id: 7 for c in out.chunks if c.samples})
    return [(c.seq.request_id, c.num_tokens) for c in out.chunks], cost


def seq(rid: str, n: int, prio: Priority, max_tokens: int) -> Sequence:
    base = 100 * sum(map(ord, rid))
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    return Sequence(rid, list(range(base, base + n)), params, prio, 0.0)


@pytest.mark.parametrize("policy", ["latency", "fixed"])
def test_background_prefill_fits_the_time_budget_only_while_voice_runs(policy: str) -> None:
    sched, timer = make(policy)
    sched.add(seq("doc", 8000, Priority.BACKGROUND, 4))
    full = []
    for _ in range(5):  # no interactive work: the whole token budget, learning meanwhile
        chunks, _ = run_step(sched, timer)
        full.append(chunks)
    assert all(chunks == [("doc", 512)] for chunks in full)
    sched.add(seq("voice", 40, Priority.INTERACTIVE, 30))
    costs, doc_chunks = [], []
    while sched.get("voice") is not None:
        chunks, cost = run_step(sched, timer)
        costs.append(cost)
        doc_chunks += [n for rid, n in chunks if rid == "doc"]
    if policy == "fixed":
        assert max(costs) > 0.05  # steps with voice in them carry a full prefill
    else:
        # Every step with voice fits the budget (the model learned it within the first
        # steps), and the summary moved on in every step but the voice's prefill.
        assert max(costs[3:]) <= 0.05 * 1.02
        assert all(0 < n < 512 for n in doc_chunks)
        # Voice done: the budget holds a while for the conversation's next question ...
        chunks, cost = run_step(sched, timer)
        assert chunks[0][1] < 512
        assert cost <= 0.05 * 1.02
        # ... then the steps grow back with the quiet, to the full token budget.
        timer.now += sched.config.interactive_hold_seconds
        chunks, _ = run_step(sched, timer)
        assert chunks[0][1] < 512
        timer.now += 30.0
        chunks, _ = run_step(sched, timer)
        assert chunks == [("doc", 512)]


def train(sched: Scheduler, timer: StepTimer) -> None:
    """Let the cost model learn from a background document read to its end."""
    sched.add(seq("warm", 6000, Priority.BACKGROUND, 1))
    while sched.get("warm") is not None:
        run_step(sched, timer)
    assert sched.cost_model.ready


def automation_running(policy: str) -> tuple[Scheduler, StepTimer]:
    """A trained scheduler with one automation request decoding."""
    sched, timer = make(policy)
    train(sched, timer)
    sched.add(seq("auto", 30, Priority.AUTOMATION, 200))
    run_step(sched, timer)
    return sched, timer


def test_a_step_with_voice_prefill_is_the_voices_alone() -> None:
    sched, timer = make("latency")
    train(sched, timer)
    sched.add(seq("doc", 4000, Priority.BACKGROUND, 50))
    sched.add(seq("auto", 30, Priority.AUTOMATION, 50))
    sched.add(seq("chat", 20, Priority.INTERACTIVE, 50))
    for _ in range(3):
        run_step(sched, timer)
    assert moved(sched, timer, 20) == {"doc", "auto", "chat"}  # all three move on
    sched.add(seq("voice", 40, Priority.INTERACTIVE, 30))
    # The voice's prefill step: the other voice decodes with it, nothing else runs.
    chunks, _ = run_step(sched, timer)
    assert chunks == [("chat", 1), ("voice", 40)]
    # Prefill done: the others come back within the voices' share of the next steps.
    assert moved(sched, timer, 20) == {"doc", "auto", "chat", "voice"}


def moved(sched: Scheduler, timer: StepTimer, steps: int) -> set[str]:
    """Who had a chunk in the next ``steps`` steps."""
    return {rid for _ in range(steps) for rid, _ in run_step(sched, timer)[0]}


def test_a_voice_answer_decodes_near_its_idle_step_time_while_a_document_is_read() -> None:
    """Other work shares a decoding voice's steps only within interactive_slowdown."""
    sched, timer = make("latency")
    train(sched, timer)
    for i in range(6):  # summary parts that decode
        sched.add(seq(f"part-{i}", 300, Priority.BACKGROUND, 1000))
    sched.add(seq("auto", 200, Priority.AUTOMATION, 1000))
    sched.add(seq("doc", 8000, Priority.BACKGROUND, 4))
    for _ in range(6):
        run_step(sched, timer)
    sched.add(seq("voice", 40, Priority.INTERACTIVE, 300))
    run_step(sched, timer)  # the voice's prefill, alone
    costs: list[float] = []
    alone: list[float] = []
    tokens = dict.fromkeys(["doc", "auto", *(f"part-{i}" for i in range(6))], 0)
    doc_before = sched.get("doc").num_computed_tokens  # type: ignore[union-attr]
    while sched.get("voice") is not None:
        context = sched.get("voice").num_tokens  # type: ignore[union-attr]
        chunks, cost = run_step(sched, timer)
        costs.append(cost)
        only = StepShape()
        only.add(context - 1, 1)
        alone.append(true_cost(only))
        for rid, n in chunks:
            if rid in tokens:
                tokens[rid] += n
    # The voice's time per output token: within the slowdown of its steps alone (the last
    # chunk's overdraw spread over 300 tokens adds a little).
    slowdown = sched.config.interactive_slowdown
    assert sum(costs) <= slowdown * sum(alone) * 1.03
    assert max(costs) < sched.config.interactive_step_seconds  # no step of a full budget
    # Everyone else moved on meanwhile: the document's prompt and every decode.
    assert sched.get("doc").num_computed_tokens > doc_before  # type: ignore[union-attr]
    assert min(tokens.values()) >= 10, tokens
    # Voice done, the hold over and a long quiet after: the whole token budget again.
    timer.now += sched.config.interactive_hold_seconds + 30.0
    chunks, _ = run_step(sched, timer)
    assert dict(chunks)["doc"] > 256


def test_a_long_voice_prompt_lets_the_others_run_every_other_step() -> None:
    sched, timer = automation_running("latency")
    sched.add(seq("voice", 3000, Priority.INTERACTIVE, 5))
    steps = []
    while sched.get("voice").num_computed_tokens < 3000:  # type: ignore[union-attr]
        chunks, cost = run_step(sched, timer)
        assert cost > 0.05  # each chunk of the prompt outlasts the budget alone
        steps.append({rid for rid, _ in chunks})
    assert len(steps) >= 6
    assert steps[0] == {"voice"}  # the voice's first chunk is its own step ...
    # ... but a prompt this long does not hold the automation's answer up: it decodes in
    # every other step.
    assert all("auto" in a or "auto" in b for a, b in itertools.pairwise(steps))


def test_a_stream_of_voice_queries_cannot_stall_the_others() -> None:
    sched, timer = automation_running("latency")
    ran_at = [timer.now]
    for i in range(40):  # a voice query arrives before every step
        sched.add(seq(f"voice-{i}", 40, Priority.INTERACTIVE, 2))
        chunks, _ = run_step(sched, timer)
        if any(rid == "auto" for rid, _ in chunks):
            ran_at.append(timer.now)
    budget = sched.config.interactive_step_seconds
    longest = max(b - a for a, b in itertools.pairwise(ran_at))
    # Focus steps in a row last one budget, then everyone runs one step.
    assert len(ran_at) > 5
    assert longest <= 2 * budget


def test_an_automation_starts_beside_an_aged_summary_prefill_under_the_budget() -> None:
    sched, timer = make("latency")
    train(sched, timer)
    sched.add(seq("doc", 8000, Priority.BACKGROUND, 4))
    sched.add(seq("chat", 20, Priority.INTERACTIVE, 500))  # keeps the time budget on
    for _ in range(3):
        run_step(sched, timer)
    timer.now += 2 * sched.config.aging_seconds  # the summary now ranks with automations
    sched.add(seq("auto", 300, Priority.AUTOMATION, 20))
    # The summary comes first, yet the automation starts within the voice's share of the
    # next steps, and its prompt is read to the end while the summary keeps moving.
    doc = sched.get("doc")
    assert doc is not None
    before = doc.num_computed_tokens
    for _ in range(400):
        run_step(sched, timer)
        if sched.get("auto").num_output_tokens > 0:  # type: ignore[union-attr]
            break
    assert sched.get("auto").num_output_tokens > 0  # type: ignore[union-attr]
    assert doc.num_computed_tokens > before


def test_voice_elsewhere_or_announced_keeps_steps_within_the_budget_for_the_hold() -> None:
    """Voice on another engine, or a satellite that heard its wake word, holds the budget."""
    sched, timer = make("latency")
    train(sched, timer)
    sched.add(seq("doc", 8000, Priority.BACKGROUND, 4))
    chunks, _ = run_step(sched, timer)
    assert chunks == [("doc", 512)]  # no voice anywhere: the whole token budget
    assert not sched.step_budget_held()
    sched.hold_step_budget()
    assert sched.step_budget_held()
    for _ in range(3):  # the query is still being spoken: every step stays short
        chunks, cost = run_step(sched, timer)
        assert 0 < chunks[0][1] < 512
        assert cost <= 0.05 * 1.02
    timer.now += sched.config.interactive_hold_seconds + 0.1  # no voice came after all
    assert not sched.step_budget_held()
    grown = [run_step(sched, timer)[0][0][1] for _ in range(3)]
    assert grown == sorted(grown)  # growing back with the quiet ...
    assert grown[0] < 512
    timer.now += 30.0
    chunks, _ = run_step(sched, timer)
    assert chunks == [("doc", 512)]  # ... to the whole token budget


@pytest.mark.parametrize("policy", ["latency", "fixed"])
def test_no_step_outlasts_the_longest_step_when_a_step_of_the_token_budget_is_slow(
    policy: str,
) -> None:
    """A big model on a few cores: 512 tokens take ~10 s, so an unannounced voice waits."""
    sched, timer = make(policy)
    sched.add(seq("doc", 8000, Priority.BACKGROUND, 4))
    # Every step costs 50 times the usual.
    costs = [run_step(sched, timer, scale=50.0)[1] for _ in range(30)]
    if policy == "fixed":
        assert min(costs[:10]) > 5.0  # every step of the token budget
    else:
        # Once the cost model learned (8 steps), each step fits the longest step's time.
        assert max(costs[10:]) <= LONGEST_STEP_SECONDS * 1.02
        assert min(costs[10:]) > LONGEST_STEP_SECONDS * 0.8  # and uses it


def test_the_fixed_policy_ignores_an_announced_voice() -> None:
    sched, timer = make("fixed")
    train(sched, timer)
    sched.add(seq("doc", 8000, Priority.BACKGROUND, 4))
    sched.hold_step_budget()
    assert not sched.step_budget_held()
    chunks, _ = run_step(sched, timer)
    assert chunks == [("doc", 512)]


def test_fixed_policy_steps_run_everyone_with_voice() -> None:
    sched, timer = automation_running("fixed")
    sched.add(seq("voice", 40, Priority.INTERACTIVE, 30))
    chunks, _ = run_step(sched, timer)
    assert chunks == [("auto", 1), ("voice", 40)]


@pytest.mark.parametrize(("prompt", "low", "high"), [(40, 0.020, 0.025), (150, 0.035, 0.042)])
def test_the_budget_follows_the_voices_own_first_step(prompt: int, low: float, high: float) -> None:
    """A voice query arriving mid-step waits about as long as its own first step takes:
    the others' steps shrink to the measured focus step (0.014 s for 40 tokens, 0.041 s for
    150 here), never below half of interactive_step_seconds (0.05 s)."""
    sched, timer = make("latency")
    train(sched, timer)
    sched.add(seq("doc", 8000, Priority.BACKGROUND, 4))
    sched.add(seq("voice", prompt, Priority.INTERACTIVE, 30))
    chunks, focus = run_step(sched, timer)
    assert chunks == [("voice", prompt)]  # its own step, measured
    while sched.get("voice") is not None:
        run_step(sched, timer)
    costs = []
    for _ in range(5):  # the hold after the answer: steps of the budget
        chunks, cost = run_step(sched, timer)
        assert "doc" in dict(chunks)  # the summary keeps moving
        costs.append(cost)
    assert low < max(costs) <= high * 1.02
    assert max(costs) >= min(focus, 0.025) * 0.9


def test_a_waiting_automation_takes_a_seat_only_when_it_can_start() -> None:
    """With every seat taken and the voice's allowance spent, a waiting automation does not
    preempt a summary's sequence for a chunk it then cannot get."""
    sched, timer = make("latency")
    sched.config.max_num_seqs = 3
    train(sched, timer)
    sched.add(seq("part", 300, Priority.BACKGROUND, 1000))
    sched.add(seq("doc", 6000, Priority.BACKGROUND, 4))
    run_step(sched, timer)  # both started
    sched.add(seq("voice", 40, Priority.INTERACTIVE, 300))
    # Right after a step in which the document overdrew the voice's allowance ...
    while "doc" not in dict(run_step(sched, timer)[0]):
        pass
    assert sched.num_running == 3
    sched.add(seq("auto", 300, Priority.AUTOMATION, 20))
    for _ in range(200):
        before = sched.num_preemptions
        chunks, _ = run_step(sched, timer)
        started = "auto" in dict(chunks)
        # ... a summary sequence gives its seat up only in the step the automation starts.
        assert sched.num_preemptions == before + started
        if started:
            break
    assert started
