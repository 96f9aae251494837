"""Diagnostic sensors of the engine, pushed from its metrics at most about once a second.

And one per conversation agent: its prompt's size against the context, with the first
token's wait, updated by the agent's warm-up.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from homeassistant.components.sensor import (
    SensorDeviceClass,
    SensorEntity,
    SensorEntityDescription,
    SensorStateClass,
)
from homeassistant.config_entries import ConfigSubentry
from homeassistant.const import PERCENTAGE, EntityCategory, UnitOfTime
from homeassistant.core import HomeAssistant, callback
from homeassistant.helpers.dispatcher import async_dispatcher_connect
from homeassistant.helpers.entity_platform import AddConfigEntryEntitiesCallback
from homeassistant.helpers.update_coordinator import CoordinatorEntity

from paged_llm.protocol.snapshot import EngineState, MetricsSnapshot, Percentiles

from .const import SUBENTRY_CONVERSATION
from .coordinator import PagedLLMCoordinator
from .embedded import EmbeddedBackend
from .entity import agent_device_info, engine_device_info
from .prompt_budget import budget_signal
from .runtime import PagedLLMConfigEntry

# Engine metrics arrive by push; nothing here ever polls.
PARALLEL_UPDATES = 0
# The agents' prompt sensor: its translation key, and its unique id after the subentry's.
PROMPT_SENSOR_KEY = "prompt_tokens"


# The class the main latency sensors follow: what a person waits for. A summary's long
# first token must not make voice look slow; the other classes are attributes.
MAIN_CLASS = "interactive"


def _main_p95(family: dict[str, Percentiles]) -> float | None:
    """The interactive class's p95, or None before its first request."""
    main = family.get(MAIN_CLASS)
    return main.p95 if main is not None and main.count else None


def _queue_wait(snapshot: MetricsSnapshot) -> float | None:
    """Interactive queue wait p95; 0 before the first request, since nobody has waited."""
    value = _main_p95(snapshot.request_queue_time_seconds)
    if value is None and not snapshot.num_requests_waiting_by_class.get(MAIN_CLASS):
        return 0.0
    return value


def _class_attributes(family: dict[str, Percentiles]) -> dict[str, float | None]:
    """Every class's p95 (None where it has no request yet), for the attributes."""
    return {name: p.p95 for name, p in family.items()}


@dataclass(frozen=True, kw_only=True)
class PagedLLMSensorEntityDescription(SensorEntityDescription):
    """How one sensor reads its value (and extra attributes) from a metrics snapshot."""

    value_fn: Callable[[MetricsSnapshot], float | int | str | None]
    attributes_fn: Callable[[MetricsSnapshot], Mapping[str, Any]] | None = None
    # Readable while the engine is down: the engine state says "unloaded" or "loading" then.
    always_available: bool = False
    diagnostic: bool = True


