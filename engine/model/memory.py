"""Memory before loading: what is free, what a model's weights take, and the dtype that fits."""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

from paged_llm.engine.errors import ModelLoadError
from paged_llm.engine.model.loaded import device_type

if TYPE_CHECKING:
    import torch

_LOGGER = logging.getLogger(__name__)

# What the process needs beside the weights: torch and transformers themselves (about
# 0.9 GiB measured), and room for a first KV pool.
RUNTIME_BYTES = 1 << 30


def available_memory(device: Any) -> int:
    """Bytes free on ``device`` (a torch device, or a name: the numpy path's ``cpu``) now."""
    if device_type(device) == "cuda":
        import torch

        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def weight_bytes(model_config: Any, dtype: torch.dtype) -> int:
    """Bytes of the model's parameters in ``dtype``, counted on the meta device (free)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(model_config)  # type: ignore[no-untyped-call]
    count: int = sum(p.numel() for p in model.parameters())
    return count * dtype.itemsize


def fit_dtype(
    model_config: Any, dtype: torch.dtype, device: torch.device, fallback: torch.dtype | None
) -> torch.dtype:
    """``dtype`` when the weights fit in free memory, else ``fallback`` when that fits.

    Loading a model that does not fit would get the process killed (Home Assistant with
    it), so that is refused here with the sizes instead.
    """
    free = available_memory(device) - (RUNTIME_BYTES if device.type == "cpu" else 0)
    need = weight_bytes(model_config, dtype)
    if need <= free:
        return dtype
    if fallback is not None and need * fallback.itemsize // dtype.itemsize <= free:
        _LOGGER.warning(
            "The weights need %s in %s but %s is free: loading them in %s",
            _gib(need),
            _name(dtype),
            _gib(free),
            _name(fallback),
        )
        return fallback
    smaller = "" if dtype.itemsize <= 2 else " or dtype bfloat16 (half the memory)"
    raise ModelLoadError(
        f"the model's weights need {_gib(need)} in {_name(dtype)} but only {_gib(free)} of "
        f"memory is free beside the runtime; choose a smaller model{smaller}"
    )


def _gib(num_bytes: int) -> str:
    """Bytes as GiB for messages."""
    return f"{max(num_bytes, 0) / 2**30:.1f} GiB"


def _name(dtype: torch.dtype) -> str:
    """A dtype as the settings name it (float32, bfloat16)."""
    return str(dtype).removeprefix("torch.")
