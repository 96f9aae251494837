"""Repetition, frequency and presence penalties on numpy logits, applied before sampling.

The torch-free twin of :mod:`paged_llm.engine.sample.penalties`, with its definitions
(vLLM's, and OpenAI's for the last two) and its float32 arithmetic, so both give the same
bits:
- repetition penalty ``r`` (1 = off): a token in the prompt or the output so far has its
  logit divided by ``r`` when positive, multiplied by ``r`` otherwise;
- frequency penalty ``f`` (0 = off): ``f`` times the token's count in the output so far is
  subtracted from its logit;
- presence penalty ``p`` (0 = off): ``p`` is subtracted once from the logit of every token
  the output holds.

Only the ids a sequence holds are read and written, and each row depends only on its own
sequence, so a seeded request still gets the same tokens whatever else shares its step.
"""

from __future__ import annotations

import array
from typing import Any

import numpy as np
import numpy.typing as npt

from paged_llm.engine.core.sequence import SamplingParams, Sequence


def has_penalties(params: SamplingParams) -> bool:
    """Whether any penalty of ``params`` changes logits."""
    # A twin of penalties.has_penalties: that module imports torch.
    return (
        params.repetition_penalty not in (None, 1.0)
        or params.frequency_penalty != 0.0
        or params.presence_penalty != 0.0
    )


def _ids(tokens: list[int]) -> npt.NDArray[np.int64]:
    """``tokens`` as an int64 array, through an array: quicker than ``np.array`` on a list."""
    if not tokens:
        return np.empty(0, np.int64)
    return np.frombuffer(array.array("q", tokens), dtype=np.int64)


def _penalize(row: npt.NDArray[np.float32], seq: Sequence) -> None:
    """Apply ``seq``'s penalties to its float32 logits ``row`` in place."""
    params = seq.params
    rep = params.repetition_penalty or 1.0
    if rep != 1.0:
        # Repeated ids need no unique: each copy reads the old value and writes the same new
        # one. Dividing by the float32 penalty is what torch does with a Python scalar.
        seen = _ids(seq.token_ids)  # the prompt, then the output
        values = row[seen]
        penalty = np.float32(rep)
        row[seen] = np.where(values > 0, values / penalty, values * penalty)
    output = seq.output_token_ids
    if output and (params.frequency_penalty or params.presence_penalty):
        tokens, counts = np.unique(_ids(output), return_counts=True)
        # float32 throughout, the frequency term first, then the presence one, as the
        # torch twin computes ``row - f * counts - p``.
        frequency = np.float32(params.frequency_penalty) * counts.astype(np.float32)
        row[tokens] = row[tokens] - frequency - np.float32(params.presence_penalty)


def apply_penalties(logits: npt.NDArray[np.floating[Any]], seqs: list[Sequence]) -> None:
    """Apply each row's penalties to ``logits`` (``[len(seqs), vocab]``) in place.

    The arithmetic is float32 whatever the logits' dtype; rows without penalties are not
    touched.
    """
    for i, seq in enumerate(seqs):
        if not has_penalties(seq.params):
            continue
        if logits.dtype == np.float32:
            _penalize(logits[i], seq)
        else:
            row = logits[i].astype(np.float32)
            _penalize(row, seq)
            logits[i] = row.astype(logits.dtype)
