"""Token bitmasks on numpy: one bit per token, 32 to an int32 word, applied to logits in place.

The torch runner hands its CPU float32 logits over as a numpy view (no copy) and turns a
mask into a torch tensor only where its logits live on a GPU; the numpy runner applies
them as they are.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt


def allocate(rows: int, vocab_size: int) -> npt.NDArray[np.int32]:
    """A bitmask of ``rows`` rows over ``vocab_size`` tokens, every token allowed."""
    return np.full((rows, (vocab_size + 31) // 32), -1, dtype=np.int32)


def allowed(bitmask: npt.NDArray[np.int32], vocab_size: int) -> npt.NDArray[np.bool_]:
    """Per row, whether each of the first ``vocab_size`` tokens is allowed."""
    # Bit i of the little-endian words allows token i; unpackbits reads bytes low bit first.
    words = np.ascontiguousarray(bitmask).astype("<i4", copy=False)
    bits = np.unpackbits(words.view(np.uint8), axis=-1, bitorder="little")
    return bits[..., :vocab_size].astype(bool)


def apply(
    logits: npt.NDArray[np.floating],
    bitmask: npt.NDArray[np.int32],
    rows: Sequence[int],
) -> None:
    """Set, in place, the logits of tokens a row's mask refuses to -inf (only ``rows``).

    Columns past the mask (a model's padded vocabulary) are refused too; a mask wider
    than the logits (a tokenizer larger than the model's rows) is cut to them.
    """
    if not rows:
        return
    index = np.asarray(rows, dtype=np.intp)
    vocab = logits.shape[-1]
    width = min(vocab, bitmask.shape[-1] * 32)
    ok = allowed(bitmask[index], width)
    block = logits[index]
    block[:, :width] = np.where(ok, block[:, :width], -np.inf)
    block[:, width:] = -np.inf
    logits[index] = block


def force(logits: npt.NDArray[np.floating], row: int, token: int) -> None:
    """Leave ``token`` the only choice of ``row``."""
    logits[row] = -np.inf
    logits[row, token] = 0.0
