"""Log probabilities of the raw model distribution on numpy, for both runners.

Which distribution: the model's own, log_softmax of the logits as the forward pass gives
them, before penalties, grammar masks, temperature and top-k/top-p/min-p (vLLM v1's
default "raw_logprobs", and what OpenAI documents). So a logprob answers "how likely does
the model find this token", whatever the request's sampling settings; a token a grammar
forced still gets the model's own (possibly low) log probability.

Only the rows of requests that asked are computed: a step without such requests pays
nothing but a check per sequence.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from paged_llm.engine.core.logprob import TokenLogprob
from paged_llm.engine.core.sequence import Sequence

Floats = npt.NDArray[np.float32]


@dataclass(slots=True)
class StepLogprobs:
    """What a step computed: each sampled token's record and each request's scored prompt."""

    sampled: dict[str, TokenLogprob] = field(default_factory=dict)
    # Records for prompt positions from the request's next_scored on, in order.
    prompt: dict[str, list[TokenLogprob]] = field(default_factory=dict)


def log_softmax(rows: npt.NDArray[np.floating[Any]]) -> Floats:
    """Row-wise log_softmax in float32 (sums in float64, so wide vocabularies stay exact)."""
    x = np.asarray(rows, dtype=np.float32)
    top = x.max(axis=-1, keepdims=True)
    shifted = x - top
    total = np.exp(shifted).sum(axis=-1, keepdims=True, dtype=np.float64)
    out: Floats = (shifted - np.log(total).astype(np.float32)).astype(np.float32)
    return out


def record(row: Floats, token_id: int, k: int) -> TokenLogprob:
    """The record of ``token_id`` in one log-softmax row, with the row's top ``k``."""
    value = row[token_id]
    rank = int(np.count_nonzero(row > value)) + 1
    top: tuple[tuple[int, float], ...] = ()
    if k:
        k = min(k, row.shape[0])
        part = np.argpartition(-row, k - 1)[:k]
        # Most likely first; equal values by token id, so the order is deterministic.
        part = part[np.lexsort((part, -row[part]))]
        top = tuple((int(t), float(row[t])) for t in part)
    return TokenLogprob(int(token_id), float(value), rank, top)


def wanted_rows(seqs: list[Sequence]) -> list[int]:
    """The rows (of the sampling seqs) whose requests asked for logprobs of their tokens."""
    return [i for i, seq in enumerate(seqs) if seq.params.logprobs is not None]


def sampled_logprobs(
    rows: Floats, wanted: list[int], seqs: list[Sequence], tokens: dict[str, int | Exception]
) -> dict[str, TokenLogprob]:
    """Records of the sampled tokens, from ``rows`` (log_softmax of the ``wanted`` rows)."""
    out: dict[str, TokenLogprob] = {}
    for j, i in enumerate(wanted):
        seq = seqs[i]
        token = tokens.get(seq.request_id)
        if isinstance(token, int):
            out[seq.request_id] = record(rows[j], token, seq.params.logprobs or 0)
    return out


def prompt_logprobs(
    logits: npt.NDArray[np.floating[Any]],
    offset: int,
    scored: list[tuple[int, int, int]],
    seqs: list[Sequence],
) -> dict[str, list[TokenLogprob]]:
    """Records of the scored prompt tokens; their rows start at ``offset`` of ``logits``.

    ``scored`` is StepInputs.scored, ``seqs`` every chunk's sequence (chunk order).
    """
    out: dict[str, list[TokenLogprob]] = {}
    row = offset
    for chunk, first, count in scored:
        seq = seqs[chunk]
        k = seq.params.prompt_logprobs or 0
        block = log_softmax(logits[row : row + count])
        tokens = seq.token_ids[first : first + count]
        out[seq.request_id] = [record(block[j], t, k) for j, t in enumerate(tokens)]
        row += count
    return out
