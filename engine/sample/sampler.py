"""Batched token sampling in torch: greedy, temperature, top-k, top-p, min-p and seeds."""

from __future__ import annotations

import torch

from paged_llm.engine.core.sequence import Sequence
from paged_llm.engine.sample.min_p import margin

# Top-k up to this size is served by torch.topk; larger k or top-p alone needs a full sort.
_TOPK_FAST_LIMIT = 1024
# Top-p alone looks for its nucleus among the largest logits first, in these numbers:
# sorting a 151,936-token row costs many times what taking its top 256 or 4,096 does.
_NUCLEUS_CANDIDATES = (256, 4096)


class Sampler:
    """Picks one token per row of logits, each row with its own sequence's parameters.

    Random rows sample by inverse CDF: one uniform number per row against the row's
    cumulative probabilities, in vocabulary order. That needs one random draw per request
    (so a seeded request only advances its own generator) instead of a noise vector over
    the whole vocabulary, which on a CPU costs more than the rest of sampling together.
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
        """Return one token id per row of ``logits`` (shape ``[len(seqs), vocab]``).

        Callers apply penalties and grammar masks to ``logits`` before this last stage.
        """
        greedy = [s.params.greedy for s in seqs]
        if all(greedy):
            return _argmax(logits)
        if not any(greedy):
            picked: list[int] = self._sample_rows(logits.float(), seqs).tolist()
            return picked
        rows = [i for i, g in enumerate(greedy) if not g]
        chosen = _argmax(logits)
        sampled = self._sample_rows(logits[rows].float(), [seqs[i] for i in rows]).tolist()
        for row, token in zip(rows, sampled, strict=True):
            chosen[row] = token
        return chosen

    def sample_each(self, logits: torch.Tensor, seqs: list[Sequence]) -> list[int | Exception]:
        """Sample row by row, returning the exception of a row that fails instead of raising.

        The fallback after a batched ``sample`` raised, so one request's failure stays its own.
        """
        results: list[int | Exception] = []
        for row, seq in enumerate(seqs):
            try:
                results.append(self.sample(logits[row : row + 1], [seq])[0])
            except Exception as err:  # handed to that request, not swallowed
                results.append(err)
        return results

    def _sample_rows(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        """Sample the non-greedy rows: temperature, then top-k / top-p / min-p, then inverse CDF.

        Min-p cuts at the row's largest scaled logit plus its margin (sample/min_p.py),
        after top-k / top-p as transformers orders them: the kept set is all three's.

        Batch invariance: every row's result depends only on its own logits, parameters
        and generator. Rows are filtered in groups of equal candidate width, and the draw
        walks each row's kept tokens in vocabulary order, so no neighbour's top-k or top-p
        changes which token a seeded draw lands on.
        """
        dev = logits.device
        temps = torch.tensor([s.params.temperature for s in seqs], device=dev)
        # Few copies of the rows and in place where possible: at 32 rows of a 151,936-token
        # vocabulary each is 19 MB.
        logits = logits / temps.unsqueeze(1)
        floor = _floors(logits, seqs)
        dropped = None if floor is None else logits < floor
        # softmax, not an elementwise exp: it treats every row alike whatever the batch (an
        # elementwise op's vector remainder falls where the rows and threads put it). The
        # dropped tokens are zeroed after it, as exp is slow on -inf, and the draw below is
        # scaled by each row's total.
        weights = torch.softmax(logits, dim=-1)
        if dropped is not None:
            weights.masked_fill_(dropped, 0.0)
        cdf = weights.cumsum_(dim=-1)
        uniform = torch.empty(len(seqs), 1)
        for row, seq in enumerate(seqs):
            gen = self._generator(seq) if seq.params.seed is not None else None
            uniform[row] = torch.rand(1, generator=gen)
        target = uniform.to(dev) * cdf[:, -1:]
        # right=True: the first token whose cumulative mass exceeds the target, never a
        # zero-probability token even for a draw of exactly 0.
        picked = torch.searchsorted(cdf, target, right=True)
        return picked.clamp_(max=logits.shape[-1] - 1).squeeze(1)


def _floors(logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor | None:
    """Each row's lowest kept scaled logit under top-k, top-p and min-p (``[rows, 1]``).

    None when no row filters. Every token at or above its row's floor is kept.
    """
    dev = logits.device
    vocab = logits.shape[-1]
    top_ks = [s.params.top_k if 0 < s.params.top_k < vocab else vocab for s in seqs]
    top_ps = [s.params.top_p for s in seqs]
    groups: dict[int, list[int]] = {}
    for row, (k, p) in enumerate(zip(top_ks, top_ps, strict=True)):
        if k < vocab or p < 1.0:
            # The top k when k is small (torch.topk), else the whole sorted row.
            groups.setdefault(k if k <= _TOPK_FAST_LIMIT else vocab, []).append(row)
    floor = None
    if groups:
        floor = torch.full((len(seqs), 1), float("-inf"), device=dev)
        for width, rows in groups.items():
            index = torch.tensor(rows, device=dev)
            sub = logits if len(rows) == len(seqs) else logits.index_select(0, index)
            ks, ps = [top_ks[r] for r in rows], [top_ps[r] for r in rows]
            if width < vocab:
                kept = _kept_floor(sub.topk(width, dim=-1).values, ks, ps)
            else:
                kept = _whole_row_floor(sub, ks, ps)
            floor[index, 0] = kept
    margins = [margin(s.params.min_p) for s in seqs]
    if any(m > float("-inf") for m in margins):
        # Min-p's floor is the row's largest scaled logit plus its margin, in float32 as
        # the numpy sampler adds it; the kept set is the intersection, so the higher floor.
        # Rows without min-p get -inf, not top + -inf (NaN where the top is +inf).
        offsets = torch.tensor(margins, device=dev, dtype=logits.dtype).unsqueeze(1)
        top = logits.amax(dim=-1, keepdim=True)
        cut = torch.where(offsets > float("-inf"), top + offsets, offsets)
        floor = cut if floor is None else torch.maximum(floor, cut)
    return floor


def _kept_floor(ranked: torch.Tensor, top_ks: list[int], top_ps: list[float]) -> torch.Tensor:
    """The lowest kept logit per row of descending ``ranked`` logits under top-k and top-p.

    Every token at or above it is kept, ties at the edge included, so the kept set does
    not depend on how a sort orders equal logits.
    """
    dev = ranked.device
    ranks = torch.arange(ranked.shape[-1], device=dev).unsqueeze(0)
    drop = ranks >= torch.tensor(top_ks, device=dev).unsqueeze(1)
    probs = torch.softmax(ranked.masked_fill(drop, float("-inf")), dim=-1)
    # Keep a token while the mass before it is below p: the top token always stays.
    mass_before = probs.cumsum(dim=-1) - probs
    drop |= mass_before >= torch.tensor(top_ps, device=dev, dtype=probs.dtype).unsqueeze(1)
    last = (~drop).sum(dim=-1, keepdim=True) - 1
    return ranked.gather(1, last).squeeze(1)


def _whole_row_floor(logits: torch.Tensor, top_ks: list[int], top_ps: list[float]) -> torch.Tensor:
    """:func:`_kept_floor` for rows whose top-k is off or beyond torch.topk's quick range.

    A row with top-p alone takes its floor from its largest logits when its nucleus ends
    among them (the usual case: a model's probability mass sits in few tokens), weighing
    them by the whole row's softmax; other rows are sorted whole.
    """
    vocab = logits.shape[-1]
    floor = torch.empty(len(top_ks), device=logits.device)
    alone = [r for r in range(len(top_ks)) if top_ks[r] >= vocab and top_ps[r] < 1.0]
    sort = [r for r in range(len(top_ks)) if r not in alone]
    counts = [c for c in _NUCLEUS_CANDIDATES if c < vocab]
    if alone and counts:
        rows = logits if len(alone) == len(logits) else logits[alone]
        # A row-wise softmax, gathered below: an elementwise exp over the rows could round
        # a row's last values differently by where the batch puts them.
        soft = torch.softmax(rows, dim=-1)
    at = list(range(len(alone)))  # the undecided rows' places in rows and soft
    for tier, count in enumerate(counts):
        if not at:
            break
        whole = len(at) == len(alone)
        top = (rows if whole else rows[at]).topk(count, dim=-1)
        probs = (soft if whole else soft[at]).gather(1, top.indices)
        ps = torch.tensor([top_ps[alone[i]] for i in at], device=logits.device, dtype=probs.dtype)
        mass = probs.cumsum(dim=-1)
        drop = mass - probs >= ps.unsqueeze(1)
        # Decided where a candidate already falls outside the nucleus.
        decided = drop.any(dim=-1).tolist()
        found = top.values.gather(1, (~drop).sum(dim=-1, keepdim=True) - 1).squeeze(1)
        # Where the next count cannot reach p either (no token after the candidates weighs
        # more than the last of them), go to the sort at once: flat rows pay no second tier.
        more = counts[tier + 1] - count if tier + 1 < len(counts) else 0
        hopeless = (mass[:, -1] + more * probs[:, -1] < ps).tolist()
        for j, i in enumerate(at):
            if decided[j]:
                floor[alone[i]] = found[j]
            elif hopeless[j]:
                sort.append(alone[i])
        at = [i for j, i in enumerate(at) if not decided[j] and not hopeless[j]]
    sort += [alone[i] for i in at]
    if sort:
        ranked = logits[sort].sort(dim=-1, descending=True).values
        floor[sort] = _kept_floor(ranked, [top_ks[r] for r in sort], [top_ps[r] for r in sort])
    return floor


def _argmax(logits: torch.Tensor) -> list[int]:
    """Each row's first largest logit, as torch's argmax picks it (NaN counting as largest).

    numpy's on a CPU float32 array: torch's wakes its thread pool for one row and costs a
    tenth of a small model's decode step.
    """
    if logits.device.type == "cpu" and logits.dtype == torch.float32:
        picked: list[int] = logits.numpy().argmax(axis=-1).tolist()
        return picked
    chosen: list[int] = logits.argmax(dim=-1).tolist()
    return chosen
