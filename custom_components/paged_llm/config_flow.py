"""Config flow for Paged LLM: pick and test-load a model, tune the engine, add agents."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, override

import probatio
from homeassistant.config_entries import (
    SOURCE_RECONFIGURE,
    ConfigEntry,
    ConfigEntryState,
    ConfigFlow,
    ConfigFlowResult,
    ConfigSubentryData,
    ConfigSubentryFlow,
    SubentryFlowResult,
)
from homeassistant.const import (
    CONF_API_KEY,
    CONF_DEVICE,
    CONF_LLM_HASS_API,
    CONF_MODEL,
    CONF_NAME,
    CONF_PROMPT,
    CONF_TIMEOUT,
    CONF_URL,
)
from homeassistant.core import HomeAssistant, callback
from homeassistant.data_entry_flow import FlowResultType
from homeassistant.helpers import llm
from homeassistant.helpers.aiohttp_client import async_get_clientsession
from homeassistant.helpers.service_info.hassio import HassioServiceInfo

from paged_llm.catalogue import BY_KEY, kv_dtype_bytes
from paged_llm.client import (
    AuthenticationError,
    CannotConnectError,
    ClientError,
    OpenAIClient,
)
from paged_llm.defaults import BUNDLED_PREFIX, DEFAULT_MODEL
from paged_llm.download import DownloadError
from paged_llm.extras import CPU, CPU_EXTRA, ENGINE, ENGINE_EXTRA
from paged_llm.hub import Source

from .addon import CONF_ADDON, addon_unique_id, discovered_data
from .const import (
    BACKEND_EMBEDDED,
    BACKEND_REMOTE,
    CONF_BACKEND,
    CONF_BLOCK_SIZE,
    CONF_CUSTOM_MODEL,
    CONF_DTYPE,
    CONF_HOME_GRAMMAR,
    CONF_IDLE_UNLOAD_MIN,
    CONF_KV_BUDGET_AUTO,
    CONF_KV_BUDGET_MIB,
    CONF_MAX_HISTORY,
    CONF_MAX_MODEL_LEN,
    CONF_MAX_NUM_SEQS,
    CONF_MAX_TOKENS,
    CONF_TEMPERATURE,
    CONF_THINK,
    CONF_WEIGHTS,
    DEFAULT_AI_TASK_NAME,
    DEFAULT_CONVERSATION_NAME,
    DEFAULT_HOME_GRAMMAR,
    DEFAULT_IDLE_UNLOAD_MIN,
    DEFAULT_MAX_HISTORY,
    DEFAULT_MAX_MODEL_LEN,
    DEFAULT_MAX_TOKENS,
    DEFAULT_TEMPERATURE,
    DEFAULT_THINK,
    DEFAULT_TIMEOUT_S,
    DEFAULT_WEIGHTS,
    DOMAIN,
    KV_BUDGET_AUTO,
    LOGGER,
    MODEL_BUNDLED,
    MODEL_OTHER,
    SUBENTRY_AI_TASK,
    SUBENTRY_CONVERSATION,
)
from .embedded import EmbeddedBackend
from .engine_config import engine_config, normalize_model
from .engine_import import (
    EngineState,
    async_import_engine,
    async_prepare_runner,
    engine_state,
    extra_installed,
    is_musl,
    musl_reason,
    needed_extra,
)
from .engine_install import async_install_extra
from .errors import EngineImportError, install_error_key, load_error_key
from .picker import (
    async_bandwidth,
    auto_kv_budget_mib,
    download_file,
    download_source,
    models_dir,
    picker_options,
    recommended_key,
    recommended_model,
)
from .prompt import DEFAULT_INSTRUCTIONS
from .runtime import hand_over_backend
from .schemas import (
    agent_option_schema,
    backend_schema,
    engine_schema,
    reauth_schema,
    server_model_schema,
    server_schema,
)

if TYPE_CHECKING:
    from .runtime import PagedLLMConfigEntry

BUNDLED_LABEL = "SmolLM2 135M Instruct (bundled)"
# How often the loading dialog is told the load's progress again (seconds).
PROGRESS_REPEAT_S = 1.0
# The smallest change of a download's progress the dialog is told of (a percent).
PROGRESS_STEP = 0.01
RECOMMENDED_CONVERSATION_OPTIONS: dict[str, Any] = {
    CONF_PROMPT: DEFAULT_INSTRUCTIONS,
    CONF_MAX_TOKENS: DEFAULT_MAX_TOKENS,
    CONF_TEMPERATURE: DEFAULT_TEMPERATURE,
    CONF_MAX_HISTORY: DEFAULT_MAX_HISTORY,
    CONF_HOME_GRAMMAR: DEFAULT_HOME_GRAMMAR,
    CONF_THINK: DEFAULT_THINK,
}
RECOMMENDED_AI_TASK_OPTIONS: dict[str, Any] = {
    CONF_MAX_TOKENS: DEFAULT_MAX_TOKENS,
    CONF_TEMPERATURE: DEFAULT_TEMPERATURE,
}


def coerce_engine_input(user_input: Mapping[str, Any]) -> dict[str, Any]:
    """Entry data from the form: numbers as integers, the model in its canonical spelling.

    A KV budget of 0 is the automatic one: marked here, sized once the model's file is
    known (:func:`async_resolve_kv_budget`).
    """
    data: dict[str, Any] = {
        CONF_DEVICE: user_input[CONF_DEVICE],
        CONF_DTYPE: user_input[CONF_DTYPE],
        CONF_WEIGHTS: user_input.get(CONF_WEIGHTS, DEFAULT_WEIGHTS),
        CONF_KV_BUDGET_MIB: int(user_input[CONF_KV_BUDGET_MIB]),
        CONF_BLOCK_SIZE: int(user_input[CONF_BLOCK_SIZE]),
        CONF_MAX_NUM_SEQS: int(user_input[CONF_MAX_NUM_SEQS]),
        CONF_MAX_MODEL_LEN: int(user_input.get(CONF_MAX_MODEL_LEN, DEFAULT_MAX_MODEL_LEN)),
        CONF_IDLE_UNLOAD_MIN: int(user_input.get(CONF_IDLE_UNLOAD_MIN, DEFAULT_IDLE_UNLOAD_MIN)),
    }
    if CONF_MODEL in user_input:
        data[CONF_MODEL] = chosen_model(user_input)
    if data[CONF_KV_BUDGET_MIB] == KV_BUDGET_AUTO:
        data[CONF_KV_BUDGET_AUTO] = True
    return data


async def async_resolve_kv_budget(hass: HomeAssistant, data: dict[str, Any]) -> None:
    """Size an automatic KV budget for the data's model, in place; a chosen one stays."""
    if data.get(CONF_KV_BUDGET_AUTO):
        dtype_bytes = kv_dtype_bytes(data[CONF_WEIGHTS], data[CONF_DEVICE])
        data[CONF_KV_BUDGET_MIB] = await hass.async_add_executor_job(
            auto_kv_budget_mib, data[CONF_MODEL], None, dtype_bytes
        )


