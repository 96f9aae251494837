"""Installing the engine: the `paged-llm[engine]` requirements, by Home Assistant's installer."""

from __future__ import annotations

import importlib
from importlib import metadata

from homeassistant.core import HomeAssistant
from homeassistant.requirements import async_process_requirements

from paged_llm.extras import ENGINE_EXTRA

from .const import DOMAIN
from .engine_import import import_engine_module
from .errors import EngineImportError

LIBRARY = "paged-llm"
EXTRA = "engine"


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
