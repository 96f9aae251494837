"""Summaries of text of any length: pieces that fit one request are summarised, then merged."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from homeassistant.core import Context, HomeAssistant
from homeassistant.exceptions import HomeAssistantError, ServiceValidationError

from .backend import Sampling
from .chat import Completion, async_complete
from .const import (
    DOMAIN,
    EVENT_SUMMARY_PROGRESS,
    PRIORITY_SUMMARY,
    SUMMARY_CHUNK_CONCURRENCY,
    SUMMARY_COMBINE_PROMPT,
    SUMMARY_PART_MAX_TOKENS,
    SUMMARY_PROMPT,
)
from .errors import one_error
from .runtime import PagedLLMConfigEntry

# Tokens a chat template adds around one user message (role markers, generation prompt).
TEMPLATE_MARGIN = 32
# Cut a little short of the estimate: characters per token vary along a text.
CUT_SHARE = 0.9
# Share of the KV pool one summary part may fill at its longest: the parts that run at once
# (SUMMARY_CHUNK_CONCURRENCY) then stay below the share the engine keeps for voice queries.
SUMMARY_POOL_SHARE = 0.2
# The least room a part's own summary gets; with less, merged summaries hardly shrink.
MIN_PART_TOKENS = 32
# Rounds of merging at most. Each round shrinks the text several times over (a part's
# summary is at most an eighth of a request, and at most half of what the final request
# leaves for text), so real texts need two or three; this only stops a model whose
# summaries do not shrink.
MAX_ROUNDS = 8


def _cut(text: str, limit: int) -> int:
    """Where to cut ``text`` at most ``limit`` characters in: a paragraph, line or word end."""
    if len(text) <= limit:
        return len(text)
    for mark in ("\n\n", "\n", ". ", " "):
        at = text.rfind(mark, limit // 2, limit)
        if at > 0:
            return at + len(mark)
    return limit


class Summarizer:
    """Summarises text of any length through the entry's backend, in the background class.

    A text that fits one request (the context, and a fifth of the KV pool) with the final
    summary's ``max_tokens`` is summarised at once. A longer one is cut into pieces that
    fit a request with a part's summary; the parts' summaries, joined, are the next round's
    text, until it fits. Progress is fired as ``paged_llm_summary_progress`` events;
    cancelling the call (a stopped automation) cancels the requests and frees their blocks.
    """

    def __init__(
        self,
        hass: HomeAssistant,
        entry: PagedLLMConfigEntry,
        sampling: Sampling,
        context: Context | None = None,
    ) -> None:
        """Prepare for one summary."""
        self.hass = hass
        self.entry = entry
        self.sampling = sampling
        self.context = context
        self.chunks = 0
        self.rounds = 0
        self.requests = 0
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.parts: list[Completion] = []
        self.final: Completion | None = None
        self._slots = asyncio.Semaphore(SUMMARY_CHUNK_CONCURRENCY)

    def _messages(self, instruction: str, text: str) -> list[dict[str, Any]]:
        """The request for one piece of text."""
        return [{"role": "user", "content": f"{instruction}\n\n{text}"}]

    def _longest(self) -> int:
        """The most tokens one request may hold: the context, and a share of the KV pool."""
        backend = self.entry.runtime_data.backend
        if (pool := backend.kv_pool_tokens) is not None:
            return min(backend.context_size, int(pool * SUMMARY_POOL_SHARE))
        return backend.context_size

    async def _budgets(self) -> tuple[int, int, Sampling]:
        """Text tokens the final request and a part's request may hold; a part's sampling.

        Raises ServiceValidationError, naming the limit, when ``max_tokens`` leaves the
        final request too little room to merge even two parts' summaries.
        """
        backend = self.entry.runtime_data.backend
        longest = self._longest()
        count = backend.async_count_tokens
        overhead = max(await count(SUMMARY_PROMPT), await count(SUMMARY_COMBINE_PROMPT))
        overhead += TEMPLATE_MARGIN
        final = longest - self.sampling.max_tokens - overhead
        part_tokens = min(SUMMARY_PART_MAX_TOKENS, longest // 8, final // 2)
        if part_tokens < MIN_PART_TOKENS:
            raise ServiceValidationError(
                translation_domain=DOMAIN,
                translation_key="summary_max_tokens_too_large",
                translation_placeholders={
                    "max_tokens": str(self.sampling.max_tokens),
                    "longest": str(longest),
                    "context": str(backend.context_size),
                    "most": str(max(0, longest - overhead - 2 * MIN_PART_TOKENS)),
                },
            )
        return (
            final,
            longest - part_tokens - overhead,
            replace(self.sampling, max_tokens=part_tokens),
        )

    async def _split(self, text: str, tokens: int, budget: int) -> list[str]:
        """Cut ``text`` (``tokens`` long) into pieces of at most ``budget`` tokens."""
        count = self.entry.runtime_data.backend.async_count_tokens
        pieces: list[str] = []
        pending = [(text, tokens)]
        while pending:
            piece, size = pending.pop(0)
            if size <= budget:
                pieces.append(piece)
                continue
            limit = max(1, int(len(piece) * budget / size * CUT_SHARE))
            at = _cut(piece, limit)
            head, tail = piece[:at], piece[at:]
            pending[:0] = [(head, await count(head)), (tail, await count(tail))]
        return [piece for piece in pieces if piece.strip()]

    async def _summarize_piece(self, instruction: str, text: str, sampling: Sampling) -> Completion:
        """Summarise one piece that fits a request."""
        async with self._slots:
            done = await async_complete(
                self.hass,
                self.entry,
                self._messages(instruction, text),
                sampling,
                PRIORITY_SUMMARY,
            )
        self.requests += 1
        self.prompt_tokens += done.prompt_tokens
        self.completion_tokens += done.completion_tokens
        return done

    def _progress(self, done: int, total: int) -> None:
        """Tell automations how far this round is."""
        self.hass.bus.async_fire(
            EVENT_SUMMARY_PROGRESS,
            {
                "entry_id": self.entry.entry_id,
                "round": self.rounds,
                "parts_done": done,
                "parts_total": total,
            },
            context=self.context,
        )

    async def _summarize_round(self, pieces: list[str], sampling: Sampling) -> list[Completion]:
        """Summarise every piece of one round, reporting each part as it finishes.

        A task group, so a failed part cancels the others (their requests are aborted and
        their blocks return) instead of leaving them running. Parts that fail together
        (the engine stopped under them) raise one translated error, the first, never the
        group: Home Assistant's service layer and REST API translate only single errors.
        """
        done = 0
        self._progress(done, len(pieces))

        async def one(piece: str) -> Completion:
            """Summarize one piece and report the progress."""
            nonlocal done
            part = await self._summarize_piece(SUMMARY_PROMPT, piece, sampling)
            done += 1
            self._progress(done, len(pieces))
            return part

        try:
            async with asyncio.TaskGroup() as group:
                tasks = [group.create_task(one(piece)) for piece in pieces]
        except ExceptionGroup as failed:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                # The caller was cancelled while parts failed: it must end cancelled, not
                # with their error (the group keeps the cancellation pending for this).
                raise asyncio.CancelledError from failed
            raise one_error(failed) from failed
        return [task.result() for task in tasks]

    async def async_summarize(self, text: str) -> str:
        """Summarise ``text``, splitting and merging as often as its length needs."""
        final_budget, piece_budget, part_sampling = await self._budgets()
        count = self.entry.runtime_data.backend.async_count_tokens
        instruction = SUMMARY_PROMPT
        for _ in range(MAX_ROUNDS):
            tokens = await count(text)
            if tokens <= final_budget:
                self.chunks = self.chunks or 1
                self.final = await self._summarize_piece(instruction, text, self.sampling)
                return self.final.text
            pieces = await self._split(text, tokens, piece_budget)
            self.rounds += 1
            self.chunks = self.chunks or len(pieces)
            partial = await self._summarize_round(pieces, part_sampling)
            self.parts.extend(partial)
            text = "\n\n".join(done.text for done in partial)
            instruction = SUMMARY_COMBINE_PROMPT
        raise HomeAssistantError(
            translation_domain=DOMAIN,
            translation_key="summary_does_not_shrink",
            translation_placeholders={"rounds": str(MAX_ROUNDS)},
        )

    @property
    def truncated(self) -> bool:
        """Whether any request stopped at its token limit rather than by itself."""
        done = [*self.parts, *([self.final] if self.final else [])]
        return any(d.finish_reason == "length" for d in done)
