"""One step's chunks packed into flat arrays for a forward pass, on numpy (no torch).

Both runners pack a step the same way (no padding): every scheduled token's id and absolute
position, the chunk (sequence row) it belongs to, the pool slot its K/V goes to, the block
tables padded to one width, and the rows whose logits are needed (each sampling chunk's
last token, then the rows scoring prompt tokens of requests that asked for prompt log
probabilities: the row at position q gives the log probability of the token at q + 1).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from paged_llm.engine.core.scheduler import SchedulerOutput

Longs = npt.NDArray[np.int64]


@dataclass(slots=True, frozen=True)
class StepInputs:
    """A packed step: one entry per token (ids, positions, seq_of_token, slots) or chunk."""

    ids: Longs
    positions: Longs
    # Which chunk (row of ``tables``) each token belongs to.
    seq_of_token: Longs
    slots: Longs
    tables: Longs  # [chunks, widest table], zero-padded
    # Per chunk: first position, token count, and the context length after the step.
    starts: Longs
    lens: Longs
    ends: Longs
    cu: Longs  # cumulative token counts, [chunks + 1]
    # The chunks that sample a token, and the token rows whose logits are kept (one per
    # sampling chunk; the first chunk's last row when none samples, as a forward needs one).
    sample_rows: list[int]
    keep: Longs
    # Prompt scoring: (chunk, first scored position, count) per chunk with rows to score;
    # their rows follow the sampling rows in ``keep``, in this order.
    scored: list[tuple[int, int, int]]
    num_sample_keep: int
    # The number of sequences of a decode-only step (the thread tuner's key), else None.
    decode_shape: int | None


def pack_step(
    output: SchedulerOutput, block_tables: list[list[int]], block_size: int
) -> StepInputs:
    """Pack ``output``'s chunks (non-empty) with their block tables, in chunk order."""
    chunks = output.chunks
    ids: list[int] = []
    starts = np.empty(len(chunks), dtype=np.int64)
    lens = np.empty(len(chunks), dtype=np.int64)
    for i, chunk in enumerate(chunks):
        ids.extend(chunk.seq.token_ids[chunk.start : chunk.start + chunk.num_tokens])
        starts[i] = chunk.start
        lens[i] = chunk.num_tokens
    ends = starts + lens
    cu = np.zeros(len(chunks) + 1, dtype=np.int64)
    np.cumsum(lens, out=cu[1:])
    # Absolute position of every packed token: its chunk's start plus its offset.
    seq_of_token = np.repeat(np.arange(len(chunks), dtype=np.int64), lens)
    positions = np.arange(cu[-1], dtype=np.int64) - cu[:-1][seq_of_token] + starts[seq_of_token]
    width = max(len(t) for t in block_tables)
    tables = np.zeros((len(chunks), width), dtype=np.int64)
    for i, table in enumerate(block_tables):
        tables[i, : len(table)] = table
    slots = tables[seq_of_token, positions // block_size] * block_size + positions % block_size
    sample_rows = [i for i, chunk in enumerate(chunks) if chunk.samples]
    keep = cu[1:][sample_rows] - 1 if sample_rows else cu[1:2] - 1
    num_sample_keep = len(keep)
    scored: list[tuple[int, int, int]] = []
    extra: list[Longs] = []
    for i, chunk in enumerate(chunks):
        seq = chunk.seq
        end = seq.num_prompt_tokens  # rows score positions next_scored .. end - 1
        if seq.next_scored >= end:
            continue
        first = max(seq.next_scored, chunk.start + 1)
        last = min(end, chunk.start + chunk.num_tokens + 1)
        if first < last:
            scored.append((i, first, last - first))
            row = int(cu[i]) + first - 1 - chunk.start
            extra.append(np.arange(row, row + last - first, dtype=np.int64))
    if extra:
        keep = np.concatenate([keep, *extra])
    # Steps that only decode compare by their number of sequences; others not at all.
    decode = all(chunk.num_tokens == 1 for chunk in chunks)
    return StepInputs(
        ids=np.array(ids, dtype=np.int64),
        positions=positions,
        seq_of_token=seq_of_token,
        slots=slots,
        tables=tables,
        starts=starts,
        lens=lens,
        ends=ends,
        cu=cu,
        sample_rows=sample_rows,
        keep=keep,
        scored=scored,
        num_sample_keep=num_sample_keep,
        decode_shape=len(chunks) if decode else None,
    )
