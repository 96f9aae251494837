"""Decode attention over the paged pool on the CPU: float32 queries (cpu_attention.c).

The torch path copies each decoding sequence's blocks out of the pool before SDPA reads
them; at a long context that copy is most of a decode step's attention (a summary's 2,000
tokens, a home's long Assist prompt). The C kernel reads the blocks where they are and
splits long contexts across the cores. The pool may hold float32, float16 or bfloat16: a
16-bit pool is converted as it is read, with float32 sums, and halves the bytes read. Built
into the CPU forward's library (native_build.py; alone where that one does not build);
where it cannot be built, or for queries in other dtypes, the torch path runs.

The torch reference path (kernels/reference.py) is this binding's only caller and hands it
torch tensors, but the module imports no torch: it reads only their methods, so the
CPU forward's binding (forward.py), which shares its constants, imports no torch either.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from paged_llm.kernels.cpu import native_build

if TYPE_CHECKING:
    import torch

SOURCE = Path(__file__).parent / "src" / "cpu_attention.c"
# The heads the kernel takes (cpu_attention.c): a multiple of 16 values, at most MAX_DIM.
MAX_DIM = 256
_PTR = ctypes.c_void_p
_I64 = ctypes.c_int64
# The pool dtypes the kernel reads, by name (numpy's, torch's without "torch."), as
# cpu_attention.c numbers them (KV_FLOAT32 ...).
KINDS: dict[str, int] = {"float32": 0, "float16": 1, "bfloat16": 2}


def kind_of(dtype: object) -> int | None:
    """cpu_attention.c's number of a pool dtype (a numpy or torch dtype), or None if it has none."""
    return KINDS.get(str(dtype).removeprefix("torch."))


def unavailable(build_dir: Path | None = None) -> str | None:
    """Why the kernel cannot run here (no compiler, a failed build), or None when it can.

    The first call builds and loads it, in build_dir (the user's cache folder when None);
    later calls answer from that attempt.
    """
    return _LIBRARY.unavailable(build_dir)


def load_library(build_dir: Path, source: Path = SOURCE) -> tuple[ctypes.CDLL | None, str | None]:
    """Load the kernel (from the forward library where it builds); or say why not.

    Built once per source, compiler and CPU (native_build.load_part).
    """
    lib, reason = native_build.load_part(build_dir, source, "cpu_attention")
    if lib is None:
        return None, reason
    lib.paged_decode.argtypes = [_PTR, _PTR, _PTR, _I64, _PTR, _I64, _I64, _PTR, _PTR, _PTR, _PTR]
    lib.paged_decode.argtypes += [_I64] * 5 + [ctypes.c_float, ctypes.c_float, _PTR]
    lib.paged_decode.restype = ctypes.c_int
    return lib, None


def takes(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor) -> bool:
    """Whether the kernel runs this step's decodes: float32 queries on the CPU, within its limits.

    The caches are both float32, both float16 or both bfloat16, and contiguous.
    """
    if query.device.type != "cpu" or kind_of(query.dtype) != KINDS["float32"]:
        return False
    if kind_of(key_cache.dtype) is None or value_cache.dtype != key_cache.dtype:
        return False
    if not (key_cache.is_contiguous() and value_cache.is_contiguous()):
        return False
    dim = query.shape[-1]
    return dim % 16 == 0 and dim <= MAX_DIM and unavailable() is None


@dataclass(slots=True, frozen=True)
class DecodePlan:
    """The step's decoding sequences as the kernel reads them (the same for every layer)."""

    seqs: torch.Tensor  # each one's row of the block tables
    rows: torch.Tensor  # each one's query row in the packed step
    first: torch.Tensor  # each one's first visible key position (a sliding window's start)
    lens: torch.Tensor  # each one's context length
    tables: torch.Tensor  # int32 block tables, contiguous

    @staticmethod
    def of(
        block_tables: torch.Tensor,
        seqs: list[int],
        rows: list[int],
        first: list[int],
        lens: list[int],
    ) -> DecodePlan:
        """Pack the lists the host worked out into the arrays the kernel reads."""

        def longs(values: list[int]) -> torch.Tensor:
            """An int64 array (``.long()``: an empty list would make a float one)."""
            return block_tables.new_tensor(values, device="cpu").long()

        tables = block_tables.int().contiguous()
        return DecodePlan(longs(seqs), longs(rows), longs(first), longs(lens), tables)


def decode(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    plan: DecodePlan,
    scale: float,
    softcap: float | None,
    out: torch.Tensor,
) -> bool:
    """Attend each planned sequence's query row into ``out``; False if the kernel could not.

    ``takes`` must hold. False when the kernel refuses the head size or found no memory for
    its partial sums: the caller then takes the torch path. IndexError when a block table
    names a block outside the pool (nothing is read there).
    """
    lib = _LIBRARY.get()
    query = query.contiguous()
    # The kernel writes float32 rows in place; anything else gets them through a copy.
    direct = out.is_contiguous() and out.dtype == query.dtype  # takes() made that float32
    target = out if direct else query.new_empty(query.shape)
    heads, dim = query.shape[1:]
    _, block_size, kv_heads, _ = key_cache.shape
    done = lib.paged_decode(
        query.data_ptr(),
        key_cache.data_ptr(),
        value_cache.data_ptr(),
        kind_of(key_cache.dtype),
        plan.tables.data_ptr(),
        plan.tables.shape[1],
        key_cache.shape[0],
        plan.seqs.data_ptr(),
        plan.rows.data_ptr(),
        plan.first.data_ptr(),
        plan.lens.data_ptr(),
        len(plan.seqs),
        heads,
        kv_heads,
        dim,
        block_size,
        scale,
        softcap or 0.0,
        target.data_ptr(),
    )
    if done == -2:
        # What index_select raises on the torch path; the kernel read nothing.
        raise IndexError(
            f"a block table names a block outside the pool of {key_cache.shape[0]} blocks"
        )
    if done != 0:
        return False
    if not direct:
        out.index_copy_(0, plan.rows, target.index_select(0, plan.rows).to(out.dtype))
    return True


# One build per process, by the first caller.
_LIBRARY = native_build.Library("CPU decode attention kernels", load_library)