class NoModelTypedError(ValueError):
    """The form chose "Another model" but no model was typed."""


def chosen_model(user_input: Mapping[str, Any]) -> str:
    """The model the form's two fields name, in its canonical spelling."""
    if user_input[CONF_MODEL] == MODEL_BUNDLED:
        return str(DEFAULT_MODEL)
    if user_input[CONF_MODEL] in BY_KEY:
        return recommended_model(user_input[CONF_MODEL])
    typed = str(user_input.get(CONF_CUSTOM_MODEL) or "").strip()
    if not typed:
        raise NoModelTypedError
    return normalize_model(typed)


def model_label(model: str) -> str:
    """The model as the form's list names it: the bundled label, else the short name."""
    return BUNDLED_LABEL if model == DEFAULT_MODEL else model_title(model)


def chosen_settings(entry: PagedLLMConfigEntry) -> dict[str, str]:
    """What the running engine resolved "Automatic" and 0 to, for the reconfigure form."""
    unknown = dict.fromkeys(
        ("device", "dtype", "weights", "context", "blocks", "sequence_mib"), "-"
    )
    data = getattr(entry, "runtime_data", None)
    if data is None or not isinstance(data.backend, EmbeddedBackend):
        return unknown
    if not data.backend.engine.is_running:
        return unknown
    info = data.backend.engine.info
    return {
        "device": info.device,
        "dtype": info.dtype,
        "weights": info.weights,
        "context": str(info.max_model_len),
        "blocks": f"{info.num_kv_blocks} × {info.block_size}",
        "sequence_mib": f"{info.blocks_per_sequence * info.block_bytes / 2**20:.1f}",
    }


def model_title(model: str) -> str:
    """A short name for the model: the bundled name, the folder or file name, or the id."""
    if model.startswith(BUNDLED_PREFIX):
        return model.removeprefix(BUNDLED_PREFIX)
    if model.startswith("/"):
        path = Path(model)
        return path.stem if path.suffix == ".gguf" else path.name
    return model


def check_engine_settings(
    hass: HomeAssistant, entry: PagedLLMConfigEntry, data: Mapping[str, Any]
) -> None:
    """Raise when new settings are invalid or cannot hold one full sequence (blocking)."""
    config = engine_config(hass, data)
    if entry.state is ConfigEntryState.LOADED and isinstance(
        backend := entry.runtime_data.backend, EmbeddedBackend
    ):
        backend.check_settings(config)


def conversation_options(tools: bool) -> dict[str, Any]:
    """A new conversation agent's options: "Control Home Assistant" on if the model calls tools."""
    if not tools:
        return dict(RECOMMENDED_CONVERSATION_OPTIONS)
    return {**RECOMMENDED_CONVERSATION_OPTIONS, CONF_LLM_HASS_API: [llm.LLM_API_ASSIST]}


def tools_note(tools: bool) -> str:
    """The create-entry message's key: whether the agent controls the home, and why not."""
    return "tools_on" if tools else "tools_off"


def default_subentries(tools: bool = False) -> list[ConfigSubentryData]:
    """A conversation agent and an AI task agent, ready to use; ``tools``: the model calls tools."""
    return [
        {
            "subentry_type": SUBENTRY_CONVERSATION,
            "data": conversation_options(tools),
            "title": DEFAULT_CONVERSATION_NAME,
            "unique_id": None,
        },
        {
            "subentry_type": SUBENTRY_AI_TASK,
            "data": RECOMMENDED_AI_TASK_OPTIONS,
            "title": DEFAULT_AI_TASK_NAME,
            "unique_id": None,
        },
    ]


