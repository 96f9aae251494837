"""Whether the engine can run in this process, and importing it (and torch, when needed).

The engine itself needs no torch: a GGUF model on the CPU runs on the numpy runner, from
the light ``paged-llm[cpu]`` extra. Only settings on the torch path (a GPU, a model that is
not a GGUF file) need ``paged-llm[engine]``, and torch is imported for those alone.
"""

from __future__ import annotations

import enum
import importlib
import platform
import sys
from types import ModuleType
from typing import TYPE_CHECKING

from homeassistant.core import HomeAssistant

from paged_llm.extras import CPU, ENGINE, EXTRA_MODULES, PREBUILT_MACHINES, missing_modules

from .errors import EngineImportError, TorchUnavailableError

if TYPE_CHECKING:
    from paged_llm.engine.api import EngineConfig


class EngineState(enum.StrEnum):
    """Whether the engine can run here, and what stands in the way (a translation key)."""

    READY = "ready"
    # Not installed, but installable: Home Assistant installs the cpu extra on request.
    MISSING = "missing"
    MUSL = "embedded_musl"
    ENGINE_UNAVAILABLE = "engine_unavailable"


def import_engine_module() -> ModuleType:
    """Import the engine's public module (blocking; run in an executor). No torch."""
    try:
        return importlib.import_module("paged_llm.engine.api")
    except (ImportError, OSError) as err:
        raise EngineImportError(str(err)) from err


async def async_import_engine(hass: HomeAssistant) -> ModuleType:
    """Import the engine off the event loop."""
    return await hass.async_add_executor_job(import_engine_module)


def needed_extra(config: EngineConfig) -> str:
    """The extra ``config`` runs on: ``engine`` on the torch path, else ``cpu``.

    The engine's own choice (``runner_for``), as it makes it where torch is missing: a GGUF
    file on a CPU needs no torch; a GPU, a model folder or Hugging Face id, or settings the
    numpy runner does not run do.
    """
    from paged_llm.engine.api import runner_for

    return ENGINE if runner_for(config) == "torch" else CPU


def extra_installed(extra: str) -> bool:
    """Whether every module of ``extra`` can be found (looked up, not imported: cheap)."""
    return not missing_modules(EXTRA_MODULES[extra])


def import_torch() -> None:
    """Import torch for settings on the torch path (blocking: seconds the first time).

    Raises TorchUnavailableError when torch cannot be imported, as on musl-based systems
    such as Home Assistant OS, where PyTorch publishes no wheels.
    """
    try:
        importlib.import_module("torch")
    except (ImportError, OSError) as err:
        raise TorchUnavailableError(str(err)) from err


def prepare_runner(config: EngineConfig) -> None:
    """Import what ``config``'s runner needs beyond the engine: torch on the torch path."""
    if needed_extra(config) == ENGINE:
        import_torch()


async def async_prepare_runner(hass: HomeAssistant, config: EngineConfig) -> None:
    """Import what ``config``'s runner needs beyond the engine, off the event loop."""
    await hass.async_add_executor_job(prepare_runner, config)


def is_musl() -> bool:
    """Whether this Linux uses musl (Home Assistant OS, the container image)."""
    return sys.platform == "linux" and platform.libc_ver()[0] != "glibc"


def musl_reason() -> str:
    """The C library, as the forms name it."""
    return f"{platform.libc_ver()[0] or 'musl'} C library"


def engine_state() -> tuple[EngineState, str]:
    """The engine's state here and the reason behind it (blocking: imports the engine).

    On musl (Home Assistant OS, the container image) the engine runs where the cpu extra's
    packages and the prebuilt kernels are published (x86_64, aarch64): installed as on
    glibc. Where they are not, or the kernels can neither load prebuilt nor be built (no
    compiler there), the state is MUSL and its reason names what is missing.
    """
    if missing := missing_modules(EXTRA_MODULES[CPU]):
        if is_musl() and (machine := platform.machine()) not in PREBUILT_MACHINES:
            return EngineState.MUSL, (
                f"the engine's packages with native code (numpy, tokenizers, llguidance) "
                f"and its prebuilt kernels are published for x86_64 and aarch64, not {machine}"
            )
        return EngineState.MISSING, ", ".join(missing)
    try:
        engine = import_engine_module()
    except EngineImportError as err:
        return EngineState.ENGINE_UNAVAILABLE, str(err)
    if is_musl() and (why := engine.kernels_unavailable()):
        return EngineState.MUSL, why
    return EngineState.READY, ""
