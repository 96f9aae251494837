"""Diagnostic sensors of the engine, pushed from its metrics at most about once a second."""

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
from homeassistant.const import PERCENTAGE, EntityCategory, UnitOfTime
from homeassistant.core import HomeAssistant
from homeassistant.helpers.entity_platform import AddConfigEntryEntitiesCallback
from homeassistant.helpers.update_coordinator import CoordinatorEntity, DataUpdateCoordinator

from paged_llm.protocol.snapshot import MetricsSnapshot

from .embedded import EmbeddedBackend
from .entity import engine_device_info
from .runtime import PagedLLMConfigEntry

# Engine metrics arrive by push; nothing here ever polls.
PARALLEL_UPDATES = 0


def _busy(snapshot: MetricsSnapshot) -> bool:
    """Whether any request is running or waiting."""
    return bool(snapshot.num_requests_running or snapshot.num_requests_waiting)


@dataclass(frozen=True, kw_only=True)
class PagedLLMSensorEntityDescription(SensorEntityDescription):
    """How one sensor reads its value (and extra attributes) from a metrics snapshot."""

    value_fn: Callable[[MetricsSnapshot], float | int | None]
    attributes_fn: Callable[[MetricsSnapshot], Mapping[str, Any]] | None = None


SENSORS: tuple[PagedLLMSensorEntityDescription, ...] = (
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
        native_unit_of_measurement="requests",
        state_class=SensorStateClass.MEASUREMENT,
        value_fn=lambda s: s.num_requests_running,
    ),
    PagedLLMSensorEntityDescription(
        key="waiting_requests",
        translation_key="waiting_requests",
        native_unit_of_measurement="requests",
        state_class=SensorStateClass.MEASUREMENT,
        value_fn=lambda s: s.num_requests_waiting,
        attributes_fn=lambda s: dict(s.num_requests_waiting_by_class),
    ),
    PagedLLMSensorEntityDescription(
        key="preemptions",
        translation_key="preemptions",
        native_unit_of_measurement="preemptions",
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
        value_fn=lambda s: s.worst(s.request_queue_time_seconds),
        attributes_fn=lambda s: {
            name: p.p95 for name, p in s.request_queue_time_seconds.items() if p.count
        },
    ),
    PagedLLMSensorEntityDescription(
        key="time_to_first_token_p95",
        translation_key="time_to_first_token_p95",
        native_unit_of_measurement=UnitOfTime.SECONDS,
        device_class=SensorDeviceClass.DURATION,
        state_class=SensorStateClass.MEASUREMENT,
        suggested_display_precision=3,
        value_fn=lambda s: s.worst(s.time_to_first_token_seconds),
        attributes_fn=lambda s: {
            name: p.p95 for name, p in s.time_to_first_token_seconds.items() if p.count
        },
    ),
    PagedLLMSensorEntityDescription(
        key="generation_throughput",
        translation_key="generation_throughput",
        native_unit_of_measurement="tokens/s",
        state_class=SensorStateClass.MEASUREMENT,
        suggested_display_precision=1,
        # The engine publishes nothing while idle, so its last busy figure would linger.
        value_fn=lambda s: round(s.generation_throughput, 2) if _busy(s) else 0.0,
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


class PagedLLMLoadedSensor(CoordinatorEntity[DataUpdateCoordinator[MetricsSnapshot]], SensorEntity):
    """Whether the embedded model is in memory (it unloads when idle, if asked to)."""

    _attr_has_entity_name = True
    _attr_entity_category = EntityCategory.DIAGNOSTIC
    _attr_device_class = SensorDeviceClass.ENUM
    _attr_translation_key = "model_loaded"

    def __init__(
        self, entry: PagedLLMConfigEntry, coordinator: DataUpdateCoordinator[MetricsSnapshot]
    ) -> None:
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


class PagedLLMSensor(CoordinatorEntity[DataUpdateCoordinator[MetricsSnapshot]], SensorEntity):
    """One engine figure on the engine's service device."""

    entity_description: PagedLLMSensorEntityDescription
    _attr_has_entity_name = True
    _attr_entity_category = EntityCategory.DIAGNOSTIC

    def __init__(
        self,
        entry: PagedLLMConfigEntry,
        coordinator: DataUpdateCoordinator[MetricsSnapshot],
        description: PagedLLMSensorEntityDescription,
    ) -> None:
        """Bind the sensor to its entry's engine."""
        super().__init__(coordinator)
        self.entity_description = description
        self.entry = entry
        self._attr_unique_id = f"{entry.entry_id}_{description.key}"
        self._attr_device_info = engine_device_info(entry)

    @property
    def available(self) -> bool:
        """Unavailable once the engine has stopped or crashed, or the server is away."""
        data = getattr(self.entry, "runtime_data", None)
        return super().available and data is not None and data.backend.available

    @property
    def native_value(self) -> float | int | None:
        """The figure from the latest snapshot."""
        return self.entity_description.value_fn(self.coordinator.data)

    @property
    def extra_state_attributes(self) -> Mapping[str, Any] | None:
        """Details behind the figure, where there are any."""
        if self.entity_description.attributes_fn is None:
            return None
        return self.entity_description.attributes_fn(self.coordinator.data)