SENSORS: tuple[PagedLLMSensorEntityDescription, ...] = (
    PagedLLMSensorEntityDescription(
        key="engine_state",
        translation_key="engine_state",
        device_class=SensorDeviceClass.ENUM,
        options=[state.value for state in EngineState],
        always_available=True,
        diagnostic=False,
        value_fn=lambda s: s.engine_state.value,
    ),
    PagedLLMSensorEntityDescription(
        key="kv_cache_usage",
        translation_key="kv_cache_usage",
        native_unit_of_measurement=PERCENTAGE,
        state_class=SensorStateClass.MEASUREMENT,
        suggested_display_precision=1,
        value_fn=lambda s: round(s.kv_cache_usage_perc * 100, 2),
    ),
    PagedLLMSensorEntityDescription(
        key="kv_blocks_used",
        translation_key="kv_blocks_used",
        native_unit_of_measurement="blocks",
        state_class=SensorStateClass.MEASUREMENT,
        value_fn=lambda s: s.kv_blocks_used,
        attributes_fn=lambda s: {
            "kv_blocks_total": s.kv_blocks_total,
            "kv_live_tokens": s.kv_live_tokens,
            "kv_allocated_slots": s.kv_allocated_slots,
        },
    ),
    PagedLLMSensorEntityDescription(
        key="running_requests",
        translation_key="running_requests",
        state_class=SensorStateClass.MEASUREMENT,
        value_fn=lambda s: s.num_requests_running,
    ),
    PagedLLMSensorEntityDescription(
        key="waiting_requests",
        translation_key="waiting_requests",
        state_class=SensorStateClass.MEASUREMENT,
        value_fn=lambda s: s.num_requests_waiting,
        attributes_fn=lambda s: dict(s.num_requests_waiting_by_class),
    ),
    PagedLLMSensorEntityDescription(
        key="preemptions",
        translation_key="preemptions",
        # Counts from zero again after an engine restart.
        state_class=SensorStateClass.TOTAL_INCREASING,
        value_fn=lambda s: s.num_preemptions,
    ),
    PagedLLMSensorEntityDescription(
        key="queue_wait_p95",
        translation_key="queue_wait_p95",
        native_unit_of_measurement=UnitOfTime.SECONDS,
        device_class=SensorDeviceClass.DURATION,
        state_class=SensorStateClass.MEASUREMENT,
        suggested_display_precision=3,
        value_fn=_queue_wait,
        attributes_fn=lambda s: _class_attributes(s.request_queue_time_seconds),
    ),
    PagedLLMSensorEntityDescription(
        key="time_to_first_token_p95",
        translation_key="time_to_first_token_p95",
        native_unit_of_measurement=UnitOfTime.SECONDS,
        device_class=SensorDeviceClass.DURATION,
        state_class=SensorStateClass.MEASUREMENT,
        suggested_display_precision=3,
        # No token yet means no time to report: unknown is the truth here, not 0.
        value_fn=lambda s: _main_p95(s.time_to_first_token_seconds),
        attributes_fn=lambda s: _class_attributes(s.time_to_first_token_seconds),
    ),
    PagedLLMSensorEntityDescription(
        key="generation_throughput",
        translation_key="generation_throughput",
        native_unit_of_measurement="tokens/s",
        state_class=SensorStateClass.MEASUREMENT,
        suggested_display_precision=1,
        # A 10-second average: it falls to 0 after the engine goes idle, not between steps.
        value_fn=lambda s: round(s.generation_throughput, 2),
    ),
    PagedLLMSensorEntityDescription(
        key="prompt_throughput",
        translation_key="prompt_throughput",
        native_unit_of_measurement="tokens/s",
        state_class=SensorStateClass.MEASUREMENT,
        suggested_display_precision=1,
        # Reading a long prompt generates nothing; this shows the engine is working.
        value_fn=lambda s: round(s.prompt_throughput, 2),
    ),
    PagedLLMSensorEntityDescription(
        key="prefix_cache_hit_rate",
        translation_key="prefix_cache_hit_rate",
        native_unit_of_measurement=PERCENTAGE,
        state_class=SensorStateClass.MEASUREMENT,
        suggested_display_precision=1,
        value_fn=lambda s: round(s.prefix_cache_hit_rate * 100, 2),
        attributes_fn=lambda s: {
            "prefix_cache_queries": s.prefix_cache_queries,
            "prefix_cache_hits": s.prefix_cache_hits,
        },
    ),
)


async def async_setup_entry(
    hass: HomeAssistant,
    config_entry: PagedLLMConfigEntry,
    async_add_entities: AddConfigEntryEntitiesCallback,
) -> None:
    """Add the engine's sensors, and whether the model is loaded where it runs here."""
    coordinator = config_entry.runtime_data.coordinator
    sensors: list[SensorEntity] = [
        PagedLLMSensor(config_entry, coordinator, description) for description in SENSORS
    ]
    if isinstance(config_entry.runtime_data.backend, EmbeddedBackend):
        sensors.append(PagedLLMLoadedSensor(config_entry, coordinator))
    async_add_entities(sensors)

    # Agents with a prompt sensor; agents added later get theirs when the entry updates.
    with_sensor: set[str] = set()

    @callback
    def _add_prompt_sensors() -> None:
        """A prompt-size sensor on each conversation agent's device that lacks one."""
        for subentry in config_entry.subentries.values():
            if subentry.subentry_type != SUBENTRY_CONVERSATION:
                continue
            if subentry.subentry_id in with_sensor:
                continue
            with_sensor.add(subentry.subentry_id)
            async_add_entities(
                [PagedLLMPromptSensor(config_entry, subentry, with_sensor.discard)],
                config_subentry_id=subentry.subentry_id,
            )

    async def _async_entry_updated(_hass: HomeAssistant, _entry: PagedLLMConfigEntry) -> None:
        """Subentries may have been added."""
        _add_prompt_sensors()

    _add_prompt_sensors()
    config_entry.async_on_unload(config_entry.add_update_listener(_async_entry_updated))


