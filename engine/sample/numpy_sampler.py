"""Batched token sampling on numpy: greedy, temperature, top-k, top-p, min-p and seeds.

The torch-free twin of :mod:`paged_llm.engine.sample.sampler`, for the CPU path that serves
GGUF files without torch. Same public methods, parameters and definitions:

- greedy (temperature below ``GREEDY_TEMPERATURE`` or top_k 1): each row's first largest
  logit, NaN counting as largest, exactly as ``torch.argmax`` picks it;
- temperature divides the logits in float32, the torch sampler's bits;
- top-k keeps the k largest scaled logits; top-p keeps the largest while the probability
  mass before them (the softmax over the top k, the whole row when top-k is off) is below p,
  p taken as float32 as the torch sampler does; the kept set is every token at or above the
  lowest kept logit, so ties at the edge are kept whole;
- min-p keeps the tokens at or above the row's largest scaled logit plus ``margin(min_p)``
  (:mod:`paged_llm.engine.sample.min_p`), added in float32 as the torch sampler adds it,
  after top-k and top-p (transformers' order): the kept set is the three sets' intersection;
- the draw is one uniform number per sampled row against the kept tokens' cumulative
  weights in vocabulary order, never landing on a zero-weight token;
- a row whose weights are undefined (a NaN or +inf scaled logit, or every token -inf) gives
  the last token id, as the torch sampler's search over its NaN cumulative sum does.

What differs from the torch sampler: a seeded request draws from numpy's PCG64, so its
tokens differ from the torch sampler's (both are reproducible run to run and batch
invariant). The nucleus mass is summed in float64 from float32 weights; the torch sampler
keeps float32 probabilities, so the kept sets can differ where the mass before a token lies
within float32 rounding of p, or where torch's float32 running mass reaches 1 before the
k-th token and it drops the top-k tail weighing under 2**-25 of the row.

Every row is computed alone in the sampler's own buffers, so a row's result depends only on
its logits, its parameters and its generator: a seeded request gets the same tokens
whatever shares its step. Not thread-safe (the buffers are shared): one step thread calls it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from paged_llm.engine.core.sequence import Sequence
from paged_llm.engine.sample.min_p import margin

Floats = npt.NDArray[np.float32]

# The draw and the wide nucleus search sum weights in blocks of this size, then run one
# block's cumulative sum: numpy's cumsum is sequential and costs 4x torch's over a whole row.
_BLOCK = 1024
# Candidates are first looked for among the logits within these many nats of the row's
# largest: a model's peaked row holds few, and each set is exactly the row's top ranks.
_SPANS = (8.0, 20.0)
# Up to this many candidates are selected from the span; more go to the whole row.
_CANDIDATES = 16_384
# A kept set up to this size is drawn from by its indices, a larger one by masked weights.
_FEW = 4096
# Top-k and top-p together up to this k take the top k by partition; beyond, a whole sort.
_PARTITION_K = 4096
# Seeds span -2**63 .. 2**64 - 1 (SamplingParams); numpy takes non-negative ones. Two's
# complement makes -1 and 2**64 - 1 one seed, as torch.Generator.manual_seed does.
_SEED_MASK = 2**64 - 1


class NumpySampler:
    """Picks one token per row of numpy logits, each row with its own sequence's parameters.

    Seeded requests each own a PCG64 generator, seeded once; unseeded requests share the
    sampler's generator (``seed`` makes that one reproducible too, for tests).
    """

    def __init__(self, seed: int | None = None) -> None:
        """Start with no per-request generators and no buffers."""
        self._rng = np.random.Generator(np.random.PCG64(seed))
        self._generators: dict[str, np.random.Generator] = {}
        self._vocab = 0
        self._scaled: Floats = np.empty(0, np.float32)
        self._weights: Floats = np.empty(0, np.float32)
        self._mask: npt.NDArray[np.bool_] = np.empty(0, np.bool_)

    def release(self, request_id: str) -> None:
        """Drop a finished request's generator."""
        self._generators.pop(request_id, None)

    def _generator(self, seq: Sequence) -> np.random.Generator:
        """The request's own generator, or the shared one for an unseeded request."""
        seed = seq.params.seed
        if seed is None:
            return self._rng
        gen = self._generators.get(seq.request_id)
        if gen is None:
            gen = np.random.Generator(np.random.PCG64(seed & _SEED_MASK))
            self._generators[seq.request_id] = gen
        return gen

    def sample(self, logits: npt.NDArray[np.floating[Any]], seqs: list[Sequence]) -> list[int]:
        """Return one token id per row of ``logits`` (shape ``[len(seqs), vocab]``).

        Callers apply penalties and grammar masks to ``logits`` before this last stage.
        """
        if logits.ndim != 2 or logits.shape[0] != len(seqs):
            raise ValueError(f"logits of shape {logits.shape} for {len(seqs)} sequences")
        greedy = [s.params.greedy for s in seqs]
        if all(greedy):
            picked: list[int] = logits.argmax(axis=-1).tolist()
            return picked
        chosen = [0] * len(seqs)
        for row, seq in enumerate(seqs):
            if greedy[row]:
                # numpy's argmax is torch's: the first largest, a NaN before any number.
                chosen[row] = int(logits[row].argmax())
            else:
                chosen[row] = self._sample_row(logits[row], seq)
        return chosen

    def sample_each(
        self, logits: npt.NDArray[np.floating[Any]], seqs: list[Sequence]
    ) -> list[int | Exception]:
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

    def _buffers(self, vocab: int) -> None:
        """Size the row buffers for ``vocab`` tokens (the weights padded to whole blocks)."""
        if vocab != self._vocab:
            self._vocab = vocab
            self._scaled = np.empty(vocab, np.float32)
            # The padding stays zero: only the first ``vocab`` weights are ever written.
            self._weights = np.zeros(-(-vocab // _BLOCK) * _BLOCK, np.float32)
            self._mask = np.empty(vocab, np.bool_)

    def _scale(self, logits: npt.NDArray[np.floating[Any]], temperature: float) -> Floats:
        """The row divided by its temperature in float32, in the sampler's row buffer."""
        self._buffers(logits.shape[0])
        scaled = self._scaled
        divisor = np.float32(temperature)
        if logits.dtype == np.float32 and divisor != 1:
            np.divide(logits, divisor, out=scaled)
        else:
            # Other dtypes become float32 first, as the torch sampler's ``.float()``.
            np.copyto(scaled, logits, casting="same_kind")
            if divisor != 1:
                np.divide(scaled, divisor, out=scaled)
        return scaled

    def _kept(self, logits: npt.NDArray[np.floating[Any]], seq: Sequence) -> npt.NDArray[np.bool_]:
        """Which tokens of a sampled row top-k, top-p and min-p keep (for tests: the sampler's)."""
        scaled = self._scale(logits, seq.params.temperature)
        top = scaled.max()
        k, p = _limits(seq, scaled.shape[0])
        cut = _min_p_cut(seq, top)
        if k == scaled.shape[0] and p >= 1.0:
            return scaled >= cut
        return scaled >= max(self._floor(scaled, top, k, p)[0], cut)

    def _sample_row(self, logits: npt.NDArray[np.floating[Any]], seq: Sequence) -> int:
        """Sample one row: temperature, then top-k / top-p / min-p, then the inverse-CDF draw."""
        vocab = int(logits.shape[0])
        scaled = self._scale(logits, seq.params.temperature)
        # One draw per sampled row, undefined rows included, as the torch sampler draws: a
        # seeded request's stream does not depend on its logits.
        uniform = self._generator(seq).random()
        top = scaled.max()
        if not np.isfinite(top):
            return vocab - 1
        k, p = _limits(seq, vocab)
        cut = _min_p_cut(seq, top)
        if k == vocab and p >= 1.0:
            if cut == -np.inf:
                _exp_into(scaled, top, self._weights[:vocab])
                return _draw(self._weights, uniform)
            floor, weighed = cut, False
        else:
            floor, weighed = self._floor(scaled, top, k, p)
            floor = max(floor, cut)
        mask = np.greater_equal(scaled, floor, out=self._mask)
        if np.count_nonzero(mask) <= _FEW:
            return _draw_among(scaled, np.flatnonzero(mask), top, uniform)
        weights = self._weights[:vocab]
        if not weighed:
            _exp_into(scaled, top, weights)
        np.multiply(weights, mask, out=weights)
        return _draw(self._weights, uniform)

    def _floor(self, scaled: Floats, top: np.float32, k: int, p: float) -> tuple[np.float32, bool]:
        """The lowest kept scaled logit under top-k ``k`` and top-p ``p``.

        Also says whether the row's weights were left in the weight buffer on the way.
        """
        vocab = scaled.shape[0]
        if p >= 1.0:
            return self._kth_largest(scaled, top, k), False
        if k <= _PARTITION_K:
            ranked = self._largest(scaled, top, k)
            cumulative = np.cumsum(np.exp(ranked.astype(np.float64) - top))
            return _edge(ranked, cumulative, p * cumulative[-1]), False
        weights = self._weights
        if k == vocab:
            # Top-p alone weighs its nucleus by the whole row's softmax.
            _exp_into(scaled, top, weights[:vocab])
            total = float(_block_sums(weights).sum())
            for candidates in self._pools(scaled, top, 1):
                ranked = np.sort(candidates)[::-1]
                cumulative = np.cumsum(np.exp(ranked.astype(np.float64) - top))
                if cumulative[-1] >= p * total:
                    return _edge(ranked, cumulative, p * total), True
            # The nucleus ends beyond the spans (a flat row): sort the whole row.
            return _sorted_edge(scaled, top, vocab, p, total), True
        # Top-k beyond the partition range with top-p: sort whole, weigh the top k alone.
        return _sorted_edge(scaled, top, k, p, None), False

    def _pools(self, scaled: Floats, top: np.float32, least: int) -> Iterator[Floats]:
        """The logits within each span of the largest, where at least ``least`` and few lie.

        Each pool is exactly the row's top ranks, so a search that ends inside one is the
        whole row's; none once a span holds more than ``_CANDIDATES`` (a flat row).
        """
        for span in _SPANS:
            mask = np.greater_equal(scaled, top - np.float32(span), out=self._mask)
            count = int(np.count_nonzero(mask))
            if count > _CANDIDATES:
                return
            if count >= least:
                yield scaled[np.flatnonzero(mask)]

    def _kth_largest(self, scaled: Floats, top: np.float32, k: int) -> np.float32:
        """The ``k``-th largest scaled logit: top-k's floor (a selection, not a sort)."""
        pool = next(self._pools(scaled, top, k), scaled)
        kth: np.float32 = np.partition(pool, pool.shape[0] - k)[pool.shape[0] - k]
        return kth

    def _largest(self, scaled: Floats, top: np.float32, k: int) -> Floats:
        """The ``k`` largest scaled logits, descending (a partition, not a sort of the row)."""
        pool = next(self._pools(scaled, top, k), scaled)
        part = np.partition(pool, pool.shape[0] - k)[pool.shape[0] - k :]
        ranked: Floats = np.sort(part)[::-1]
        return ranked


def _limits(seq: Sequence, vocab: int) -> tuple[int, float]:
    """The row's top-k (``vocab`` when off) and its top-p as the float32 the torch sampler uses.

    A top_p just below 1 that rounds to 1 in float32 filters nothing (the torch sampler then
    drops at most its float32-saturated tail).
    """
    top_k = seq.params.top_k
    return (top_k if 0 < top_k < vocab else vocab), float(np.float32(seq.params.top_p))


def _min_p_cut(seq: Sequence, top: np.float32) -> np.float32:
    """Min-p's floor: the row's largest scaled logit plus the margin, in float32; -inf when off."""
    offset = np.float32(margin(seq.params.min_p))
    if offset == -np.inf:
        return offset
    cut: np.float32 = top + offset
    return cut


def _edge(ranked: Floats, cumulative: npt.NDArray[np.float64], target: float) -> np.float32:
    """The lowest kept logit: ranked's first whose cumulative weight reaches ``target``.

    The mass before that token is below p and before the next one is not (the definition);
    a set whose mass never reaches it (rounding) keeps every ranked token.
    """
    index = int(np.searchsorted(cumulative, target, side="left"))
    floor: np.float32 = ranked[min(index, ranked.shape[0] - 1)]
    return floor


def _exp_into(scaled: Floats, top: np.float32, out: Floats) -> None:
    """``exp(scaled - top)`` into ``out``: every weight in (0, 1], the largest exactly 1."""
    np.subtract(scaled, top, out=out)
    np.exp(out, out=out)


def _block_sums(weights: Floats) -> npt.NDArray[np.float64]:
    """Each ``_BLOCK`` of ``weights`` (whole blocks long) summed pairwise, as float64."""
    sums: npt.NDArray[np.float64] = weights.reshape(-1, _BLOCK).sum(axis=1).astype(np.float64)
    return sums


def _sorted_edge(
    scaled: Floats, top: np.float32, k: int, p: float, total: float | None
) -> np.float32:
    """Top-p's floor from the whole row sorted, for nuclei beyond the span (flat rows).

    ``total`` is the row's weight (top-p alone); None weighs the top ``k`` alone.
    """
    ranked = np.sort(scaled)[::-1][:k].copy()
    weights = np.zeros(-(-k // _BLOCK) * _BLOCK, np.float32)
    _exp_into(ranked, top, weights[:k])
    ends = np.cumsum(_block_sums(weights))
    index = _locate(weights, ends, p * (ends[-1] if total is None else total), "left")
    floor: np.float32 = ranked[min(index, k - 1)]
    return floor


def _locate(
    weights: Floats, ends: npt.NDArray[np.float64], target: float, side: Literal["left", "right"]
) -> int:
    """The first index whose running weight reaches (left) or exceeds (right) ``target``.

    ``len(weights)`` when none does.

    ``ends`` (the running sum of the block sums) finds the block, one block's float64
    cumulative sum the token. Where the two disagree by rounding, the block's first index
    reaching its own end is taken: a token of positive weight.
    """
    block = int(np.searchsorted(ends, target, side=side))
    if block == ends.shape[0]:
        return int(weights.shape[0])
    start = block * _BLOCK
    running = np.cumsum(weights[start : start + _BLOCK], dtype=np.float64)
    if block:
        running += ends[block - 1]
    index = int(np.searchsorted(running, target, side=side))
    if index == _BLOCK:
        index = int(np.searchsorted(running, running[-1], side="left"))
    return start + index


def _draw(weights: Floats, uniform: float) -> int:
    """The token a uniform number in [0, 1) lands on under ``weights`` (zero-padded blocks).

    right: the first token whose running weight exceeds the target, never a zero-weight one
    even for a draw of exactly 0; a product rounded up to the total takes the first token
    reaching the total, also of positive weight.
    """
    ends = np.cumsum(_block_sums(weights))
    total = float(ends[-1])
    index = _locate(weights, ends, uniform * total, "right")
    if index == weights.shape[0]:
        index = _locate(weights, ends, total, "left")
    return index


def _draw_among(scaled: Floats, kept: npt.NDArray[np.intp], top: np.float32, uniform: float) -> int:
    """The draw over a few kept tokens (vocabulary order), weighed in float64."""
    cumulative = np.cumsum(np.exp(scaled[kept].astype(np.float64) - top))
    index = int(np.searchsorted(cumulative, uniform * cumulative[-1], side="right"))
    if index == cumulative.shape[0]:
        index = int(np.searchsorted(cumulative, cumulative[-1], side="left"))
    return int(kept[index])
