"""The Paged LLM integration: a local LLM on a paged-KV engine, in Home Assistant or a server."""

from __future__ import annotations

from homeassistant.const import (
    CONF_API_KEY,
    CONF_MODEL,
    CONF_TIMEOUT,
    CONF_URL,
    EVENT_HOMEASSISTANT_STOP,
    Platform,
)
from homeassistant.core import Event, HomeAssistant
from homeassistant.exceptions import ConfigEntryAuthFailed, ConfigEntryError, ConfigEntryNotReady
from homeassistant.helpers import config_validation as cv
from homeassistant.helpers import device_registry as dr
from homeassistant.helpers.aiohttp_client import async_get_clientsession
from homeassistant.helpers.typing import ConfigType

from paged_llm.client import AuthenticationError, CannotConnectError, ClientError, OpenAIClient

from .addon import async_server_reachable, async_server_unreachable, async_track_addon
from .backend import Backend
from .card import async_register_card
from .const import (
    BACKEND_REMOTE,
    CONF_BACKEND,
    CONF_IDLE_UNLOAD_MIN,
    DEFAULT_IDLE_UNLOAD_MIN,
    DEFAULT_TIMEOUT_S,
    DOMAIN,
    LOGGER,
)
from .coordinator import PagedLLMCoordinator
from .embedded import EmbeddedBackend
from .engine_config import engine_config
from .engine_import import async_import_engine, async_prepare_runner
from .entity import engine_device_info
from .errors import (
    EngineImportError,
    TorchUnavailableError,
    is_transient_load_error,
    load_error_key,
)
from .remote import RemoteBackend
from .runtime import (
    PagedLLMConfigEntry,
    PagedLLMData,
    async_stop_pending_backends,
    take_pending_backend,
)
from .satellites import async_track_satellites
from .services import async_setup_services
from .websocket_api import async_setup_websocket_api

CONFIG_SCHEMA = cv.config_entry_only_config_schema(DOMAIN)
PLATFORMS = (Platform.AI_TASK, Platform.CONVERSATION, Platform.SENSOR)
# Platforms whose entities follow the subentries; they reload without restarting the engine.
AGENT_PLATFORMS = (Platform.AI_TASK, Platform.CONVERSATION)


async def async_setup(hass: HomeAssistant, config: ConfigType) -> bool:
    """Register the actions and stop backends no entry claimed when Home Assistant stops."""
    async_setup_services(hass)
    # The block-map card and the subscription that feeds it.
    async_setup_websocket_api(hass)
    await async_register_card(hass)

    async def _async_stop_pending(_event: Event) -> None:
        """Stop the backends config flows started and no entry took over."""
        await async_stop_pending_backends(hass)

    hass.bus.async_listen_once(EVENT_HOMEASSISTANT_STOP, _async_stop_pending)
    return True


async def _async_start_embedded(hass: HomeAssistant, entry: PagedLLMConfigEntry) -> Backend:
    """Start the entry's engine (model load and KV pool off the event loop)."""
    try:
        module = await async_import_engine(hass)
    except EngineImportError as err:
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
    try:
        # torch for settings on the torch path (a GPU, a model that is not a GGUF file).
        await async_prepare_runner(hass, config)
    except TorchUnavailableError as err:
        raise ConfigEntryError(
            translation_domain=DOMAIN,
            translation_key=load_error_key(err),
            translation_placeholders={"reason": str(err)},
        ) from err

    pending = take_pending_backend(hass, entry.unique_id)
    idle_s = int(entry.data.get(CONF_IDLE_UNLOAD_MIN, DEFAULT_IDLE_UNLOAD_MIN)) * 60.0
    if isinstance(pending, EmbeddedBackend) and pending.config == config and pending.available:
        pending.idle_unload_s = idle_s
        return pending
    if pending is not None:
        await pending.async_close()
    try:
        engine = await module.start_engine(config)
    except Exception as err:
        error = ConfigEntryNotReady if is_transient_load_error(err) else ConfigEntryError
        raise error(
            translation_domain=DOMAIN,
            translation_key=load_error_key(err),
            translation_placeholders={"reason": str(err)},
        ) from err
    info = engine.info
    LOGGER.debug(
        "Engine for %s running: %d KV blocks of %d tokens, context %d tokens",
        config.model,
        info.num_kv_blocks,
        info.block_size,
        info.max_model_len,
    )
    return EmbeddedBackend(engine, idle_unload_s=idle_s)


