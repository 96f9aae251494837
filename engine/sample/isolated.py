"""A step's tokens sampled as one batch, where one request's failure fails only that request."""

from __future__ import annotations

from typing import Any, Protocol

from paged_llm.engine.core.sequence import Sequence


class RowSampler(Protocol):
    """What both samplers offer (torch's Sampler, NumpySampler): a batch, or row by row."""

    def sample(self, logits: Any, seqs: list[Sequence]) -> list[int]:
        """One token per row of ``logits``."""
        ...

    def sample_each(self, logits: Any, seqs: list[Sequence]) -> list[int | Exception]:
        """One token per row, each row alone: a failing row gets its exception."""
        ...


def sample_isolated(
    sampler: RowSampler, logits: Any, seqs: list[Sequence], failed: dict[int, Exception]
) -> dict[str, int | Exception]:
    """Each request's token (or its error); ``failed`` holds rows already failed (a grammar)."""
    tokens: list[int | Exception]
    try:
        tokens = list(sampler.sample(logits, seqs))
    except Exception:
        # One request broke the batch: sample row by row so only it fails.
        tokens = sampler.sample_each(logits, seqs)
    for row, err in failed.items():
        tokens[row] = err
    return {seq.request_id: tok for seq, tok in zip(seqs, tokens, strict=True)}
