"""Summaries of text of any length: pieces that fit the context are summarised, then merged."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from homeassistant.core import HomeAssistant
from homeassistant.exceptions import ServiceValidationError

from .backend import Sampling
from .chat import Completion, async_complete
from .const import (
    DOMAIN,
    PRIORITY_SUMMARY,
    SUMMARY_CHUNK_CONCURRENCY,
    SUMMARY_COMBINE_PROMPT,
    SUMMARY_PART_MAX_TOKENS,
    SUMMARY_PROMPT,
)
from .runtime import PagedLLMConfigEntry

# Tokens a chat template adds around one user message (role markers, generation prompt).
TEMPLATE_MARGIN = 32
# Cut a little short of the estimate: characters per token vary along a text.
CUT_SHARE = 0.9
# Share of the KV pool one summary part may fill at its longest: the parts that run at once
# (SUMMARY_CHUNK_CONCURRENCY) then stay below the share the engine keeps for voice queries.
SUMMARY_POOL_SHARE = 0.2


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
    """Summarises text of any length through the entry's backend, in the background class."""

    def __init__(self, hass: HomeAssistant, entry: PagedLLMConfigEntry, sampling: Sampling) -> None:
        """Prepare for one summary."""
        self.hass = hass
        self.entry = entry
        self.sampling = sampling
        # Parts summarise pieces of the text; only the final summary is held to max_tokens.
        # A part may answer in an eighth of the longest request, so a piece still leaves
        # room for text.
        part_tokens = min(SUMMARY_PART_MAX_TOKENS, self._longest() // 8)
        self.part_sampling = replace(sampling, max_tokens=part_tokens)
        self.reserve = max(sampling.max_tokens, part_tokens)
        self.chunks = 0
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

    async def _split(self, instruction: str, text: str) -> list[str]:
        """Cut text into pieces whose request fits the context and its share of the pool."""
        backend = self.entry.runtime_data.backend
        context = backend.context_size
        longest = self._longest()
        overhead = await backend.async_count_tokens(instruction) + TEMPLATE_MARGIN
        budget = longest - self.reserve - overhead
        tokens = await backend.async_count_tokens(text)
        if tokens <= budget:
            return [text]
        if budget < 4 * self.reserve:
            # Each round of merging must at least halve the text, or it would never end.
            raise ServiceValidationError(
                translation_domain=DOMAIN,
                translation_key="summary_max_tokens_too_large",
                translation_placeholders={
                    "max_tokens": str(self.sampling.max_tokens),
                    "context": str(context),
                },
            )
        pieces: list[str] = []
        pending = [text]
        while pending:
            piece = pending.pop(0)
            count = await backend.async_count_tokens(piece)
            if count <= budget:
                pieces.append(piece)
                continue
            limit = max(1, int(len(piece) * budget / count * CUT_SHARE))
            at = _cut(piece, limit)
            pending[:0] = [piece[:at], piece[at:]]
        return [piece for piece in pieces if piece.strip()]

    async def _summarize_piece(self, instruction: str, text: str, sampling: Sampling) -> Completion:
        """Summarise one piece that fits the context."""
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

    async def async_summarize(self, text: str, instruction: str = SUMMARY_PROMPT) -> str:
        """Summarise ``text``, splitting and merging as often as its length needs."""
        pieces = await self._split(instruction, text)
        self.chunks = self.chunks or len(pieces)
        if len(pieces) == 1:
            self.final = await self._summarize_piece(instruction, pieces[0], self.sampling)
            return self.final.text
        partial = await asyncio.gather(
            *(self._summarize_piece(SUMMARY_PROMPT, piece, self.part_sampling) for piece in pieces)
        )
        self.parts.extend(partial)
        # Every round at least halves the text (see _split), so this recursion is shallow.
        merged = "\n\n".join(done.text for done in partial)
        return await self.async_summarize(merged, SUMMARY_COMBINE_PROMPT)

    @property
    def truncated(self) -> bool:
        """Whether any request stopped at its token limit rather than by itself."""
        done = [*self.parts, *([self.final] if self.final else [])]
        return any(d.finish_reason == "length" for d in done)