async def _async_start_remote(hass: HomeAssistant, entry: PagedLLMConfigEntry) -> RemoteBackend:
    """Reach the entry's server and learn its model's context length."""
    client = OpenAIClient(
        async_get_clientsession(hass),
        entry.data[CONF_URL],
        api_key=entry.data.get(CONF_API_KEY),
        timeout=float(entry.data.get(CONF_TIMEOUT, DEFAULT_TIMEOUT_S)),
    )
    model = entry.data[CONF_MODEL]
    try:
        models = await client.models()
    except AuthenticationError as err:
        # A wrong key does not fix itself: Home Assistant asks the user for the new one.
        raise ConfigEntryAuthFailed(
            translation_domain=DOMAIN,
            translation_key="server_auth_failed",
            translation_placeholders={"reason": str(err)},
        ) from err
    except ClientError as err:
        if isinstance(err, CannotConnectError):
            async_server_unreachable(hass, entry)  # a repair when it was an add-on's
        # The server may be starting or rebooting: Home Assistant retries with backoff.
        raise ConfigEntryNotReady(
            translation_domain=DOMAIN,
            translation_key="server_unreachable",
            translation_placeholders={"reason": str(err)},
        ) from err
    info = next((m for m in models if m.id == model), None)
    if info is None:
        raise ConfigEntryNotReady(
            translation_domain=DOMAIN,
            translation_key="server_model_missing",
            translation_placeholders={"model": model, "reason": ", ".join(m.id for m in models)},
        )
    return RemoteBackend(client, model, info.max_model_len)


async def async_setup_entry(hass: HomeAssistant, entry: PagedLLMConfigEntry) -> None:
    """Start the entry's backend, its metrics and its entities."""
    remote = entry.data.get(CONF_BACKEND) == BACKEND_REMOTE
    backend: Backend
    if remote:
        backend = await _async_start_remote(hass, entry)
    else:
        backend = await _async_start_embedded(hass, entry)

    coordinator = PagedLLMCoordinator(hass, entry, backend, remote=remote)
    if remote:
        await coordinator.async_config_entry_first_refresh()
    else:
        coordinator.async_set_updated_data(backend.metrics())
    device = dr.async_get(hass).async_get_or_create(
        config_entry_id=entry.entry_id, **engine_device_info(entry)
    )
    entry.runtime_data = PagedLLMData(
        backend=backend, settings=dict(entry.data), coordinator=coordinator, device_id=device.id
    )
    entry.async_on_unload(backend.subscribe(coordinator.async_set_updated_data))
    if remote:
        entry.async_on_unload(async_track_addon(hass, entry, coordinator, backend))
    entry.async_on_unload(async_track_satellites(hass, backend))

    async def _async_stop_backend(_event: Event) -> None:
        """Stop the engine's thread and free its memory when Home Assistant stops."""
        await backend.async_close()

    entry.async_on_unload(hass.bus.async_listen(EVENT_HOMEASSISTANT_STOP, _async_stop_backend))

    try:
        await hass.config_entries.async_forward_entry_setups(entry, PLATFORMS)
    except BaseException:
        await backend.async_close()
        raise
    entry.async_on_unload(entry.add_update_listener(_async_update_listener))


async def async_unload_entry(hass: HomeAssistant, entry: PagedLLMConfigEntry) -> None:
    """Remove the entities, then stop the backend and free what it holds.

    Since Home Assistant 2026.11 entry methods return None and raise when they fail.
    """
    await hass.config_entries.async_unload_platforms_or_raise(entry, PLATFORMS)
    await entry.runtime_data.backend.async_close()


async def async_remove_entry(hass: HomeAssistant, entry: PagedLLMConfigEntry) -> None:
    """An entry removed has no server to wait for: its add-on repair goes with it."""
    async_server_reachable(hass, entry)


async def _async_update_listener(hass: HomeAssistant, entry: PagedLLMConfigEntry) -> None:
    """Restart the backend when its settings changed; otherwise only refresh the agents."""
    data = entry.runtime_data
    if dict(entry.data) != data.settings:
        hass.config_entries.async_schedule_reload(entry.entry_id)
        return
    async with data.platform_lock:
        await hass.config_entries.async_unload_platforms(entry, AGENT_PLATFORMS)
        await hass.config_entries.async_forward_entry_setups(entry, AGENT_PLATFORMS)
