"""Whether Triton can run here, found out lazily so the CPU path never imports it."""

from __future__ import annotations

import functools
import importlib


@functools.cache
def triton_import_error() -> str | None:
    """Return why `import triton` fails here, or None when it works."""
    try:
        importlib.import_module("triton.language")
    except Exception as exc:  # a broken install can raise more than ImportError
        return f"{type(exc).__name__}: {exc}"
    return None


def is_interpreted(kernel: object) -> bool:
    """Whether a jitted kernel runs in Triton's CPU interpreter (TRITON_INTERPRET=1 at import)."""
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(kernel, InterpretedFunction)


def next_power_of_2(n: int) -> int:
    """Smallest power of two >= n (Triton tiles need power-of-two extents)."""
    return 1 << max(n - 1, 0).bit_length()
