"""The home in the tool grammar: Assist's tool arguments held to what exists in the home."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from homeassistant.components.homeassistant.exposed_entities import async_should_expose
from homeassistant.components.homeassistant.llm import GetLiveContextTool
from homeassistant.const import ATTR_DEVICE_CLASS
from homeassistant.core import HomeAssistant, callback
from homeassistant.helpers import area_registry as ar
from homeassistant.helpers import entity_registry as er
from homeassistant.helpers import floor_registry as fr
from homeassistant.helpers import intent, llm

# Intents whose ``name`` is the timer's own name, free text, not an entity's.
TIMER_INTENTS = frozenset(
    {
        intent.INTENT_START_TIMER,
        intent.INTENT_CANCEL_TIMER,
        intent.INTENT_CANCEL_ALL_TIMERS,
        intent.INTENT_INCREASE_TIMER,
        intent.INTENT_DECREASE_TIMER,
        intent.INTENT_PAUSE_TIMER,
        intent.INTENT_UNPAUSE_TIMER,
        intent.INTENT_TIMER_STATUS,
    }
)


# The most values a slot's enum takes; a home with more leaves that slot free. Compiling the
# grammar (bundled model's tokenizer, once per home: it is cached) stays quick up to here and
# grows steeply beyond it.
MAX_VALUES = 5000


@dataclass(slots=True, frozen=True)
class Home:
    """What Assist's tools can name in a home, each sorted.

    The exposed entities' names and aliases, their domains and device classes, and the
    home's areas and floors with their aliases.
    """

    names: tuple[str, ...]
    areas: tuple[str, ...]
    floors: tuple[str, ...]
    domains: tuple[str, ...]
    device_classes: tuple[str, ...]

    def values(self, slot: str) -> tuple[str, ...] | None:
        """The values a slot of this name may take; None for a slot the home does not hold."""
        return {
            "name": self.names,
            "area": self.areas,
            "floor": self.floors,
            "domain": self.domains,
            "device_class": self.device_classes,
        }.get(slot)


def _sorted(values: set[str]) -> tuple[str, ...]:
    """Distinct non-blank values, in a fixed order (the grammar's cache key stays the same)."""
    return tuple(sorted(value for value in values if value.strip()))


@callback
def async_get_home(hass: HomeAssistant, assistant: str) -> Home:
    """The home as the assistant sees it: the entities exposed to it, every area and floor."""
    entities = er.async_get(hass)
    names: set[str] = set()
    domains: set[str] = set()
    classes: set[str] = set()
    for state in hass.states.async_all():
        if not async_should_expose(hass, assistant, state.entity_id):
            continue
        entry = entities.async_get(state.entity_id)
        names.update(intent.async_get_entity_aliases(hass, entry, state=state))
        domains.add(state.domain)
        if isinstance(device_class := state.attributes.get(ATTR_DEVICE_CLASS), str):
            classes.add(device_class)
    areas: set[str] = set()
    for area in ar.async_get(hass).async_list_areas():
        areas.update([area.name, *area.aliases])
    floors: set[str] = set()
    for floor in fr.async_get(hass).async_list_floors():
        floors.update([floor.name, *floor.aliases])
    return Home(_sorted(names), _sorted(areas), _sorted(floors), _sorted(domains), _sorted(classes))


def targets_home(tool: llm.Tool) -> str | None:
    """An Assist tool's intent, or ``GetLiveContext``; None where it names no home thing.

    Scripts and other integrations' tools get None. A namespace is seen through.
    """
    inner = tool.tool if isinstance(tool, llm.NamespacedTool) else tool
    if isinstance(inner, llm.IntentTool):
        return inner.intent_type
    return inner.name if isinstance(inner, GetLiveContextTool) else None


def grammar_tools(
    tools: Sequence[llm.Tool], formatted: Sequence[dict[str, Any]], home: Home
) -> list[dict[str, Any]]:
    """The tools' schemas for the grammar, each intent's targets held to what ``home`` has.

    ``formatted`` are the same tools in the OpenAI format (what the model is shown; it is
    not changed). In an intent tool and in GetLiveContext's filters, ``name``, ``area`` and
    ``floor`` become enums of the home's names, and ``domain`` and ``device_class`` keep
    only values the home has, where the schema takes strings or lists of them; a timer's
    ``name`` stays free, as does a slot with more than MAX_VALUES values. A slot the home
    cannot fill at all is dropped, unless required.
    """
    held = []
    for tool, spec in zip(tools, formatted, strict=True):
        kind = targets_home(tool)
        if kind is None:
            held.append(spec)
            continue
        spec = copy.deepcopy(spec)
        parameters = spec["function"].get("parameters") or {}
        properties: dict[str, Any] = parameters.get("properties") or {}
        required = set(parameters.get("required") or ())
        for slot in list(properties):
            values = home.values(slot)
            if values is None or len(values) > MAX_VALUES:
                continue
            if slot == "name" and kind in TIMER_INTENTS:
                continue
            schema = _held(properties[slot], values)
            if schema is not None:
                properties[slot] = schema
            elif slot not in required:
                del properties[slot]
        held.append(spec)
    return held


def _held(schema: dict[str, Any], values: tuple[str, ...]) -> dict[str, Any] | None:
    """A string (or list-of-strings) schema held to ``values`` and to its own enum if any.

    None when nothing is left; the schema unchanged when it takes something else.
    """
    if isinstance(options := schema.get("anyOf"), list):  # a string, or a list of them
        kept = [held for option in options if (held := _held(option, values)) is not None]
        return {**schema, "anyOf": kept} if kept else None
    if schema.get("type") == "array" and isinstance(items := schema.get("items"), dict):
        inner = _held(items, values)
        return None if inner is None else {**schema, "items": inner}
    if schema.get("type") != "string":
        return schema
    allowed = [v for v in values if v in schema["enum"]] if "enum" in schema else list(values)
    if not allowed:
        return None
    held = {key: value for key, value in schema.items() if key not in ("minLength", "format")}
    held["enum"] = allowed
    return held