def server_client(hass: HomeAssistant, data: Mapping[str, Any]) -> OpenAIClient:
    """A client for the server an entry or a form names, on Home Assistant's session."""
    return OpenAIClient(
        async_get_clientsession(hass),
        data[CONF_URL],
        api_key=data.get(CONF_API_KEY) or None,
        timeout=float(data.get(CONF_TIMEOUT, DEFAULT_TIMEOUT_S)),
    )


def client_error_key(err: ClientError) -> str:
    """The form error for a failed request to a server."""
    if isinstance(err, AuthenticationError):
        return "invalid_auth"
    if isinstance(err, CannotConnectError):
        return "cannot_connect"
    return "server_error"


class PagedLLMConfigFlow(ConfigFlow, domain=DOMAIN):
    """Set up one entry per model: run by the engine here, or by a server."""

    VERSION = 1
    MINOR_VERSION = 1

    def __init__(self) -> None:
        """Start with nothing entered and nothing loaded."""
        self._data: dict[str, Any] = {}
        self._errors: dict[str, str] = {}
        self._reason = ""
        self._load_task: asyncio.Task[EmbeddedBackend] | None = None
        self._install_task: asyncio.Task[None] | None = None
        self._install_failure: tuple[str, str] | None = None
        # Where a test load goes on: the step after it, and the form that says why it
        # failed (the user's flow: create the entry, else the engine form; reconfigure:
        # save, else the reconfigure form with the entry's data untouched).
        self._after_load = ("finish", "embedded")
        # Where the torch path's install goes on: the step after it, and the one that says
        # why it failed (the user's flow: load, else the engine form; reconfigure: load
        # where loading changes, else save).
        self._after_install = ("load", "embedded")
        self._backend: EmbeddedBackend | None = None
        self._server: dict[str, Any] = {}
        self._models: list[str] = []
        self._addon_name = ""
        self._download: Source | None = None
        self._download_task: asyncio.Task[Path] | None = None
        # Where a download goes on: the step after it, and the form that says why it failed.
        self._after_download = ("use_model", "embedded")

    def _typed(self, step_id: str, user_input: dict[str, Any] | None) -> dict[str, Any] | None:
        """``user_input`` where it was sent to ``step_id``'s form; None where it was not.

        Home Assistant hands what was posted to a progress step (which has no form) on to
        the step after it, unchecked by any schema: that step's form was not shown yet, so
        the input is no answer to it. The step then shows its form (with the progress
        step's error, if any) instead of failing on fields it lacks.
        """
        current = self.cur_step
        if user_input is None or current is None:
            return user_input
        if current["type"] is FlowResultType.FORM and current.get("step_id") == step_id:
            return user_input
        LOGGER.debug("Input posted at step %s is no answer to %s: ignored", current, step_id)
        return None

    @override
    async def async_step_user(self, user_input: dict[str, Any] | None = None) -> ConfigFlowResult:
        """Ask where the model runs; the engine here only where it can work."""
        user_input = self._typed("user", user_input)
        state, reason = await self.hass.async_add_executor_job(engine_state)
        blocked = state not in (EngineState.READY, EngineState.MISSING)
        if self._install_failure is not None:
            blocked, (key, reason) = True, self._install_failure
        else:
            key = str(state)
        if user_input is not None:
            if user_input[CONF_BACKEND] == BACKEND_REMOTE:
                return await self.async_step_server()
            if not blocked:
                if state is EngineState.MISSING:
                    return await self.async_step_install()
                return await self.async_step_embedded()
        options = [BACKEND_REMOTE] if blocked else [BACKEND_EMBEDDED, BACKEND_REMOTE]
        return self.async_show_form(
            step_id="user",
            data_schema=backend_schema(options),
            errors={"base": key} if blocked else {},
            description_placeholders={"reason": reason},
        )

    async def async_step_install(
        self, user_input: dict[str, Any] | None = None
    ) -> ConfigFlowResult:
        """Install the engine's light CPU extra (no PyTorch) while the user waits."""
        if self._install_task is None or not self._install_task.done():
            if self._install_task is None:
                self._install_task = self.hass.async_create_task(
                    async_install_extra(self.hass, CPU), f"{DOMAIN} install the engine"
                )
            return self.async_show_progress(
                step_id="install",
                progress_action="install_engine",
                progress_task=self._install_task,
                description_placeholders={"extra": CPU_EXTRA},
            )
        task, self._install_task = self._install_task, None
        try:
            task.result()
        except Exception as err:  # the choice form says why and offers the server
            LOGGER.warning("The engine could not be installed: %s", err)
            key = install_error_key(err)
            if is_musl() and key == "engine_install_failed":
                # A package without a musl build for this machine: the add-on serves here.
                key = str(EngineState.MUSL)
            self._install_failure = (key, str(err))
            return self.async_show_progress_done(next_step_id="user")
        return self.async_show_progress_done(next_step_id="embedded")

    async def async_step_install_torch(
        self, user_input: dict[str, Any] | None = None
    ) -> ConfigFlowResult:
        """Install the torch path (PyTorch, transformers) for settings that need it."""
        if self._install_task is None or not self._install_task.done():
            if self._install_task is None:
                self._install_task = self.hass.async_create_task(
                    async_install_extra(self.hass, ENGINE), f"{DOMAIN} install PyTorch"
                )
            return self.async_show_progress(
                step_id="install_torch",
                progress_action="install_torch",
                progress_task=self._install_task,
                description_placeholders={"extra": ENGINE_EXTRA},
            )
        task, self._install_task = self._install_task, None
        next_step, failed_step = self._after_install
        try:
            task.result()
        except Exception as err:  # the form the settings came from says why
            LOGGER.warning("PyTorch could not be installed: %s", err)
            self._errors, self._reason = {"base": install_error_key(err)}, str(err)
            return self.async_show_progress_done(next_step_id=failed_step)
        return self.async_show_progress_done(next_step_id=next_step)

    async def _async_needs_torch_install(self, data: Mapping[str, Any]) -> bool:
        """Whether ``data`` runs on the torch path and its extra is not installed here.

        On musl, where PyTorch has no packages, it is a form error instead (set here).
        """

        def missing() -> bool:
            """Whether the settings' extra is the torch path's and is missing (blocking)."""
            config = engine_config(self.hass, data)
            return needed_extra(config) == ENGINE and not extra_installed(ENGINE)

        if not await self.hass.async_add_executor_job(missing):
            return False
        if is_musl():
            self._errors = {"base": "torch_unavailable"}
            self._reason = f"{musl_reason()}: PyTorch publishes no packages for it"
            return False
        return True

    async def async_step_embedded(
        self, user_input: dict[str, Any] | None = None
    ) -> ConfigFlowResult:
        """Ask for the model and the engine settings."""
        user_input = self._typed("embedded", user_input)
        if user_input is not None:
            try:
                data = {CONF_BACKEND: BACKEND_EMBEDDED, **coerce_engine_input(user_input)}
            except NoModelTypedError:
                self._errors, self._reason = {CONF_CUSTOM_MODEL: "model_missing"}, ""
                return await self._async_show_engine_form(suggested=user_input)
            try:
                source = download_source(data[CONF_MODEL])
            except DownloadError as err:
                self._errors, self._reason = {CONF_CUSTOM_MODEL: "download_refused"}, str(err)
                return await self._async_show_engine_form(suggested=user_input)
            self._data = data
            if source is not None:
                self._download = source
                return await self.async_step_download()
            return await self.async_step_use_model()
        return await self._async_show_engine_form()

    async def async_step_download(
        self, user_input: dict[str, Any] | None = None
    ) -> ConfigFlowResult:
        """Fetch the chosen file into the models folder while the user watches its progress."""
        assert self._download is not None
        if self._download_task is None or not self._download_task.done():
            if self._download_task is None:
                self._download_task = self.hass.async_create_task(
                    self._async_download(self._download), f"{DOMAIN} download a model"
                )
            return self.async_show_progress(
                step_id="download",
                progress_action="download_model",
                progress_task=self._download_task,
                description_placeholders={"model": self._data[CONF_MODEL]},
            )
        task, self._download_task = self._download_task, None
        try:
            path = task.result()
        except (DownloadError, OSError) as err:  # nothing partial under its name; the form says why
            LOGGER.warning("Model %s could not be downloaded: %s", self._data[CONF_MODEL], err)
            self._errors, self._reason = {"base": "download_failed"}, str(err)
            return self.async_show_progress_done(next_step_id=self._after_download[1])
        self._data[CONF_MODEL] = str(path)
        return self.async_show_progress_done(next_step_id=self._after_download[0])

    async def _async_download(self, source: Source) -> Path:
        """Resolve and fetch ``source`` on an executor thread, reporting its progress."""
        loop = self.hass.loop
        folder = models_dir(self.hass)
        shown = [0.0]

        def report(fraction: float) -> None:
            """The download's progress (from its thread), by whole percents: not per MiB."""
            if fraction - shown[0] >= PROGRESS_STEP or fraction >= 1.0:
                shown[0] = fraction
                loop.call_soon_threadsafe(self.async_update_progress, fraction)

        return await self.hass.async_add_executor_job(download_file, source, folder, report)

    async def async_step_use_model(
        self, user_input: dict[str, Any] | None = None
    ) -> ConfigFlowResult:
        """Test-load the chosen model (here now), after PyTorch's install if it needs it."""
        data = self._data
        await self.async_set_unique_id(data[CONF_MODEL])
        self._abort_if_unique_id_configured()
        try:
            await async_import_engine(self.hass)
        except EngineImportError:
            # The load step fails the same way and names it on the form.
            return await self.async_step_load()
        # The file is here now (downloaded, or on disk): its header sizes an automatic budget.
        await async_resolve_kv_budget(self.hass, data)
        try:
            needs_torch = await self._async_needs_torch_install(data)
        except ValueError as err:
            self._errors, self._reason = {"base": "invalid_settings"}, str(err)
        else:
            if needs_torch:
                self._after_install = ("load", "embedded")
                return await self.async_step_install_torch()
            if not self._errors:
                return await self.async_step_load()
        return await self._async_show_engine_form()

    async def _async_show_engine_form(
        self, suggested: Mapping[str, Any] | None = None
    ) -> ConfigFlowResult:
        """The engine form with the pending errors; ``suggested`` refills what was typed."""
        errors, self._errors = self._errors, {}
        settings = suggested or self._data
        bandwidth = await async_bandwidth(self.hass)
        recommended = await self.hass.async_add_executor_job(
            picker_options, models_dir(self.hass), settings, bandwidth
        )
        schema = engine_schema(self._data, with_model=True, recommended=recommended)
        if suggested is not None:
            schema = self.add_suggested_values_to_schema(schema, suggested)
        return self.async_show_form(
            step_id="embedded",
            data_schema=schema,
            errors=errors,
            description_placeholders={"reason": self._reason},
        )

    async def async_step_server(self, user_input: dict[str, Any] | None = None) -> ConfigFlowResult:
        """Ask where the server is; list its models to check it answers."""
        errors: dict[str, str] = {}
        reason = ""
        reconfiguring = self.source == SOURCE_RECONFIGURE
        defaults: Mapping[str, Any] = (
            self._get_reconfigure_entry().data if reconfiguring else self._server
        )
        if user_input is not None:
            server = {
                CONF_URL: user_input[CONF_URL].strip(),
                CONF_TIMEOUT: int(user_input[CONF_TIMEOUT]),
            }
            if key := (user_input.get(CONF_API_KEY) or "").strip():
                server[CONF_API_KEY] = key
            self._server = server
            client = server_client(self.hass, server)
            try:
                models = await client.models()
            except ClientError as err:
                errors["base"], reason = client_error_key(err), str(err)
            else:
                if models:
                    self._models = [model.id for model in models]
                    self._server[CONF_URL] = client.root
                    return await self.async_step_server_model()
                errors["base"], reason = "no_models", client.api
            defaults = user_input
        return self.async_show_form(
            step_id="server",
            data_schema=server_schema(defaults),
            errors=errors,
            description_placeholders={"reason": reason},
        )

    async def async_step_server_model(
        self, user_input: dict[str, Any] | None = None
    ) -> ConfigFlowResult:
        """Pick the server's model; a one-token request proves it can chat."""
        errors: dict[str, str] = {}
        reason = ""
        reconfiguring = self.source == SOURCE_RECONFIGURE
        if user_input is not None:
            model = user_input[CONF_MODEL]
            data = {CONF_BACKEND: BACKEND_REMOTE, **self._server, CONF_MODEL: model}
            try:
                await server_client(self.hass, data).test_chat(model)
            except (AuthenticationError, CannotConnectError) as err:
                errors["base"], reason = client_error_key(err), str(err)
            except ClientError as err:
                errors["base"], reason = "model_cannot_chat", str(err)
            else:
                if reconfiguring:
                    return self.async_update_reload_and_abort(
                        self._get_reconfigure_entry(), data=data
                    )
                await self.async_set_unique_id(f"{data[CONF_URL]}#{model}")
                self._abort_if_unique_id_configured()
                return self.async_create_entry(
                    title=model, data=data, subentries=default_subentries()
                )
        current = self._get_reconfigure_entry().data.get(CONF_MODEL) if reconfiguring else None
        return self.async_show_form(
            step_id="server_model",
            data_schema=server_model_schema(self._models, current),
            errors=errors,
            description_placeholders={"reason": reason, "url": self._server[CONF_URL]},
        )

    @override
    async def async_step_hassio(self, discovery_info: HassioServiceInfo) -> ConfigFlowResult:
        """The Paged LLM add-on announced its server: offer it, or update the entry it has."""
        try:
            data = discovered_data(discovery_info)
        except (KeyError, TypeError, ValueError):
            return self.async_abort(reason="invalid_discovery_info")
        unique_id = addon_unique_id(discovery_info.slug)
        await self.async_set_unique_id(unique_id)
        updates: dict[str, Any] = {
            k: data[k] for k in (CONF_URL, CONF_API_KEY, CONF_MODEL) if k in data
        }
        entry = self.hass.config_entries.async_entry_for_domain_unique_id(DOMAIN, unique_id)
        model = updates.get(CONF_MODEL)
        if entry is not None and model and entry.title == entry.data.get(CONF_MODEL):
            # The title was the model's name, so it follows the model; a name the user
            # gave the entry stays.
            self.hass.config_entries.async_update_entry(entry, title=model)
        if (
            entry is not None
            and entry.state is ConfigEntryState.SETUP_ERROR
            and self.hass.config_entries.async_update_entry(entry, data={**entry.data, **updates})
        ):
            # No update listener runs for an entry that failed to start (a key refused).
            self.hass.config_entries.async_schedule_reload(entry.entry_id)
        # A running entry's update listener restarts it with a new URL, key or model.
        self._abort_if_unique_id_configured(updates=updates, reload_on_update=False)
        for other in self._async_current_entries(include_ignore=False):
            if other.data.get(CONF_URL) == data[CONF_URL]:  # set up by hand before
                return self.async_update_reload_and_abort(
                    other,
                    unique_id=unique_id,
                    data_updates={**updates, CONF_ADDON: data[CONF_ADDON]},
                    reason="already_configured",
                )
        self._server, self._addon_name = data, discovery_info.name
        self.context["title_placeholders"] = {"name": discovery_info.name}
        self.context["configuration_url"] = (
            f"homeassistant://hassio/addon/{discovery_info.slug}/info"
        )
        return await self.async_step_hassio_confirm()

    async def async_step_hassio_confirm(
        self, user_input: dict[str, Any] | None = None
    ) -> ConfigFlowResult:
        """Ask whether to use the add-on's server; create the entry once it answers."""
        errors: dict[str, str] = {}
        reason = ""
        if user_input is not None:
            try:
                models = [
                    model.id for model in await server_client(self.hass, self._server).models()
                ]
            except ClientError as err:
                errors["base"], reason = client_error_key(err), str(err)
            else:
                if models:
                    announced = self._server.get(CONF_MODEL)
                    model = announced if announced in models else models[0]
                    return self.async_create_entry(
                        title=model,
                        data={**self._server, CONF_MODEL: model},
                        subentries=default_subentries(),
                    )
                errors["base"], reason = "no_models", self._server[CONF_URL]
        return self.async_show_form(
            step_id="hassio_confirm",
            errors=errors,
            description_placeholders={
                "addon": self._addon_name,
                "model": self._server.get(CONF_MODEL, "-"),
                "reason": reason,
            },
        )

    async def _async_start_engine(self) -> EmbeddedBackend:
        """Load the model and size the KV pool exactly as the entry will (the test)."""
        module = await async_import_engine(self.hass)
        config = engine_config(self.hass, self._data)
        await async_prepare_runner(self.hass, config)
        loop = self.hass.loop
        latest: list[float] = []

        def show(fraction: float) -> None:
            """Show the load's progress in the dialog."""
            latest[:] = [fraction]
            self.async_update_progress(fraction)

        def report(fraction: float) -> None:
            """The loader's progress (called from its thread)."""
            loop.call_soon_threadsafe(show, fraction)

        async def repeat() -> None:
            """Say the latest fraction again every second, for a dialog that opened after it.

            An update sent before the dialog listened is not replayed, and a first start
            builds its kernels for seconds before the next one.
            """
            while True:
                await asyncio.sleep(PROGRESS_REPEAT_S)
                if latest:
                    self.async_update_progress(latest[0])

        repeating = self.hass.async_create_background_task(repeat(), f"{DOMAIN} load progress")
        try:
            return EmbeddedBackend(await module.start_engine(config, report))
        finally:
            repeating.cancel()

    async def async_step_load(self, user_input: dict[str, Any] | None = None) -> ConfigFlowResult:
        """Load the model in the background while the user waits on a progress step."""
        # A new task is always shown as progress first, even when it failed at once: a
        # finished task then moves the flow on by itself, without re-sending this input.
        if self._load_task is None or not self._load_task.done():
            if self._load_task is None:
                self._load_task = self.hass.async_create_task(
                    self._async_start_engine(), f"{DOMAIN} test load of {self._data[CONF_MODEL]}"
                )
            return self.async_show_progress(
                step_id="load",
                progress_action="load_model",
                progress_task=self._load_task,
                description_placeholders={"model": model_label(self._data[CONF_MODEL])},
            )
        task, self._load_task = self._load_task, None
        try:
            self._backend = task.result()
        except Exception as err:  # every failure becomes a form error naming it
            LOGGER.warning("Model %s failed to load: %s", self._data[CONF_MODEL], err)
            self._errors, self._reason = {"base": load_error_key(err)}, str(err)
            return self.async_show_progress_done(next_step_id=self._after_load[1])
        return self.async_show_progress_done(next_step_id=self._after_load[0])

    async def async_step_finish(self, user_input: dict[str, Any] | None = None) -> ConfigFlowResult:
        """Create the entry with a conversation agent and an AI task agent ready to use."""
        assert self._backend is not None
        assert self.unique_id is not None
        backend, self._backend = self._backend, None
        # The model's own chat template decides: one that renders a tools list was trained
        # to call them; one that does not would only make the agent pretend.
        tools = backend.native_tools
        hand_over_backend(self.hass, self.unique_id, backend)
        return self.async_create_entry(
            title=model_title(self._data[CONF_MODEL]),
            data=self._data,
            subentries=default_subentries(tools),
            description=tools_note(tools),
            description_placeholders={"model": model_label(self._data[CONF_MODEL])},
        )

    async def async_step_reconfigure(
        self, user_input: dict[str, Any] | None = None
    ) -> ConfigFlowResult:
        """Change the model or engine settings, or the server, of an entry; it restarts."""
        entry: PagedLLMConfigEntry = self._get_reconfigure_entry()
        if entry.data.get(CONF_BACKEND) == BACKEND_REMOTE:
            return await self.async_step_server()
        user_input = self._typed("reconfigure", user_input)
        # A failed install of the torch path or download comes back here with its error.
        errors, self._errors = self._errors, {}
        reason, self._reason = self._reason, ""
        if user_input is not None:
            if (
                user_input.get(CONF_MODEL, MODEL_OTHER) == MODEL_OTHER
                and not str(user_input.get(CONF_CUSTOM_MODEL) or "").strip()
            ):
                # "Another file or model" left empty: the entry keeps its model.
                user_input = {
                    **user_input,
                    CONF_MODEL: MODEL_OTHER,
                    CONF_CUSTOM_MODEL: entry.data[CONF_MODEL],
                }
            kept = {k: v for k, v in entry.data.items() if k != CONF_KV_BUDGET_AUTO}
            data = {**kept, **coerce_engine_input(user_input)}
            if user_input[CONF_MODEL] == recommended_key(entry.data[CONF_MODEL]):
                data[CONF_MODEL] = entry.data[CONF_MODEL]  # that file, downloaded before
            if data[CONF_MODEL] != entry.data[CONF_MODEL]:
                try:
                    source = download_source(data[CONF_MODEL])
                except DownloadError as err:
                    errors, reason = {CONF_CUSTOM_MODEL: "download_refused"}, str(err)
                    return await self._async_show_reconfigure_form(user_input, errors, reason)
                self._data = data
                if source is None:
                    return await self.async_step_reconfigure_model()
                self._download = source
                self._after_download = ("reconfigure_model", "reconfigure")
                return await self.async_step_download()
            try:
                await async_import_engine(self.hass)
                if data.get(CONF_KV_BUDGET_AUTO) and entry.data.get(CONF_KV_BUDGET_AUTO):
                    # Sized for this model before; the running engine's own memory is not
                    # free now, so sizing again would shrink it for nothing.
                    data[CONF_KV_BUDGET_MIB] = entry.data[CONF_KV_BUDGET_MIB]
                else:
                    await async_resolve_kv_budget(self.hass, data)
                await self.hass.async_add_executor_job(
                    check_engine_settings, self.hass, entry, data
                )
                needs_torch = await self._async_needs_torch_install(data)
            except ValueError as err:
                errors["base"], reason = "invalid_settings", str(err)
            except Exception as err:  # KV budget, model load, engine import: named on the form
                errors["base"], reason = load_error_key(err), str(err)
            else:
                self._data = data
                if needs_torch:
                    self._after_install = (await self._async_reconfigure_next(), "reconfigure")
                    return await self.async_step_install_torch()
                if not self._errors:
                    return await self._async_reconfigure_check()
                errors, self._errors = self._errors, {}
                reason, self._reason = self._reason, ""
        return await self._async_show_reconfigure_form(
            user_input or self._data or entry.data, errors, reason
        )

    async def _async_show_reconfigure_form(
        self, values: Mapping[str, Any], errors: dict[str, str], reason: str
    ) -> ConfigFlowResult:
        """The reconfigure form: the model picker and the engine settings, as ``values`` say."""
        entry: PagedLLMConfigEntry = self._get_reconfigure_entry()
        bandwidth = await async_bandwidth(self.hass)
        recommended = await self.hass.async_add_executor_job(
            picker_options, models_dir(self.hass), values, bandwidth
        )
        return self.async_show_form(
            step_id="reconfigure",
            data_schema=engine_schema(values, with_model=True, recommended=recommended),
            errors=errors,
            description_placeholders={
                "model": model_label(entry.data[CONF_MODEL]),
                "reason": reason,
                **chosen_settings(entry),
            },
        )

    async def async_step_reconfigure_model(
        self, user_input: dict[str, Any] | None = None
    ) -> ConfigFlowResult:
        """Another model for the entry (here now): one entry per model, PyTorch if it needs it."""
        await self.async_set_unique_id(self._data[CONF_MODEL])
        self._abort_if_unique_id_configured()
        try:
            await async_import_engine(self.hass)
            await async_resolve_kv_budget(self.hass, self._data)
            needs_torch = await self._async_needs_torch_install(self._data)
        except Exception as err:  # the engine or the settings: named on the form
            self._errors, self._reason = {"base": load_error_key(err)}, str(err)
            return await self.async_step_reconfigure()
        if needs_torch:
            self._after_install = ("load", "reconfigure")
            self._after_load = ("reconfigure_save", "reconfigure")
            return await self.async_step_install_torch()
        if self._errors:
            return await self.async_step_reconfigure()
        return await self._async_reconfigure_check()

    async def _async_reconfigure_next(self) -> str:
        """The step that follows a reconfigure's checks: a test load where loading changes.

        Another model, settings that load it differently, or an entry that is not running
        are loaded first, as the first run's flow does; a change the engine does not see
        (the idle unload) is saved at once.
        """
        entry: PagedLLMConfigEntry = self._get_reconfigure_entry()

        def same_engine() -> bool:
            """Whether the new data start the engine the entry runs (blocking)."""
            return engine_config(self.hass, self._data) == engine_config(self.hass, entry.data)

        if entry.state is ConfigEntryState.LOADED and await self.hass.async_add_executor_job(
            same_engine
        ):
            return "reconfigure_save"
        self._after_load = ("reconfigure_save", "reconfigure")
        return "load"

    async def _async_reconfigure_check(self) -> ConfigFlowResult:
        """Test-load the reconfigured model where loading changes; else save at once."""
        if await self._async_reconfigure_next() == "load":
            return await self.async_step_load()
        return await self.async_step_reconfigure_save()

    async def async_step_reconfigure_save(
        self, user_input: dict[str, Any] | None = None
    ) -> ConfigFlowResult:
        """Save the checked settings of a reconfigure; the entry restarts with them.

        The engine the test load started is handed to the restart, which takes it rather
        than load the model a second time.
        """
        entry: PagedLLMConfigEntry = self._get_reconfigure_entry()
        model = self._data[CONF_MODEL]
        if self._backend is not None:
            backend, self._backend = self._backend, None
            hand_over_backend(self.hass, model, backend)
        if entry.state is not ConfigEntryState.LOADED:
            # No update listener runs for an entry that failed to start.
            self.hass.config_entries.async_schedule_reload(entry.entry_id)
        if model == entry.data[CONF_MODEL]:
            return self.async_update_and_abort(entry, data=self._data)
        return self.async_update_and_abort(
            entry, unique_id=model, title=model_title(model), data=self._data
        )

    async def async_step_reauth(self, entry_data: Mapping[str, Any]) -> ConfigFlowResult:
        """The server refused the entry's API key: ask for the one it expects now."""
        return await self.async_step_reauth_confirm()

    async def async_step_reauth_confirm(
        self, user_input: dict[str, Any] | None = None
    ) -> ConfigFlowResult:
        """Check the new key against the server; the entry restarts with it."""
        entry: PagedLLMConfigEntry = self._get_reauth_entry()
        errors: dict[str, str] = {}
        reason = ""
        if user_input is not None:
            data = {k: v for k, v in entry.data.items() if k != CONF_API_KEY}
            if key := (user_input.get(CONF_API_KEY) or "").strip():
                data[CONF_API_KEY] = key
            try:
                await server_client(self.hass, data).models()
            except ClientError as err:
                errors["base"], reason = client_error_key(err), str(err)
            else:
                return self.async_update_reload_and_abort(entry, data=data)
        return self.async_show_form(
            step_id="reauth_confirm",
            data_schema=reauth_schema(),
            errors=errors,
            description_placeholders={
                "url": entry.data[CONF_URL],
                "model": entry.data[CONF_MODEL],
                "reason": reason,
            },
        )

    @callback
    @override
    def async_remove(self) -> None:
        """Stop an engine this flow started but never handed to an entry."""
        if self._backend is not None:
            backend, self._backend = self._backend, None
            self.hass.async_create_background_task(
                backend.async_close(), f"{DOMAIN} stop test engine"
            )

    @classmethod
    @callback
    @override
    def async_get_supported_subentry_types(
        cls, config_entry: ConfigEntry
    ) -> dict[str, type[ConfigSubentryFlow]]:
        """Conversation agents and AI task agents share the entry's engine."""
        return {
            SUBENTRY_CONVERSATION: PagedLLMSubentryFlowHandler,
            SUBENTRY_AI_TASK: PagedLLMSubentryFlowHandler,
        }


