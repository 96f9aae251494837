"""Log probabilities of tokens: one position's token, its log probability and the top ones."""

from __future__ import annotations

from dataclasses import dataclass

# OpenAI's bound on top_logprobs (vLLM's default max_logprobs): the most alternatives asked.
MAX_LOGPROBS = 20


@dataclass(slots=True, frozen=True)
class TokenLogprob:
    """A token at one position with its log probability, its rank and the top alternatives.

    ``rank`` is 1 for the most likely token (vLLM's: one plus the tokens strictly more
    likely); ``top`` holds (token id, log probability) pairs, most likely first.
    """

    token_id: int
    logprob: float
    rank: int
    top: tuple[tuple[int, float], ...] = ()
