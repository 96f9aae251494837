"""Batched token sampling in torch: greedy, temperature, top-k, top-p and per-request seeds."""

from __future__ import annotations

import torch

from .sequence import Sequence

# Top-k up to this size is served by torch.topk; larger k or top-p alone needs a full sort.
_TOPK_FAST_LIMIT = 1024


class Sampler:
    """Picks one token per row of logits, each row with its own sequence's parameters.

    Random rows sample by inverse CDF: one uniform number per row against the row's
    cumulative probabilities. That needs one random draw per request (so a seeded request
    only advances its own generator) instead of a noise vector over the whole vocabulary,
    which on a CPU costs more than the rest of sampling together.
    """

    def __init__(self, device: torch.device) -> None:
        """Start with no per-request generators."""
        self.device = device
        self._generators: dict[str, torch.Generator] = {}

    def release(self, request_id: str) -> None:
        """Drop a finished request's generator."""
        self._generators.pop(request_id, None)

    def _generator(self, seq: Sequence) -> torch.Generator:
        """The request's own generator, seeded once so its whole output is reproducible."""
        gen = self._generators.get(seq.request_id)
        if gen is None:
            gen = torch.Generator(device="cpu")
            assert seq.params.seed is not None
            gen.manual_seed(seq.params.seed)
            self._generators[seq.request_id] = gen
        return gen

    def sample(self, logits: torch.Tensor, seqs: list[Sequence]) -> list[int]:
        """Return one token id per row of ``logits`` (shape ``[len(seqs), vocab]``)."""
        greedy = [s.params.greedy for s in seqs]
        if all(greedy):
            return logits.argmax(dim=-1).tolist()
        rows = [i for i, g in enumerate(greedy) if not g]
        chosen = logits.argmax(dim=-1)
        picked = self._sample_rows(logits[rows].float(), [seqs[i] for i in rows])
        chosen[torch.tensor(rows, device=logits.device)] = picked
        return chosen.tolist()

    def _sample_rows(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        """Sample the non-greedy rows: temperature, then top-k / top-p, then inverse CDF."""
        dev = logits.device
        temps = torch.tensor([s.params.temperature for s in seqs], device=dev)
        logits = logits / temps.unsqueeze(1)
        vocab = logits.shape[-1]
        top_ks = [s.params.top_k if 0 < s.params.top_k < vocab else vocab for s in seqs]
        top_ps = [s.params.top_p for s in seqs]
        index: torch.Tensor | None = None
        if min(top_ks) < vocab or min(top_ps) < 1.0:
            # Work on candidates sorted by logit: the top max(k) when that is small, else all.
            width = max(top_ks) if max(top_ks) <= _TOPK_FAST_LIMIT else vocab
            if width < vocab:
                logits, index = logits.topk(width, dim=-1)
            else:
                logits, index = logits.sort(dim=-1, descending=True)
            logits = _mask_sorted(logits, top_ks, top_ps)
        probs = torch.softmax(logits, dim=-1)
        cdf = probs.cumsum(dim=-1)
        uniform = torch.empty(len(seqs), 1)
        for row, seq in enumerate(seqs):
            gen = self._generator(seq) if seq.params.seed is not None else None
            uniform[row] = torch.rand(1, generator=gen)
        target = uniform.to(dev) * cdf[:, -1:]
        picked = torch.searchsorted(cdf, target).clamp_(max=cdf.shape[-1] - 1).squeeze(1)
        if index is not None:
            picked = index.gather(1, picked.unsqueeze(1)).squeeze(1)
        return picked


def _mask_sorted(logits: torch.Tensor, top_ks: list[int], top_ps: list[float]) -> torch.Tensor:
    """Set -inf outside each row's top-k and nucleus; ``logits`` are sorted descending."""
    dev = logits.device
    ranks = torch.arange(logits.shape[-1], device=dev).unsqueeze(0)
    drop = ranks >= torch.tensor(top_ks, device=dev).unsqueeze(1)
    probs = torch.softmax(logits.masked_fill(drop, float("-inf")), dim=-1)
    # Keep a token while the mass before it is below p: the top token always stays.
    mass_before = probs.cumsum(dim=-1) - probs
    drop |= mass_before >= torch.tensor(top_ps, device=dev, dtype=probs.dtype).unsqueeze(1)
    return logits.masked_fill(drop, float("-inf"))
