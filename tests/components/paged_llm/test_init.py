"""Entry life cycle: start, unload and reload without leaks, and failed starts with reasons."""

from __future__ import annotations

import asyncio
import ctypes
import gc
import importlib
import threading
import weakref
from pathlib import Path
from typing import Any
from unittest.mock import patch

from homeassistant.config_entries import ConfigEntryState
from homeassistant.const import CONF_MODEL
from homeassistant.core import HomeAssistant
from pytest_homeassistant_custom_component.common import MockConfigEntry

from paged_llm.engine.errors import ModelLoadError

ENGINE_THREAD = "paged-llm-engine"


def _engine_threads() -> list[threading.Thread]:
    """Engine step threads still alive."""
    return [t for t in threading.enumerate() if t.name == ENGINE_THREAD and t.is_alive()]


async def _gone(ref: weakref.ref[Any]) -> bool:
    """Whether the object is freed, allowing a moment for executor threads to let go.

    A worker thread drops its last reference to a finished job a moment after the job's
    result reaches the event loop.
    """
    for _ in range(100):
        gc.collect()
        if ref() is None:
            return True
        await asyncio.sleep(0.02)
    return False


def _rss_bytes() -> int:
    """Resident memory of this process, after the allocator returns its free pages."""
    gc.collect()
    # glibc keeps freed memory in per-thread arenas; loads run on varying executor threads.
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/statm", encoding="ascii") as statm:
        return int(statm.read().split()[1]) * 4096


async def test_unload_and_reload_five_times_leaves_nothing_behind(
    hass: HomeAssistant, mock_config_entry: MockConfigEntry, ha_core: None
) -> None:
    # A KV pool large enough that keeping one per cycle would show in the process's memory.
    hass.config_entries.async_update_entry(
        mock_config_entry, data={**mock_config_entry.data, "kv_budget_mib": 64}
    )
    assert await hass.config_entries.async_setup(mock_config_entry.entry_id)
    await hass.async_block_till_done()
    threads_at_start = len(_engine_threads())
    assert threads_at_start == 1

    engines: list[weakref.ref[Any]] = []
    pools: list[weakref.ref[Any]] = []
    models: list[weakref.ref[Any]] = []
    baseline = 0
    for cycle in range(5):
        engine = mock_config_entry.runtime_data.backend.engine
        engines.append(weakref.ref(engine))
        pools.append(weakref.ref(engine._llm.runner.kv_caches[0][0]))
        models.append(weakref.ref(engine._llm.loaded.model))
        response = await hass.services.async_call(
            "paged_llm",
            "generate",
            {"prompt": f"cycle {cycle}", "max_tokens": 2},
            blocking=True,
            return_response=True,
        )
        assert response["text"]
        del engine

        assert await hass.config_entries.async_unload(mock_config_entry.entry_id)
        await hass.async_block_till_done()
        assert mock_config_entry.state is ConfigEntryState.NOT_LOADED
        assert _engine_threads() == []
        assert await _gone(pools[-1]), "the KV pool outlived the unload"
        assert await _gone(models[-1]), "the model outlived the unload"
        assert await _gone(engines[-1]), "the engine outlived the unload"
        if cycle == 0:
            baseline = _rss_bytes()

        assert await hass.config_entries.async_setup(mock_config_entry.entry_id)
        await hass.async_block_till_done()
        assert mock_config_entry.state is ConfigEntryState.LOADED
        assert len(_engine_threads()) == 1

    assert await hass.config_entries.async_unload(mock_config_entry.entry_id)
    await hass.async_block_till_done()
    assert _engine_threads() == []
    for ref in engines + pools + models:
        assert await _gone(ref)
    # Four more cycles of a 64 MiB pool: memory is back near where the first unload left it.
    assert _rss_bytes() - baseline < 48 * 2**20


async def test_model_that_cannot_load_fails_setup_with_the_reason(
    hass: HomeAssistant, mock_config_entry: MockConfigEntry, ha_core: None, tmp_path: Path
) -> None:
    hass.config_entries.async_update_entry(
        mock_config_entry, data={**mock_config_entry.data, CONF_MODEL: str(tmp_path)}
    )
    assert not await hass.config_entries.async_setup(mock_config_entry.entry_id)
    await hass.async_block_till_done()
    assert mock_config_entry.state is ConfigEntryState.SETUP_ERROR
    assert mock_config_entry.reason is not None
    assert "could not be loaded" in mock_config_entry.reason
    assert "config.json is missing" in mock_config_entry.reason
    assert _engine_threads() == []


async def test_out_of_memory_at_start_is_retried_later(
    hass: HomeAssistant, mock_config_entry: MockConfigEntry, ha_core: None
) -> None:
    def oom(_config: Any, _progress: Any = None) -> Any:
        raise ModelLoadError("could not load model: out of memory") from MemoryError()

    with patch("paged_llm.engine.async_engine.load_model", oom):
        assert not await hass.config_entries.async_setup(mock_config_entry.entry_id)
        await hass.async_block_till_done()
    assert mock_config_entry.state is ConfigEntryState.SETUP_RETRY
    assert "out of memory" in (mock_config_entry.reason or "")
    assert await hass.config_entries.async_unload(mock_config_entry.entry_id)


async def test_torch_unavailable_fails_setup_with_a_translated_error(
    hass: HomeAssistant, mock_config_entry: MockConfigEntry, ha_core: None
) -> None:
    real_import = importlib.import_module

    def no_torch(name: str, package: str | None = None) -> Any:
        if name == "torch":
            raise ImportError("Error loading shared library libgomp.so.1: No such file")
        return real_import(name, package)

    with patch("custom_components.paged_llm.engine_import.importlib.import_module", no_torch):
        assert not await hass.config_entries.async_setup(mock_config_entry.entry_id)
        await hass.async_block_till_done()
    assert mock_config_entry.state is ConfigEntryState.SETUP_ERROR
    reason = mock_config_entry.reason or ""
    assert "PyTorch is not available on this platform" in reason
    assert "libgomp.so.1" in reason
    assert "Home Assistant OS" in reason


async def test_home_assistant_stop_stops_the_engine(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    engine = init_integration.runtime_data.backend.engine
    assert engine.is_running
    await hass.async_stop(force=True)
    assert not engine.is_running
    assert _engine_threads() == []
