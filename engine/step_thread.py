"""One thread steps every engine of the process, so torch's OpenMP pool exists once."""

from __future__ import annotations

import threading
from typing import Protocol

# Longest sleep between turns when no engine asks for an earlier one.
IDLE_WAIT_S = 1.0


class Steppable(Protocol):
    """What the step thread drives: an engine that does one turn of work at a time."""

    def serves_interactive(self) -> bool:
        """Whether an interactive request waits or runs on this engine."""
        ...

    def turn(self, interactive_elsewhere: bool) -> float | None:
        """Do what is pending (commands, at most one step).

        ``interactive_elsewhere`` says another engine serves an interactive request, so
        this one should keep its steps short. Returns the seconds until the engine wants
        its next turn (0: at once), or None when it is done (stopped or crashed) and should
        be dropped.
        """
        ...


class StepThread:
    """Gives every attached engine a turn in order on one thread; sleeps while none works.

    torch's OpenMP runtime keeps a worker pool for every thread that ran parallel ops,
    and while more pool threads live than there are cores its workers stop spinning
    between parallel regions. With one thread per engine, a second engine in the process,
    even an idle one, halved the first one's decode speed on 2 cores (15 instead of 29
    tokens/s). Engines take turns a step at a time, so each waits at most one step of
    the others, and while one serves a voice request the others keep their steps within
    the latency budget. The thread ends when the last engine leaves (its pool goes with
    it) and starts again with the next one.
    """

    def __init__(self) -> None:
        """No thread yet: the first ``attach`` starts it."""
        self._lock = threading.Lock()
        self._engines: list[Steppable] = []
        self._wakeup = threading.Event()
        self._thread: threading.Thread | None = None

    def attach(self, engine: Steppable) -> None:
        """Start giving ``engine`` turns, starting the thread if it is not running."""
        with self._lock:
            self._engines.append(engine)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._main, name="paged-llm-engine", daemon=True
                )
                self._thread.start()
        self._wakeup.set()

    def detach(self, engine: Steppable) -> threading.Thread | None:
        """Stop giving ``engine`` turns; a turn under way still ends (the engine waits for it).

        Returns the thread when no engine is left: it is ending (see ``wait_ended``).
        """
        with self._lock:
            if engine in self._engines:
                self._engines.remove(engine)
            ending = None if self._engines else self._thread
        self._wakeup.set()
        return ending

    def wait_ended(self, thread: threading.Thread) -> None:
        """Block until ``thread``, left without engines, has ended; at once if one came back."""
        while True:
            thread.join(timeout=0.05)
            if not thread.is_alive():
                return
            with self._lock:
                if self._engines and self._thread is thread:
                    return

    def wake(self) -> None:
        """Give every engine a turn now: one of them has new work."""
        self._wakeup.set()

    def _main(self) -> None:
        """Turn the engines until none is left; sleep until one is due or woken."""
        while True:
            self._wakeup.clear()
            with self._lock:
                engines = list(self._engines)
                if not engines:
                    self._thread = None
                    return
            wait = IDLE_WAIT_S
            for engine in engines:
                elsewhere = any(o is not engine and o.serves_interactive() for o in engines)
                due = engine.turn(elsewhere)
                if due is None:
                    self.detach(engine)
                else:
                    wait = min(wait, due)
            if wait > 0:
                self._wakeup.wait(wait)


# The process's one step thread: the embedded engines of Home Assistant, or a server's.
STEP_THREAD = StepThread()
