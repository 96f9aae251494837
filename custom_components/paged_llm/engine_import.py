"""Whether the engine can run in this process, and importing it (with torch) off the loop."""

from __future__ import annotations

import enum
import importlib
import importlib.util
import platform
import sys
from types import ModuleType

from homeassistant.core import HomeAssistant

from .errors import EngineImportError, TorchUnavailableError


class EngineState(enum.StrEnum):
    """Whether the engine can run here, and what stands in the way (a translation key)."""

    READY = "ready"
    # Not installed, but installable: Home Assistant installs the extra on request.
    MISSING = "missing"
    MUSL = "embedded_musl"
    TORCH_UNAVAILABLE = "torch_unavailable"
    ENGINE_UNAVAILABLE = "engine_unavailable"


def import_engine_module() -> ModuleType:
    """Import the engine and torch (blocking: seconds on first import; run in an executor).

    Raises TorchUnavailableError when torch itself cannot be imported, as on musl-based
    systems such as Home Assistant OS, where PyTorch publishes no wheels.
    """
    try:
        importlib.import_module("torch")
    except (ImportError, OSError) as err:
        raise TorchUnavailableError(str(err)) from err
    try:
        return importlib.import_module("paged_llm.engine.api")
    except (ImportError, OSError) as err:
        raise EngineImportError(str(err)) from err


async def async_import_engine(hass: HomeAssistant) -> ModuleType:
    """Import the engine off the event loop."""
    return await hass.async_add_executor_job(import_engine_module)


def _is_musl() -> bool:
    """Whether this Linux uses musl (Home Assistant OS, the container image): no PyTorch."""
    return sys.platform == "linux" and platform.libc_ver()[0] != "glibc"


def _torch_installed() -> bool:
    """Whether a torch distribution is there to import (a blocked one counts as there)."""
    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        return True


def engine_state() -> tuple[EngineState, str]:
    """The engine's state here and the reason behind it (blocking: may import torch)."""
    if not _torch_installed():
        if _is_musl():
            return EngineState.MUSL, f"{platform.libc_ver()[0] or 'musl'} C library"
        return EngineState.MISSING, ""
    try:
        import_engine_module()
    except TorchUnavailableError as err:
        return EngineState.TORCH_UNAVAILABLE, str(err)
    except EngineImportError as err:
        return EngineState.ENGINE_UNAVAILABLE, str(err)
    return EngineState.READY, ""
