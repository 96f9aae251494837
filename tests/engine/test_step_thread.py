"""The shared step thread: turns in order, the voice signal between engines, its own end."""

from __future__ import annotations

import threading

from paged_llm.engine.step_thread import StepThread


class FakeEngine:
    """Takes a few turns, recording whether another engine served voice meanwhile."""

    def __init__(self, turns: int, interactive: bool, after: FakeEngine | None = None) -> None:
        self.left = turns
        self.after = after  # no turn of its own counts before this engine has had one
        self.interactive = interactive
        self.seen: list[bool] = []
        self.threads: set[str] = set()
        self.done = threading.Event()

    def serves_interactive(self) -> bool:
        return self.interactive and self.left > 0

    def turn(self, interactive_elsewhere: bool) -> float | None:
        self.threads.add(threading.current_thread().name)
        if self.after is not None and not self.after.seen:
            return 0.0
        if self.left == 0:
            self.done.set()
            return None
        self.left -= 1
        self.seen.append(interactive_elsewhere)
        return 0.0


def test_engines_take_turns_and_learn_of_voice_on_another_engine() -> None:
    step_thread = StepThread()
    summary = FakeEngine(6, interactive=False)
    # The voice's turns count from the summary's first: the thread may give the voice
    # turns before the test has attached the summary.
    voice = FakeEngine(3, interactive=True, after=summary)
    step_thread.attach(voice)
    step_thread.attach(summary)
    assert voice.done.wait(5)
    assert summary.done.wait(5)
    # The summary's engine knew of the voice while it lasted (the voice finishes in its
    # third turn, before the summary's third); the voice's own engine did not count itself.
    assert summary.seen == [True, True, True, False, False, False]
    assert voice.seen == [False, False, False]
    assert voice.threads == summary.threads == {"paged-llm-engine"}


def test_the_thread_ends_with_its_last_engine_and_comes_back_for_the_next() -> None:
    step_thread = StepThread()
    first = FakeEngine(0, interactive=False)
    step_thread.attach(first)
    assert first.done.wait(5)
    ending = step_thread.detach(first)
    if ending is not None:
        step_thread.wait_ended(ending)
        assert not ending.is_alive()
    second = FakeEngine(2, interactive=False)
    step_thread.attach(second)
    assert second.done.wait(5)
    assert second.seen == [False, False]
