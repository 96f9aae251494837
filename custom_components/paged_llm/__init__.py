"""The Paged LLM integration: a local LLM served inside Home Assistant on a paged-KV engine."""

from __future__ import annotations

from homeassistant.const import EVENT_HOMEASSISTANT_STOP, Platform
from homeassistant.core import Event, HomeAssistant
from homeassistant.exceptions import ConfigEntryError, ConfigEntryNotReady
from homeassistant.helpers import config_validation as cv
from homeassistant.helpers import device_registry as dr
from homeassistant.helpers.typing import ConfigType
from homeassistant.helpers.update_coordinator import DataUpdateCoordinator

from paged_llm.engine.metrics import MetricsSnapshot

from .card import async_register_card
from .const import DOMAIN, LOGGER
from .entity import engine_device_info
from .runtime import (
    EngineImportError,
    PagedLLMConfigEntry,
    PagedLLMData,
    TorchUnavailableError,
    async_import_engine,
    async_stop_pending_engines,
    engine_config,
    is_transient_load_error,
    load_error_key,
    take_pending_engine,
)
from .services import async_setup_services
from .websocket_api import async_setup_websocket_api

CONFIG_SCHEMA = cv.config_entry_only_config_schema(DOMAIN)
PLATFORMS = (Platform.AI_TASK, Platform.CONVERSATION, Platform.SENSOR)
# Platforms whose entities follow the subentries; they reload without restarting the engine.
AGENT_PLATFORMS = (Platform.AI_TASK, Platform.CONVERSATION)


async def async_setup(hass: HomeAssistant, config: ConfigType) -> bool:
    """Register the actions and stop engines no entry claimed when Home Assistant stops."""
    async_setup_services(hass)
    # The block-map card and the subscription that feeds it.
    async_setup_websocket_api(hass)
    await async_register_card(hass)

    async def _async_stop_pending(_event: Event) -> None:
        """Stop the engines config flows started and no entry took over."""
        await async_stop_pending_engines(hass)

    hass.bus.async_listen_once(EVENT_HOMEASSISTANT_STOP, _async_stop_pending)
    return True


async def async_setup_entry(hass: HomeAssistant, entry: PagedLLMConfigEntry) -> bool:
    """Start the entry's engine (model load and KV pool off the event loop) and its entities."""
    try:
        module = await async_import_engine(hass)
    except (TorchUnavailableError, EngineImportError) as err:
        raise ConfigEntryError(
            translation_domain=DOMAIN,
            translation_key=load_error_key(err),
            translation_placeholders={"reason": str(err)},
        ) from err
    try:
        config = engine_config(hass, entry.data)
    except ValueError as err:
        raise ConfigEntryError(
            translation_domain=DOMAIN,
            translation_key="invalid_settings",
            translation_placeholders={"reason": str(err)},
        ) from err

    engine = take_pending_engine(hass, entry.unique_id)
    if engine is not None and (engine.config != config or not engine.is_running):
        await engine.stop()
        engine = None
    if engine is None:
        engine = module.AsyncEngine(config)
        try:
            await engine.start()
        except Exception as err:
            await engine.stop()
            error = ConfigEntryNotReady if is_transient_load_error(err) else ConfigEntryError
            raise error(
                translation_domain=DOMAIN,
                translation_key=load_error_key(err),
                translation_placeholders={"reason": str(err)},
            ) from err
    LOGGER.debug(
        "Engine for %s running: %d KV blocks of %d tokens, context %d tokens",
        config.model,
        engine.engine.num_kv_blocks,
        config.block_size,
        engine.engine.max_model_len,
    )

    async def _async_latest_metrics() -> MetricsSnapshot:
        """The latest snapshot, for a manual refresh; the engine pushes the others."""
        return engine.metrics()

    # Its own logger: a debug line per pushed snapshot would drown the integration's log.
    coordinator: DataUpdateCoordinator[MetricsSnapshot] = DataUpdateCoordinator(
        hass,
        LOGGER.getChild("metrics"),
        config_entry=entry,
        name=f"{DOMAIN} {entry.title}",
        update_interval=None,
        update_method=_async_latest_metrics,
    )
    coordinator.async_set_updated_data(engine.metrics())
    device = dr.async_get(hass).async_get_or_create(
        config_entry_id=entry.entry_id, **engine_device_info(entry)
    )
    entry.runtime_data = PagedLLMData(
        engine=engine, config=config, coordinator=coordinator, device_id=device.id
    )
    entry.async_on_unload(engine.subscribe(coordinator.async_set_updated_data))

    async def _async_stop_engine(_event: Event) -> None:
        """Stop the engine's thread and free its memory when Home Assistant stops."""
        await engine.stop()

    entry.async_on_unload(hass.bus.async_listen(EVENT_HOMEASSISTANT_STOP, _async_stop_engine))

    try:
        await hass.config_entries.async_forward_entry_setups(entry, PLATFORMS)
    except BaseException:
        await engine.stop()
        raise
    entry.async_on_unload(entry.add_update_listener(_async_update_listener))
    return True


async def async_unload_entry(hass: HomeAssistant, entry: PagedLLMConfigEntry) -> bool:
    """Remove the entities, then stop the engine and free the model and the KV pool."""
    if not await hass.config_entries.async_unload_platforms(entry, PLATFORMS):
        return False
    await entry.runtime_data.engine.stop()
    return True


async def _async_update_listener(hass: HomeAssistant, entry: PagedLLMConfigEntry) -> None:
    """Restart the engine when its settings changed; otherwise only refresh the agents."""
    data = entry.runtime_data
    try:
        config = engine_config(hass, entry.data)
    except ValueError:
        config = None
    if config != data.config:
        hass.config_entries.async_schedule_reload(entry.entry_id)
        return
    async with data.platform_lock:
        await hass.config_entries.async_unload_platforms(entry, AGENT_PLATFORMS)
        await hass.config_entries.async_forward_entry_setups(entry, AGENT_PLATFORMS)
