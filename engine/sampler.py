"""Batched token sampling in torch: greedy, temperature, top-k, top-p and per-request seeds."""

from __future__ import annotations

import torch

from .sequence import Sequence


class Sampler:
    """Picks one token per row of logits, each row with its own sequence's parameters.

    Random rows use the exponential-race trick (argmax of probs / Exp(1) noise), so a
    seeded request only needs its own noise vector, drawn from its own generator, and
    the whole batch still samples in one vectorised pass.
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
            gen = torch.Generator(device=self.device)
            assert seq.params.seed is not None
            gen.manual_seed(seq.params.seed)
            self._generators[seq.request_id] = gen
        return gen

    def sample(self, logits: torch.Tensor, seqs: list[Sequence]) -> list[int]:
        """Return one token id per row of ``logits`` (shape ``[len(seqs), vocab]``)."""
        logits = logits.float()
        greedy = torch.tensor([s.params.greedy for s in seqs], device=self.device)
        if bool(greedy.all()):
            return logits.argmax(dim=-1).tolist()

        temps = torch.tensor(
            [s.params.temperature if not s.params.greedy else 1.0 for s in seqs],
            device=self.device,
        )
        scaled = logits / temps.unsqueeze(1)
        top_ks = [s.params.top_k for s in seqs]
        top_ps = [s.params.top_p for s in seqs]
        if any(k > 0 for k in top_ks) or any(p < 1.0 for p in top_ps):
            scaled = _apply_top_k_top_p(scaled, top_ks, top_ps)
        probs = torch.softmax(scaled, dim=-1)

        noise = torch.empty_like(probs).exponential_()
        for row, seq in enumerate(seqs):
            if seq.params.seed is not None and not seq.params.greedy:
                noise[row].exponential_(generator=self._generator(seq))
        sampled = (probs / noise).argmax(dim=-1)
        chosen = torch.where(greedy, logits.argmax(dim=-1), sampled)
        return chosen.tolist()


def _apply_top_k_top_p(
    logits: torch.Tensor, top_ks: list[int], top_ps: list[float]
) -> torch.Tensor:
    """Mask logits outside each row's top-k and nucleus (top-p) sets with -inf."""
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    vocab = logits.shape[-1]
    ks = torch.tensor([k if k > 0 else vocab for k in top_ks], device=logits.device)
    ranks = torch.arange(vocab, device=logits.device).unsqueeze(0)
    drop = ranks >= ks.unsqueeze(1)
    ps = torch.tensor(top_ps, device=logits.device, dtype=logits.dtype).unsqueeze(1)
    probs = torch.softmax(sorted_logits.masked_fill(drop, float("-inf")), dim=-1)
    # Keep a token while the mass before it is below p: the top token always stays.
    mass_before = probs.cumsum(dim=-1) - probs
    drop |= mass_before >= ps
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)