def entry_calls_tools(entry: ConfigEntry) -> bool:
    """Whether a running embedded entry's model template can call tools (else: unknown, off)."""
    data = getattr(entry, "runtime_data", None)
    if entry.state is not ConfigEntryState.LOADED or data is None:
        return False
    backend = data.backend
    if not isinstance(backend, EmbeddedBackend) or not backend.engine.is_running:
        return False
    return backend.native_tools


class PagedLLMSubentryFlowHandler(ConfigSubentryFlow):
    """Add or change a conversation agent or an AI task agent."""

    @property
    def _is_new(self) -> bool:
        """Whether this flow creates a subentry rather than changing one."""
        return self.source == "user"

    async def async_step_set_options(
        self, user_input: dict[str, Any] | None = None
    ) -> SubentryFlowResult:
        """Ask for the agent's name, instructions, tools and sampling settings."""
        if user_input is not None:
            data = dict(user_input)
            if not data.get(CONF_LLM_HASS_API):
                data.pop(CONF_LLM_HASS_API, None)
            for key in (CONF_MAX_TOKENS, CONF_MAX_HISTORY):
                if key in data:
                    data[key] = int(data[key])
            if self._is_new:
                name = data.pop(CONF_NAME)
                return self.async_create_entry(title=name, data=data)
            return self.async_update_and_abort(
                self._get_entry(), self._get_reconfigure_subentry(), data=data
            )
        entry = self._get_entry()
        if self._is_new:
            options: Mapping[str, Any] = (
                RECOMMENDED_AI_TASK_OPTIONS
                if self._subentry_type == SUBENTRY_AI_TASK
                else conversation_options(entry_calls_tools(entry))
            )
        else:
            options = self._get_reconfigure_subentry().data
        taken = {sub.title for sub in entry.subentries.values()}
        return self.async_show_form(
            step_id="set_options",
            data_schema=probatio.Schema(
                agent_option_schema(self.hass, self._is_new, self._subentry_type, options, taken)
            ),
            description_placeholders={"model": model_label(entry.data[CONF_MODEL])},
        )

    async_step_user = async_step_set_options
    async_step_reconfigure = async_step_set_options
