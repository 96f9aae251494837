"""Diagnostics download: settings, engine figures and versions; prompts are left out."""

from __future__ import annotations

import dataclasses
import platform
from importlib import metadata
from typing import Any

from homeassistant.components.diagnostics import async_redact_data
from homeassistant.const import CONF_API_KEY, CONF_PROMPT
from homeassistant.const import __version__ as HA_VERSION
from homeassistant.core import HomeAssistant
from homeassistant.loader import async_get_integration

from .const import DOMAIN
from .runtime import PagedLLMConfigEntry

# Instructions may name people and places in the home; they are not needed to debug.
# A server's API key is a secret.
TO_REDACT = {CONF_API_KEY, CONF_PROMPT}


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


def _backend_figures(entry: PagedLLMConfigEntry) -> dict[str, Any]:
    """What the backend reports about itself, and its latest metrics."""
    backend = entry.runtime_data.backend
    figures = backend.diagnostics()
    snapshot = backend.metrics()
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
            "data": async_redact_data(dict(entry.data), TO_REDACT),
            "subentries": [
                {
                    "type": subentry.subentry_type,
                    "title": subentry.title,
                    "data": async_redact_data(dict(subentry.data), TO_REDACT),
                }
                for subentry in entry.subentries.values()
            ],
        },
        "engine": _backend_figures(entry),
        "versions": versions,
    }