class PagedLLMPromptSensor(SensorEntity):
    """A conversation agent's prompt in tokens: the context's share, the first token's wait."""

    _attr_has_entity_name = True
    _attr_should_poll = False
    _attr_entity_category = EntityCategory.DIAGNOSTIC
    _attr_translation_key = PROMPT_SENSOR_KEY
    _attr_native_unit_of_measurement = "tokens"
    _attr_state_class = SensorStateClass.MEASUREMENT

    def __init__(
        self,
        entry: PagedLLMConfigEntry,
        subentry: ConfigSubentry,
        on_remove: Callable[[str], None],
    ) -> None:
        """Bind the sensor to its agent; ``on_remove`` is told the agent's id on removal."""
        self.entry = entry
        self._subentry_id = subentry.subentry_id
        self._forget = on_remove
        self._attr_unique_id = f"{subentry.subentry_id}_{PROMPT_SENSOR_KEY}"
        self._attr_device_info = agent_device_info(entry, subentry)

    async def async_added_to_hass(self) -> None:
        """Show the budget known now, and each new one the agent's warm-up sends."""
        await super().async_added_to_hass()
        self._read_budget()
        self.async_on_remove(
            async_dispatcher_connect(
                self.hass, budget_signal(self._subentry_id), self._async_budget_changed
            )
        )
        self.async_on_remove(lambda: self._forget(self._subentry_id))

    @callback
    def _async_budget_changed(self) -> None:
        """The agent's warm-up counted the prompt again (or the agent went away)."""
        self._read_budget()
        self.async_write_ha_state()

    def _read_budget(self) -> None:
        """State and attributes from the agent's budget; unknown before its first count."""
        data = getattr(self.entry, "runtime_data", None)  # gone once the entry unloaded
        budget = data.budgets.get(self._subentry_id) if data is not None else None
        self._attr_native_value = budget.prompt_tokens if budget is not None else None
        self._attr_extra_state_attributes = budget.attributes() if budget is not None else {}


class PagedLLMLoadedSensor(CoordinatorEntity[PagedLLMCoordinator], SensorEntity):
    """Whether the embedded model is in memory (it unloads when idle, if asked to)."""

    _attr_has_entity_name = True
    _attr_entity_category = EntityCategory.DIAGNOSTIC
    _attr_device_class = SensorDeviceClass.ENUM
    _attr_translation_key = "model_loaded"

    def __init__(self, entry: PagedLLMConfigEntry, coordinator: PagedLLMCoordinator) -> None:
        """Bind the sensor to its entry's engine."""
        super().__init__(coordinator)
        self.entry = entry
        self._attr_options = ["loaded", "unloaded"]
        self._attr_unique_id = f"{entry.entry_id}_model_loaded"
        self._attr_device_info = engine_device_info(entry)

    @property
    def native_value(self) -> str:
        """Loaded or unloaded."""
        backend = self.entry.runtime_data.backend
        return "loaded" if isinstance(backend, EmbeddedBackend) and backend.loaded else "unloaded"


class PagedLLMSensor(CoordinatorEntity[PagedLLMCoordinator], SensorEntity):
    """One engine figure on the engine's service device."""

    entity_description: PagedLLMSensorEntityDescription
    _attr_has_entity_name = True

    def __init__(
        self,
        entry: PagedLLMConfigEntry,
        coordinator: PagedLLMCoordinator,
        description: PagedLLMSensorEntityDescription,
    ) -> None:
        """Bind the sensor to its entry's engine."""
        super().__init__(coordinator)
        self.entity_description = description
        self._attr_entity_category = EntityCategory.DIAGNOSTIC if description.diagnostic else None
        self.entry = entry
        self._attr_unique_id = f"{entry.entry_id}_{description.key}"
        self._attr_device_info = engine_device_info(entry)

    @property
    def available(self) -> bool:
        """Unavailable once the engine has stopped or crashed, or the server is away or loading.

        The state sensor stays available and reads "loading" or "unloaded" then.
        """
        if self.entity_description.always_available:
            return super().available
        return super().available and self._engine_running

    @property
    def _engine_running(self) -> bool:
        """Whether the entry's engine (or server) still serves requests."""
        data = getattr(self.entry, "runtime_data", None)
        return data is not None and bool(data.backend.available)

    @property
    def native_value(self) -> float | int | str | None:
        """The figure from the latest snapshot."""
        if self.entity_description.always_available and not self._engine_running:
            data = self.coordinator.data
            loading = data is not None and data.engine_state is EngineState.LOADING
            return str(EngineState.LOADING if loading else EngineState.UNLOADED)
        return self.entity_description.value_fn(self.coordinator.data)

    @property
    def extra_state_attributes(self) -> Mapping[str, Any] | None:
        """Details behind the figure, where there are any."""
        if self.entity_description.attributes_fn is None:
            return None
        return self.entity_description.attributes_fn(self.coordinator.data)
