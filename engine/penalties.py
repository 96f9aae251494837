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

import torch

from .sequence import SamplingParams, Sequence


def has_penalties(params: SamplingParams) -> bool:
    """Whether any penalty of ``params`` changes logits."""
    return (
        params.repetition_penalty not in (None, 1.0)
        or params.frequency_penalty != 0.0
        or params.presence_penalty != 0.0
    )


def _counts(token_lists: list[list[int]], vocab: int, device: torch.device) -> torch.Tensor:
    """A ``[rows, vocab]`` tensor of how often each token occurs in each row's list."""
    counts = torch.zeros(len(token_lists), vocab, dtype=torch.int32, device=device)
    width = max((len(t) for t in token_lists), default=0)
    if width == 0:
        return counts
    # Pad with an extra column past the vocabulary, then drop it: no token is counted twice.
    padded = torch.full((len(token_lists), width), vocab, dtype=torch.int64)
    for row, tokens in enumerate(token_lists):
        if tokens:
            padded[row, : len(tokens)] = torch.tensor(tokens, dtype=torch.int64)
    wide = torch.zeros(len(token_lists), vocab + 1, dtype=torch.int32)
    wide.scatter_add_(1, padded, torch.ones_like(padded, dtype=torch.int32))
    return wide[:, :vocab].to(device)


def apply_penalties(logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
    """Return ``logits`` (``[len(seqs), vocab]``) with each row's penalties applied.

    Rows without penalties are left untouched; when no row has any, ``logits`` itself is
    returned without a copy.
    """
    rows = [i for i, seq in enumerate(seqs) if has_penalties(seq.params)]
    if not rows:
        return logits
    dev = logits.device
    vocab = logits.shape[-1]
    picked = [seqs[i] for i in rows]
    sub = logits[rows].float()
    output_counts = _counts([s.output_token_ids for s in picked], vocab, dev)
    rep = torch.tensor([s.params.repetition_penalty or 1.0 for s in picked], device=dev)[:, None]
    if bool((rep != 1.0).any()):
        seen = _counts([s.prompt_token_ids for s in picked], vocab, dev) > 0
        seen |= output_counts > 0
        penalized = torch.where(sub > 0, sub / rep, sub * rep)
        sub = torch.where(seen, penalized, sub)
    freq = torch.tensor([s.params.frequency_penalty for s in picked], device=dev).unsqueeze(1)
    pres = torch.tensor([s.params.presence_penalty for s in picked], device=dev).unsqueeze(1)
    sub = sub - freq * output_counts - pres * (output_counts > 0)
    out = logits.clone()
    out[rows] = sub.to(logits.dtype)
    return out
