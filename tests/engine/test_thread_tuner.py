"""The thread tuner against simulated steps: quiet machines, a busy core, shapes that change."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from paged_llm.engine.model.thread_tuner import FIRST_WAIT, LONGEST_WAIT, PROBE_STEPS, ThreadTuner

# Seconds a decode step of one sequence takes on n threads (a 2-core box, bundled model).
QUIET = {1: 1 / 75, 2: 1 / 113}
BUSY = {1: 1 / 75, 2: 1 / 30}


def run(
    tuner: ThreadTuner,
    steps: int,
    seconds: Callable[[int, int], float],
    shape: Callable[[int], int | None] = lambda step: 1,
) -> Counter[int]:
    """Run ``steps`` steps through the tuner; how many ran on each thread count."""
    used: Counter[int] = Counter()
    for step in range(steps):
        key = shape(step)
        threads = tuner.pick(key)
        assert 1 <= threads <= tuner.most
        used[threads] += 1
        tuner.record(key, threads, seconds(threads, step))
    return used


def test_a_quiet_machine_keeps_every_thread_and_pays_little_for_the_watch() -> None:
    tuner = ThreadTuner(2)
    used = run(tuner, 20_000, lambda n, step: QUIET[n])
    assert tuner.threads == 2
    # Probes back off to one every LONGEST_WAIT steps: under 1% of the steps on 1 thread.
    assert used[1] / 20_000 < 0.01


def test_a_busy_core_moves_the_steps_to_one_thread_and_back_when_it_stops() -> None:
    tuner = ThreadTuner(2)
    run(tuner, 3_000, lambda n, step: QUIET[n])  # long enough for the longest wait
    assert tuner.threads == 2
    run(tuner, LONGEST_WAIT + PROBE_STEPS, lambda n, step: BUSY[n])
    assert tuner.threads == 1
    run(tuner, 2 * (FIRST_WAIT + PROBE_STEPS), lambda n, step: QUIET[n])
    assert tuner.threads == 2


def test_it_settles_on_the_best_count_among_several() -> None:
    # Four cores, one kept busy: three threads do best, two and four worse.
    cost = {1: 4.0, 2: 2.2, 3: 1.5, 4: 3.5}
    tuner = ThreadTuner(4)
    run(tuner, 6_000, lambda n, step: cost[n])
    assert tuner.threads == 3


def test_prefill_steps_and_changing_batches_are_never_compared() -> None:
    # A neighbour that looks faster only because its steps are smaller must not win: every
    # other step decodes 8 sequences, the rest 1, and prefills (None) come in between.
    tuner = ThreadTuner(2)

    def shape(step: int) -> int | None:
        return None if step % 5 == 0 else (8 if step % 2 else 1)

    def seconds(n: int, step: int) -> float:
        return QUIET[n] * (8 if shape(step) == 8 else 1) * (30 if shape(step) is None else 1)

    used = run(tuner, 5_000, seconds, shape)
    assert tuner.threads == 2
    assert used[1] < 0.02 * 5_000


def test_a_probe_without_comparable_steps_gives_up() -> None:
    tuner = ThreadTuner(2)
    run(tuner, FIRST_WAIT, lambda n, step: QUIET[n])
    # The batch changes every step: no pair forms, so nothing is compared or switched.
    used = run(tuner, PROBE_STEPS + 1, lambda n, step: BUSY[n], shape=lambda step: step)
    assert tuner.threads == 2
    assert used[1] == 0


def test_one_core_is_left_alone() -> None:
    tuner = ThreadTuner(1)
    assert run(tuner, 500, lambda n, step: QUIET[n]) == Counter({1: 500})
    assert ThreadTuner(0).threads == 1
