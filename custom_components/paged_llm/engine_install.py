"""Installing an engine extra (`paged-llm[cpu]` or `[engine]`) by Home Assistant's installer."""

from __future__ import annotations

import importlib
from importlib import metadata

from homeassistant.core import HomeAssistant
from homeassistant.requirements import async_process_requirements

from paged_llm.extras import ENGINE, extra_spec

from .const import DOMAIN
from .engine_import import import_engine_module, import_torch
from .errors import EngineImportError

LIBRARY = "paged-llm"


def extra_requirements(extra: str) -> list[str]:
    """An extra's requirements, read from the installed library's own metadata."""
    from packaging.requirements import Requirement

    wanted: list[str] = []
    for line in metadata.requires(LIBRARY) or []:
        req = Requirement(line)
        if req.marker is None or not req.marker.evaluate({"extra": extra}):
            continue
        # Plain name and version: Home Assistant checks each against what is installed.
        wanted.append(f"{req.name}{req.specifier}")
    if not wanted:
        spec = extra_spec(extra)
        raise EngineImportError(f"{LIBRARY} declares no '{extra}' extra; install {spec}")
    return wanted


async def async_install_extra(hass: HomeAssistant, extra: str) -> None:
    """Install ``extra`` through Home Assistant's requirements, then import what it serves.

    ``cpu`` (numpy, tokenizers, ...: about 100 MB) makes the engine itself importable;
    ``engine`` adds PyTorch and transformers (gigabytes), and torch is imported to prove it.
    """
    requirements = await hass.async_add_executor_job(extra_requirements, extra)
    await async_process_requirements(hass, DOMAIN, requirements, is_built_in=False)
    # Finders cache directory listings: let them see what was just installed.
    importlib.invalidate_caches()
    await hass.async_add_executor_job(import_engine_module)
    if extra == ENGINE:
        await hass.async_add_executor_job(import_torch)
