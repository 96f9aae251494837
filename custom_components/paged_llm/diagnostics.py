"""Diagnostics download: settings, engine figures and versions; prompts are left out."""

from __future__ import annotations

import dataclasses
import platform
from importlib import metadata
from typing import Any

from homeassistant.components.diagnostics import async_redact_data
from homeassistant.const import CONF_PROMPT
from homeassistant.const import __version__ as HA_VERSION
from homeassistant.core import HomeAssistant
from homeassistant.loader import async_get_integration

from paged_llm.engine.errors import EngineDeadError

from .const import DOMAIN
from .runtime import PagedLLMConfigEntry

# Instructions may name people and places in the home; they are not needed to debug.
TO_REDACT = {CONF_PROMPT}


def _package_version(name: str) -> str | None:
    """The installed version of a package, if installed."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _versions() -> dict[str, Any]:
    """Versions of the pieces that run the model (blocking: reads package metadata)."""
    versions: dict[str, Any] = {
        name: _package_version(name)
        for name in ("paged-llm", "torch", "transformers", "triton", "gguf", "accelerate")
    }
    versions["python"] = platform.python_version()
    versions["platform"] = platform.platform()
    try:
        import torch

        versions["cuda_available"] = torch.cuda.is_available()
        if torch.cuda.is_available():
            versions["cuda_device"] = torch.cuda.get_device_name(0)
            versions["cuda_version"] = torch.version.cuda
    except ImportError:
        versions["cuda_available"] = False
    return versions


def _engine_figures(entry: PagedLLMConfigEntry) -> dict[str, Any]:
    """What the running engine reports about itself and its KV pool."""
    data = entry.runtime_data
    engine = data.engine
    figures: dict[str, Any] = {
        "is_running": engine.is_running,
        "error": repr(engine.error) if engine.error else None,
        "config": {
            **dataclasses.asdict(data.config),
            "cache_dir": str(data.config.cache_dir),
            "kv_layout": str(data.config.kv_layout),
        },
    }
    try:
        llm_engine = engine.engine
    except EngineDeadError:
        return figures
    loaded = llm_engine.loaded
    figures.update(
        {
            "model": loaded.name,
            "device": str(loaded.device),
            "dtype": str(loaded.dtype),
            "max_model_len": llm_engine.max_model_len,
            "num_kv_blocks": llm_engine.num_kv_blocks,
            "block_size": data.config.block_size,
            "eos_token_ids": list(loaded.eos_token_ids),
        }
    )
    snapshot = engine.metrics()
    figures["metrics"] = {
        **dataclasses.asdict(snapshot),
        "prefix_cache_hit_rate": snapshot.prefix_cache_hit_rate,
        "kv_utilization": snapshot.kv_utilization,
    }
    return figures


async def async_get_config_entry_diagnostics(
    hass: HomeAssistant, entry: PagedLLMConfigEntry
) -> dict[str, Any]:
    """Return diagnostics for a config entry."""
    integration = await async_get_integration(hass, DOMAIN)
    versions = await hass.async_add_executor_job(_versions)
    versions["integration"] = str(integration.version)
    versions["home_assistant"] = HA_VERSION
    return {
        "entry": {
            "title": entry.title,
            "data": dict(entry.data),
            "subentries": [
                {
                    "type": subentry.subentry_type,
                    "title": subentry.title,
                    "data": async_redact_data(dict(subentry.data), TO_REDACT),
                }
                for subentry in entry.subentries.values()
            ],
        },
        "engine": _engine_figures(entry),
        "versions": versions,
    }
