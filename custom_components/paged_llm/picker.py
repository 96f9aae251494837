"""The model picker: the recommended files as the form lists them, and their downloads."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from homeassistant.const import CONF_DEVICE
from homeassistant.core import HomeAssistant
from homeassistant.helpers.selector import SelectOptionDict

from paged_llm.catalogue import (
    AUTO_KV_FLOOR,
    BY_KEY,
    KV_DTYPE_BYTES,
    RECOMMENDED,
    Fit,
    Recommended,
    Shape,
    auto_kv_budget,
    fit,
    free_memory,
    kv_dtype_bytes,
    measure_bandwidth,
    shape_of,
)
from paged_llm.download import DownloadError, default_models_dir
from paged_llm.hub import Source, fetch, parse_source, resolve

from .const import (
    CONF_KV_BUDGET_MIB,
    CONF_MAX_MODEL_LEN,
    CONF_WEIGHTS,
    DEFAULT_DEVICE,
    DEFAULT_KV_BUDGET_MIB,
    DEFAULT_MAX_MODEL_LEN,
    DEFAULT_WEIGHTS,
    DOMAIN,
    KV_BUDGET_AUTO,
)

_BANDWIDTH = f"{DOMAIN}_bandwidth"


def models_dir(hass: HomeAssistant) -> Path:
    """Where downloaded models are kept: the integration's cache folder, outside updates."""
    return default_models_dir(Path(hass.config.cache_path(DOMAIN)))


def recommended_model(key: str) -> str:
    """The Hub file a recommended key stands for, as "another file" would name it."""
    model = BY_KEY[key]
    return f"{model.repo}/{model.filename}"


def recommended_key(model: str) -> str | None:
    """The recommended key of a model string (a Hub file or one downloaded), or None."""
    for item in RECOMMENDED:
        if model in (f"{item.repo}/{item.filename}", item.filename) or model.endswith(
            f"/{item.filename}"
        ):
            return item.key
    return None


def download_source(model: str) -> Source | None:
    """The download a model string asks for, or None (a path, a model id, the bundled one)."""
    if model.startswith(("/", "bundled:")):
        return None
    return parse_source(model)


def _shape(item: Recommended, folder: Path) -> tuple[Shape, bool]:
    """The shape of a recommended file: its header's once downloaded, else the catalogue's."""
    path = folder / item.filename
    if path.is_file():
        try:
            return shape_of(path), True
        except Exception:  # an unreadable file: the catalogue's shape stands
            return item.shape, True
    return item.shape, False


def auto_kv_budget_mib(
    model: str, free: int | None = None, dtype_bytes: int = KV_DTYPE_BYTES
) -> int:
    """The automatic KV budget in MiB for ``model`` (blocking: reads a GGUF file's header).

    A GGUF file on disk is sized from its own header (see catalogue.auto_kv_budget);
    anything else (the bundled model, whose whole context the floor holds, a model folder
    or id) gets the floor, as does a file whose header cannot be read (its load says why).
    """
    path = Path(model)
    if model.startswith("/") and path.suffix == ".gguf" and path.is_file():
        try:
            shape = shape_of(path)
            size = path.stat().st_size
        except Exception:  # not a GGUF file after all: the test load names it
            return AUTO_KV_FLOOR // 2**20
        return auto_kv_budget(size, shape, free, dtype_bytes) // 2**20
    return AUTO_KV_FLOOR // 2**20


def describe(item: Recommended, need: Fit, here: bool, auto: bool = False) -> str:
    """One line of the picker: size, memory and KV budget at the context, fit, speed, why."""
    kv = f"KV {(need.memory - item.size) // 2**20:,} MiB" + (" automatic" if auto else "")
    parts = [
        f"{item.name} Q4_K_M",
        f"{item.size / 1e9:.1f} GB file" + (", downloaded" if here else ""),
        f"needs {need.memory / 2**30:.1f} GiB with {need.context:,} tokens of context ({kv})",
        ("fits" if need.fits else "does NOT fit") + f" ({need.free / 2**30:.1f} GiB free)",
    ]
    if need.tokens_per_s is not None:
        parts.append(f"about {need.tokens_per_s:.0f} tokens/s here (estimate)")
    parts.append(("controls the home" if item.tools else "no tool calls") + f": {item.why}")
    return " · ".join(parts)


def picker_options(
    folder: Path, settings: Mapping[str, Any], bandwidth: float | None
) -> list[SelectOptionDict]:
    """The recommended files as the form lists them, sized for ``settings`` (blocking).

    With the automatic KV budget (0 on the form) each file gets its own, as it would be
    saved: the line shows it and the context it holds.
    """
    chosen = int(settings.get(CONF_KV_BUDGET_MIB, DEFAULT_KV_BUDGET_MIB))
    auto = chosen == KV_BUDGET_AUTO
    dtype_bytes = kv_dtype_bytes(
        settings.get(CONF_WEIGHTS, DEFAULT_WEIGHTS), settings.get(CONF_DEVICE, DEFAULT_DEVICE)
    )
    context = int(settings.get(CONF_MAX_MODEL_LEN, DEFAULT_MAX_MODEL_LEN))
    free = free_memory()
    options = []
    for item in RECOMMENDED:
        shape, here = _shape(item, folder)
        if auto:
            kv_budget = auto_kv_budget(item.size, shape, free, dtype_bytes)
        else:
            kv_budget = chosen * 2**20
        need = fit(item.size, shape, kv_budget, context, free, bandwidth, dtype_bytes=dtype_bytes)
        label = describe(item, need, here, auto)
        options.append(SelectOptionDict(value=item.key, label=label))
    return options


async def async_bandwidth(hass: HomeAssistant) -> float | None:
    """The memory bandwidth of this machine, measured once per run of Home Assistant."""
    if _BANDWIDTH not in hass.data:
        hass.data[_BANDWIDTH] = await hass.async_add_executor_job(measure_bandwidth)
    bandwidth: float | None = hass.data[_BANDWIDTH]
    return bandwidth


def download_file(source: Source, folder: Path, progress: Callable[[float], None]) -> Path:
    """Resolve and fetch ``source`` into ``folder`` (blocking); DownloadError says why not."""
    remote = resolve(source)
    if remote.size is not None and remote.size > free_memory():
        raise DownloadError(
            f"{remote.filename} ({remote.size / 1e9:.1f} GB) is larger than the memory free "
            f"here ({free_memory() / 1e9:.1f} GB): it could not be loaded; choose a smaller file"
        )
    return fetch(remote, folder, progress)
