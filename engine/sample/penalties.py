"""Repetition, frequency and presence penalties, applied to a step's logits before sampling.

The definitions are vLLM's (and OpenAI's for the last two):
- repetition penalty ``r`` (1 = off): a token that appears in the prompt or the output so
  far has its logit divided by ``r`` when positive, multiplied by ``r`` when negative
  (transformers' ``RepetitionPenaltyLogitsProcessor`` does the same over its input ids);
- frequency penalty ``f`` (0 = off): ``f`` times the token's count in the output so far is
  subtracted from its logit;
- presence penalty ``p`` (0 = off): ``p`` is subtracted once from the logit of every token
  the output holds.

Each row depends only on its own sequence, so a seeded request still gets the same tokens
whatever else shares its step.
"""

from __future__ import annotations

import array

import torch

from paged_llm.engine.core.sequence import SamplingParams, Sequence


def has_penalties(params: SamplingParams) -> bool:
    """Whether any penalty of ``params`` changes logits."""
    return (
        params.repetition_penalty not in (None, 1.0)
        or params.frequency_penalty != 0.0
        or params.presence_penalty != 0.0
    )


def _ids(tokens: list[int], device: torch.device) -> torch.Tensor:
    """``tokens`` as an int64 tensor, through an array: 7x quicker than ``torch.tensor``."""
    if not tokens:
        return torch.empty(0, dtype=torch.int64, device=device)
    return torch.frombuffer(array.array("q", tokens), dtype=torch.int64).to(device)


def _penalize(row: torch.Tensor, seq: Sequence) -> None:
    """Apply ``seq``'s penalties to its float32 logits ``row`` in place.

    Only the tokens that occur are read and written: counts over the whole vocabulary
    (Qwen's 151,936 tokens) cost a quarter or more of a 1.5B model's step at 32 sequences.
    """
    params = seq.params
    rep = params.repetition_penalty or 1.0
    if rep != 1.0:
        seen = torch.unique(_ids(seq.token_ids, row.device))  # the prompt, then the output
        values = row[seen]
        row[seen] = torch.where(values > 0, values / rep, values * rep)
    output = seq.output_token_ids
    if output and (params.frequency_penalty or params.presence_penalty):
        tokens, counts = torch.unique(_ids(output, row.device), return_counts=True)
        # The frequency term first, then the presence one, as the definitions read.
        row[tokens] = row[tokens] - params.frequency_penalty * counts - params.presence_penalty


def apply_penalties(logits: torch.Tensor, seqs: list[Sequence]) -> None:
    """Apply each row's penalties to ``logits`` (``[len(seqs), vocab]``) in place.

    The arithmetic is float32 whatever the logits' dtype; rows without penalties are not
    touched.
    """
    for i, seq in enumerate(seqs):
        if not has_penalties(seq.params):
            continue
        if logits.dtype == torch.float32:
            _penalize(logits[i], seq)
        else:
            row = logits[i].float()
            _penalize(row, seq)
            logits[i] = row.to(logits.dtype)
