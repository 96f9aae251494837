"""Where the model can run: whether the engine works in this process, and its installation."""

from __future__ import annotations

import enum
import importlib
import importlib.util
import platform
import sys
from importlib import metadata

from homeassistant.core import HomeAssistant
from homeassistant.requirements import async_process_requirements

from paged_llm.extras import ENGINE_EXTRA

from .const import DOMAIN
from .embedded import EngineImportError, TorchUnavailableError, import_engine_module

LIBRARY = "paged-llm"
EXTRA = "engine"


class EngineState(enum.StrEnum):
    """Whether the engine can run here, and what stands in the way (a translation key)."""

    READY = "ready"
    # Not installed, but installable: Home Assistant installs the extra on request.
    MISSING = "missing"
    MUSL = "embedded_musl"
    TORCH_UNAVAILABLE = "torch_unavailable"
    ENGINE_UNAVAILABLE = "engine_unavailable"


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


def engine_requirements() -> list[str]:
    """The engine extra's requirements, read from the installed library's own metadata."""
    from packaging.requirements import Requirement

    wanted: list[str] = []
    for line in metadata.requires(LIBRARY) or []:
        req = Requirement(line)
        if req.marker is None or not req.marker.evaluate({"extra": EXTRA}):
            continue
        # Plain name and version: Home Assistant checks each against what is installed.
        wanted.append(f"{req.name}{req.specifier}")
    if not wanted:
        raise EngineImportError(f"{LIBRARY} declares no '{EXTRA}' extra; install {ENGINE_EXTRA}")
    return wanted


async def async_install_engine(hass: HomeAssistant) -> None:
    """Install the engine extra through Home Assistant's requirements, then import it."""
    requirements = await hass.async_add_executor_job(engine_requirements)
    await async_process_requirements(hass, DOMAIN, requirements, is_built_in=False)
    # Finders cache directory listings: let them see what was just installed.
    importlib.invalidate_caches()
    await hass.async_add_executor_job(import_engine_module)
