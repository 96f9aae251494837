"""An entry's data as the engine's settings (EngineConfig), the model in canonical spelling."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from homeassistant.const import CONF_DEVICE, CONF_MODEL
from homeassistant.core import HomeAssistant

from paged_llm.defaults import DEFAULT_MODEL

from .const import (
    CONF_BLOCK_SIZE,
    CONF_DTYPE,
    CONF_KV_BUDGET_MIB,
    CONF_MAX_MODEL_LEN,
    CONF_MAX_NUM_SEQS,
    CONF_WEIGHTS,
    DEFAULT_BLOCK_SIZE,
    DEFAULT_DEVICE,
    DEFAULT_DTYPE,
    DEFAULT_MAX_MODEL_LEN,
    DEFAULT_MAX_NUM_SEQS,
    DEFAULT_WEIGHTS,
    FALLBACK_KV_BUDGET_MIB,
)

if TYPE_CHECKING:
    from paged_llm.engine.api import EngineConfig


def normalize_model(model: str) -> str:
    """The canonical spelling of a model string: absolute for local paths, as given otherwise."""
    model = model.strip() or DEFAULT_MODEL
    if model.startswith(("/", "~", ".")):
        return str(Path(model).expanduser().absolute())
    return model


def engine_config(hass: HomeAssistant, data: Mapping[str, Any]) -> EngineConfig:
    """Build the engine settings from an entry's data (raises ValueError naming a bad one).

    Call only once the engine is importable (it imports the engine's config module).
    """
    from paged_llm.engine.api import EngineConfig

    max_model_len = int(data.get(CONF_MAX_MODEL_LEN, DEFAULT_MAX_MODEL_LEN))
    # 0 (automatic) is resolved by the config flow; data that missed it get the floor.
    kv_budget_mib = int(data.get(CONF_KV_BUDGET_MIB) or FALLBACK_KV_BUDGET_MIB)
    return EngineConfig(
        model=normalize_model(data.get(CONF_MODEL, DEFAULT_MODEL)),
        device=data.get(CONF_DEVICE, DEFAULT_DEVICE),
        dtype=data.get(CONF_DTYPE, DEFAULT_DTYPE),
        weights=data.get(CONF_WEIGHTS, DEFAULT_WEIGHTS),
        block_size=int(data.get(CONF_BLOCK_SIZE, DEFAULT_BLOCK_SIZE)),
        kv_budget=float(kv_budget_mib * 2**20),
        max_num_seqs=int(data.get(CONF_MAX_NUM_SEQS, DEFAULT_MAX_NUM_SEQS)),
        max_model_len=max_model_len or None,
        # Converted GGUF models are kept here: rebuildable, so outside backups.
        cache_dir=Path(hass.config.cache_path("paged_llm")),
    )
