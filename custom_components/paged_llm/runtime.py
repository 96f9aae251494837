"""The running engine of a config entry, and the glue that starts it and translates its errors."""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from homeassistant.config_entries import ConfigEntry
from homeassistant.const import CONF_DEVICE, CONF_MODEL
from homeassistant.core import HomeAssistant
from homeassistant.exceptions import HomeAssistantError, ServiceValidationError
from homeassistant.helpers.update_coordinator import DataUpdateCoordinator
from homeassistant.util.hass_dict import HassKey

from paged_llm.engine.config import EngineConfig
from paged_llm.engine.errors import (
    EngineDeadError,
    EngineError,
    InvalidSamplingParams,
    KVBudgetError,
    ModelLoadError,
    RequestRejected,
    UnsupportedModelError,
)
from paged_llm.engine.metrics import MetricsSnapshot

from .const import (
    CONF_BLOCK_SIZE,
    CONF_DTYPE,
    CONF_KV_BUDGET_MIB,
    CONF_MAX_MODEL_LEN,
    CONF_MAX_NUM_SEQS,
    DEFAULT_BLOCK_SIZE,
    DEFAULT_DEVICE,
    DEFAULT_DTYPE,
    DEFAULT_KV_BUDGET_MIB,
    DEFAULT_MAX_MODEL_LEN,
    DEFAULT_MAX_NUM_SEQS,
    DEFAULT_MODEL,
    DOMAIN,
)

if TYPE_CHECKING:
    from paged_llm.engine.async_engine import AsyncEngine

type PagedLLMConfigEntry = ConfigEntry[PagedLLMData]

# Engines the config flow started while testing a model, waiting for their entry's setup.
DATA_PENDING_ENGINES: HassKey[dict[str, AsyncEngine]] = HassKey(f"{DOMAIN}_pending_engines")

# Rejections caused by what the caller asked for, as opposed to the engine's state.
_CALLER_REJECTIONS = frozenset(
    {"empty_prompt", "context_too_long", "exceeds_kv_pool", "invalid_token"}
)
_KNOWN_REJECTIONS = _CALLER_REJECTIONS | {"queue_full"}


@dataclass
class PagedLLMData:
    """What a loaded entry holds: the engine, its settings and the pushed metrics."""

    engine: AsyncEngine
    config: EngineConfig
    coordinator: DataUpdateCoordinator[MetricsSnapshot]
    # The engine's service device, which the agents' devices hang off.
    device_id: str
    # Serialises reloads of the agent platforms when subentries change.
    platform_lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class TorchUnavailableError(Exception):
    """PyTorch cannot be imported on this system."""


class EngineImportError(Exception):
    """The paged_llm engine cannot be imported (a broken or partial install)."""


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
        return importlib.import_module("paged_llm.engine.async_engine")
    except (ImportError, OSError) as err:
        raise EngineImportError(str(err)) from err


async def async_import_engine(hass: HomeAssistant) -> ModuleType:
    """Import the engine off the event loop."""
    return await hass.async_add_executor_job(import_engine_module)


def hand_over_engine(hass: HomeAssistant, unique_id: str, engine: AsyncEngine) -> None:
    """Keep an engine the config flow started so the new entry's setup need not load again."""
    previous = hass.data.setdefault(DATA_PENDING_ENGINES, {}).pop(unique_id, None)
    if previous is not None:
        hass.async_create_background_task(previous.stop(), f"{DOMAIN} stop unclaimed engine")
    hass.data[DATA_PENDING_ENGINES][unique_id] = engine


def take_pending_engine(hass: HomeAssistant, unique_id: str | None) -> AsyncEngine | None:
    """The engine the config flow handed over for this entry, if any."""
    if unique_id is None:
        return None
    return hass.data.get(DATA_PENDING_ENGINES, {}).pop(unique_id, None)


async def async_stop_pending_engines(hass: HomeAssistant) -> None:
    """Stop engines no entry claimed (Home Assistant is stopping)."""
    pending = hass.data.pop(DATA_PENDING_ENGINES, {})
    for engine in pending.values():
        await engine.stop()


def normalize_model(model: str) -> str:
    """The canonical spelling of a model string: absolute for local paths, as given otherwise."""
    model = model.strip() or DEFAULT_MODEL
    if model.startswith(("/", "~", ".")):
        return str(Path(model).expanduser().absolute())
    return model


def engine_config(hass: HomeAssistant, data: Mapping[str, Any]) -> EngineConfig:
    """Build the engine settings from an entry's data (raises ValueError naming a bad one)."""
    max_model_len = int(data.get(CONF_MAX_MODEL_LEN, DEFAULT_MAX_MODEL_LEN))
    return EngineConfig(
        model=normalize_model(data.get(CONF_MODEL, DEFAULT_MODEL)),
        device=data.get(CONF_DEVICE, DEFAULT_DEVICE),
        dtype=data.get(CONF_DTYPE, DEFAULT_DTYPE),
        block_size=int(data.get(CONF_BLOCK_SIZE, DEFAULT_BLOCK_SIZE)),
        kv_budget=float(int(data.get(CONF_KV_BUDGET_MIB, DEFAULT_KV_BUDGET_MIB)) * 2**20),
        max_num_seqs=int(data.get(CONF_MAX_NUM_SEQS, DEFAULT_MAX_NUM_SEQS)),
        max_model_len=max_model_len or None,
        # Converted GGUF models are kept here: rebuildable, so outside backups.
        cache_dir=Path(hass.config.cache_path(DOMAIN)),
    )


def load_error_key(err: BaseException) -> str:
    """The translation key of a failed engine start."""
    if isinstance(err, TorchUnavailableError):
        return "torch_unavailable"
    if isinstance(err, EngineImportError):
        return "engine_unavailable"
    if isinstance(err, KVBudgetError):
        return "kv_budget_too_small"
    if isinstance(err, UnsupportedModelError):
        return "unsupported_model"
    if isinstance(err, ModelLoadError):
        return "model_load_failed"
    return "engine_start_failed"


def is_transient_load_error(err: BaseException) -> bool:
    """Whether a failed start may succeed later unchanged (memory or network, not settings)."""
    cause: BaseException | None = err
    while cause is not None:
        if isinstance(cause, ConnectionError | TimeoutError | MemoryError):
            return True
        if type(cause).__name__ == "OutOfMemoryError":  # torch's, without importing torch
            return True
        cause = cause.__cause__
    return False


def engine_error(err: EngineError) -> HomeAssistantError:
    """A translated Home Assistant error for an error the engine raised on a request."""
    reason = str(err)
    if isinstance(err, RequestRejected):
        key = f"rejected_{err.code}" if err.code in _KNOWN_REJECTIONS else "rejected"
        cls = ServiceValidationError if err.code in _CALLER_REJECTIONS else HomeAssistantError
        return cls(
            translation_domain=DOMAIN,
            translation_key=key,
            translation_placeholders={"reason": reason, "code": err.code},
        )
    if isinstance(err, InvalidSamplingParams):
        return ServiceValidationError(
            translation_domain=DOMAIN,
            translation_key="invalid_sampling_params",
            translation_placeholders={"reason": reason},
        )
    if isinstance(err, EngineDeadError):
        return HomeAssistantError(
            translation_domain=DOMAIN,
            translation_key="engine_dead",
            translation_placeholders={"reason": reason},
        )
    return HomeAssistantError(
        translation_domain=DOMAIN,
        translation_key="generation_failed",
        translation_placeholders={"reason": reason},
    )
