"""Reasoning in streamed answers: ``<think>…</think>`` (Qwen3, DeepSeek-R1) kept apart."""

from __future__ import annotations

import enum

OPEN = "<think>"
CLOSE = "</think>"


class _State(enum.Enum):
    """Where the stream is."""

    START = enum.auto()
    THINKING = enum.auto()
    ANSWER = enum.auto()


class ThinkSplitter:
    """Splits streamed text into reasoning and answer; the answer is what gets spoken."""

    def __init__(self) -> None:
        """Start before the first character."""
        self._state = _State.START
        self._held = ""

    def feed(self, text: str) -> tuple[str, str]:
        """Reasoning and answer text that are certain after ``text`` arrived."""
        self._held += text
        reasoning = answer = ""
        if self._state is _State.START:
            head = self._held.lstrip()
            if head.startswith(OPEN):
                self._state, self._held = _State.THINKING, head[len(OPEN) :]
            elif head and not OPEN.startswith(head):
                self._state = _State.ANSWER
            else:
                return "", ""  # still could be the opening tag
        if self._state is _State.THINKING:
            end = self._held.find(CLOSE)
            if end < 0:
                # Hold back what may be the start of the closing tag.
                keep = next(
                    (n for n in range(len(CLOSE) - 1, 0, -1) if self._held.endswith(CLOSE[:n])),
                    0,
                )
                cut = len(self._held) - keep
                reasoning, self._held = self._held[:cut], self._held[cut:]
                return reasoning, ""
            reasoning = self._held[:end]
            self._held = self._held[end + len(CLOSE) :].lstrip()
            self._state = _State.ANSWER
        if self._state is _State.ANSWER:
            answer, self._held = self._held, ""
        return reasoning, answer

    def finish(self) -> tuple[str, str]:
        """Whatever is still held when the stream ends."""
        held, self._held = self._held, ""
        if self._state is _State.THINKING:
            return held, ""
        return "", held
