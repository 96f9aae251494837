"""Spoken home commands through Assist's tool loop: valid calls and targets, home grammar on/off.

A real Home Assistant runs in this process with the integration's embedded engine and a
test home (HOME: 43 entities in 9 areas on 3 floors, with aliases, names in other scripts
and five entities not exposed to Assist). Each of COMMANDS, phrased as people speak, goes
through ``conversation.async_converse`` to a conversation agent with the Assist API, a new
chat each time, once with the home grammar on and once with it off (two agents on the same
engine, taking turns command by command, so both meet the same machine load, each first
on every other command, as the second finds the command's words cached). Home
Assistant parses and runs the model's tool calls; the intents' service calls land in
recorders that note the entities they touch and set their state, and the home goes back to
its first state before the next command. Per command and agent:

- first-token time: from the command to the model's first streamed token (the engine's
  first output of the first model turn);
- the tool calls: whether each names an offered tool with arguments its schema accepts
  (valid), whether its ``name``, ``area`` or ``floor`` names nothing the home has (matched
  as Home Assistant matches: case and outer spaces ignored; entities not exposed do not
  count), and whether Home Assistant could match its targets;
- correct target: an action touched exactly the expected entities; a question touched
  nothing and a tool answered with the entity in it; a command for something the home
  lacks or does not expose touched nothing.

Greedy decoding: a run repeats on the same machine with the same number of threads (the
C forward's sums, split otherwise, can tip a greedy choice). Prints a markdown table per
model and writes JSON (``bench_results/home_commands-<timestamp>.json`` unless ``--out``).
Usage: ``scripts/bench home_commands [--model bundled:…|PATH.gguf] [--limit N]
[--out FILE.json]``; on a machine other work shares, ``OMP_NUM_THREADS=1`` keeps the
engine's threads from waiting on each other at every barrier (a decode step took seconds).
"""

from __future__ import annotations

# Home Assistant's test harness (built for 2026.10) needs its bridge to 2026.11 outside
# pytest too, imported before the harness and before anything imports httpx.
import tests.homeassistant_first  # noqa: F401

# isort: split

import asyncio
import contextlib
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from unittest.mock import patch

import probatio
from homeassistant import loader
from homeassistant.components import conversation
from homeassistant.components.climate.const import ClimateEntityFeature
from homeassistant.components.cover import CoverEntityFeature
from homeassistant.components.fan.const import FanEntityFeature
from homeassistant.components.homeassistant.exposed_entities import async_expose_entity
from homeassistant.components.media_player.const import MediaPlayerEntityFeature
from homeassistant.const import CONF_DEVICE, CONF_LLM_HASS_API, CONF_MODEL, CONF_PROMPT
from homeassistant.core import Context, HomeAssistant, ServiceCall, callback
from homeassistant.helpers import area_registry as ar
from homeassistant.helpers import chat_session, llm
from homeassistant.helpers import entity_registry as er
from homeassistant.helpers import floor_registry as fr
from homeassistant.setup import async_setup_component
from homeassistant.util import slugify
from pytest_homeassistant_custom_component.common import (
    MockConfigEntry,
    async_test_home_assistant,
)

from custom_components.paged_llm.backend import Delta
from custom_components.paged_llm.const import (
    CONF_HOME_GRAMMAR,
    CONF_MAX_TOKENS,
    CONF_TEMPERATURE,
    DOMAIN,
    SUBENTRY_CONVERSATION,
)
from custom_components.paged_llm.home_grammar import TIMER_INTENTS, targets_home
from paged_llm.defaults import DEFAULT_MODEL

from . import ROOT, argument_parser
from .machine import cpu_name
from .runners import pct

# Home Assistant's assistant id for Assist (what entities are exposed to).
ASSISTANT = conversation.DOMAIN
# The tool slots that name a thing in the home, and where the home keeps its names.
TARGET_SLOTS = ("name", "area", "floor")

# --- The test home --------------------------------------------------------------------

# (name, aliases): the floors.
FLOORS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Ground floor", ("downstairs",)),
    ("First floor", ("upstairs",)),
    ("Basement", ("cellar",)),
)
# (name, floor, aliases): the areas.
AREAS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("Living room", "Ground floor", ("lounge",)),
    ("Kitchen", "Ground floor", ("Küche",)),
    ("Hallway", "Ground floor", ()),
    ("Garage", "Ground floor", ()),
    ("Bedroom", "First floor", ("master bedroom",)),
    ("Emma's room", "First floor", ("kids' room",)),
    ("Bathroom", "First floor", ()),
    ("Büro", "First floor", ("office", "study")),
    ("Laundry room", "Basement", ("utility room",)),
)

# State attributes the intents read (supported features, colour modes, ranges).
DIMMABLE = {"supported_color_modes": ["brightness"]}
BLIND = {
    "device_class": "blind",
    "supported_features": CoverEntityFeature.OPEN
    | CoverEntityFeature.CLOSE
    | CoverEntityFeature.SET_POSITION
    | CoverEntityFeature.STOP,
    "current_position": 0,
}
CURTAIN = {**BLIND, "device_class": "curtain", "current_position": 100}
GARAGE_DOOR = {
    "device_class": "garage",
    "supported_features": CoverEntityFeature.OPEN | CoverEntityFeature.CLOSE,
}
THERMOSTAT = {
    "supported_features": ClimateEntityFeature.TARGET_TEMPERATURE
    | ClimateEntityFeature.TURN_ON
    | ClimateEntityFeature.TURN_OFF,
    "hvac_modes": ["heat", "off"],
    "temperature": 19.0,
    "current_temperature": 20.5,
    "min_temp": 7.0,
    "max_temp": 30.0,
    "target_temp_step": 0.5,
}
PLAYER = {
    "supported_features": MediaPlayerEntityFeature.PAUSE
    | MediaPlayerEntityFeature.PLAY
    | MediaPlayerEntityFeature.NEXT_TRACK
    | MediaPlayerEntityFeature.PREVIOUS_TRACK
    | MediaPlayerEntityFeature.VOLUME_SET
    | MediaPlayerEntityFeature.VOLUME_MUTE
    | MediaPlayerEntityFeature.TURN_ON
    | MediaPlayerEntityFeature.TURN_OFF,
    "volume_level": 0.3,
    "is_volume_muted": False,
}
FAN = {
    "supported_features": FanEntityFeature.SET_SPEED
    | FanEntityFeature.TURN_ON
    | FanEntityFeature.TURN_OFF,
    "percentage": 0,
}
OUTLET = {"device_class": "outlet"}
TEMPERATURE = {"device_class": "temperature", "unit_of_measurement": "°C"}
HUMIDITY = {"device_class": "humidity", "unit_of_measurement": "%"}


@dataclass(frozen=True, slots=True)
class Device:
    """One entity of the test home: its state, area, aliases, and whether Assist sees it."""

    entity_id: str
    name: str
    area: str | None
    state: str
    attributes: Mapping[str, Any] = field(default_factory=dict)
    aliases: tuple[str, ...] = ()
    exposed: bool = True


HOME: tuple[Device, ...] = (
    # Living room
    Device("light.living_room_floor_lamp", "Living room floor lamp", "Living room", "off",
           DIMMABLE, ("reading lamp",)),
    Device("light.living_room_ceiling", "Living room ceiling light", "Living room", "off",
           DIMMABLE),
    Device("media_player.living_room_tv", "Living room TV", "Living room", "playing",
           {**PLAYER, "device_class": "tv"}, ("telly",)),
    Device("cover.living_room_blinds", "Living room blinds", "Living room", "closed", BLIND),
    Device("climate.living_room_thermostat", "Living room thermostat", "Living room", "heat",
           THERMOSTAT),
    Device("fan.living_room_ceiling_fan", "Ceiling fan", "Living room", "off", FAN),
    # Kitchen
    Device("light.kitchen_ceiling", "Kitchen ceiling light", "Kitchen", "on", DIMMABLE),
    Device("light.kitchen_under_cabinet", "Under-cabinet lights", "Kitchen", "on", DIMMABLE,
           ("counter lights",)),
    Device("light.kitchen_pendant", "Hängelampe", "Kitchen", "on", DIMMABLE),
    Device("switch.coffee_machine", "Coffee machine", "Kitchen", "off", OUTLET),
    Device("switch.dishwasher", "Dishwasher", "Kitchen", "off", OUTLET, exposed=False),
    Device("media_player.kitchen_speaker", "Kitchen speaker", "Kitchen", "paused",
           {**PLAYER, "device_class": "speaker"}),
    Device("sensor.kitchen_temperature", "Kitchen temperature", "Kitchen", "22.5", TEMPERATURE),
    Device("lock.back_door", "Back door", "Kitchen", "locked"),
    # Hallway: no light here
    Device("lock.front_door", "Front door", "Hallway", "unlocked"),
    Device("binary_sensor.hallway_motion", "Hallway motion", "Hallway", "off",
           {"device_class": "motion"}),
    # Garage
    Device("cover.garage_door", "Garage door", "Garage", "closed", GARAGE_DOOR, exposed=False),
    Device("lock.garage_side_door", "Side door", "Garage", "locked", exposed=False),
    Device("light.garage", "Garage light", "Garage", "off", DIMMABLE),
    Device("switch.car_charger", "Car charger", "Garage", "off", OUTLET, ("wallbox",)),
    # Bedroom
    Device("light.bedroom", "Bedroom light", "Bedroom", "on", DIMMABLE),
    Device("light.bedside_lamp", "Bedside lamp", "Bedroom", "on", DIMMABLE,
           ("Nachttischlampe",)),
    Device("climate.bedroom_thermostat", "Bedroom thermostat", "Bedroom", "heat", THERMOSTAT),
    Device("cover.bedroom_curtains", "Bedroom curtains", "Bedroom", "open", CURTAIN),
    Device("sensor.bedroom_humidity", "Bedroom humidity", "Bedroom", "48", HUMIDITY),
    # Emma's room
    Device("light.emma_night_light", "Nachtlicht 🌙", "Emma's room", "off", DIMMABLE,
           ("night light",)),
    Device("fan.emma_fan", "Emma's fan", "Emma's room", "off", FAN),
    Device("media_player.emma_speaker", "Emma's speaker", "Emma's room", "idle",
           {**PLAYER, "device_class": "speaker"}, exposed=False),
    # Bathroom
    Device("light.bathroom_mirror", "Mirror light", "Bathroom", "off", DIMMABLE),
    Device("fan.bathroom_extractor", "Extractor fan", "Bathroom", "on",
           {**FAN, "percentage": 100}),
    Device("sensor.bathroom_humidity", "Bathroom humidity", "Bathroom", "71", HUMIDITY),
    Device("switch.towel_warmer", "Towel warmer", "Bathroom", "off", OUTLET),
    # Büro
    Device("light.buro_desk", "Schreibtischlampe", "Büro", "on", DIMMABLE, ("desk lamp",)),
    Device("climate.buro_radiator", "Radiator", "Büro", "heat", THERMOSTAT),
    Device("cover.buro_blind", "Büro blind", "Büro", "closed", BLIND),
    Device("switch.printer", "Printer", "Büro", "on", OUTLET),
    # Laundry room
    Device("switch.washing_machine", "Washing machine", "Laundry room", "on", OUTLET),
    Device("switch.tumble_dryer", "Tumble dryer", "Laundry room", "off", OUTLET),
    Device("light.basement", "Basement light", "Laundry room", "off", DIMMABLE,
           ("cellar light",)),
    Device("binary_sensor.laundry_leak", "Water leak sensor", "Laundry room", "off",
           {"device_class": "moisture"}),
    # No area
    Device("sensor.outdoor_temperature", "Outside temperature", None, "11.5", TEMPERATURE),
    Device("switch.alarm_siren", "Alarm siren", None, "off", exposed=False),
    Device("switch.christmas_lights", "Christmas lights", None, "off", OUTLET),
)  # fmt: skip

# --- The commands ---------------------------------------------------------------------

# What a command asks for: change these entities (ACT), tell about this one (ASK), or
# something the home lacks or does not expose to Assist (NONE: nothing may be touched).
ACT, ASK, NONE = "act", "ask", "none"


@dataclass(frozen=True, slots=True)
class Command:
    """A command as a person says it, and the entities it is about."""

    text: str
    kind: str
    targets: tuple[str, ...] = ()


COMMANDS: tuple[Command, ...] = (
    # Lights, by name, alias, near-miss name, area, area alias and floor alias
    Command("turn off the kitchen lights", ACT,
            ("light.kitchen_ceiling", "light.kitchen_under_cabinet", "light.kitchen_pendant")),
    Command("switch on the living room floor lamp", ACT, ("light.living_room_floor_lamp",)),
    Command("living room lamp on please", ACT, ("light.living_room_floor_lamp",)),
    Command("turn on the reading lamp", ACT, ("light.living_room_floor_lamp",)),
    Command("can you turn off the bedroom light", ACT, ("light.bedroom",)),
    Command("dim the bedside lamp to 30 percent", ACT, ("light.bedside_lamp",)),
    Command("set the mirror light to full brightness", ACT, ("light.bathroom_mirror",)),
    Command("turn off the Nachttischlampe", ACT, ("light.bedside_lamp",)),
    Command("turn off the desk lamp in the office", ACT, ("light.buro_desk",)),
    Command("Schreibtischlampe off please", ACT, ("light.buro_desk",)),
    Command("turn on the night light in Emma's room", ACT, ("light.emma_night_light",)),
    Command("switch on the Hängelampe", ACT, ("light.kitchen_pendant",)),
    Command("turn on the garage light", ACT, ("light.garage",)),
    Command("cellar light on", ACT, ("light.basement",)),
    Command("turn on the lights in the lounge", ACT,
            ("light.living_room_floor_lamp", "light.living_room_ceiling")),
    Command("turn off the counter lights", ACT, ("light.kitchen_under_cabinet",)),
    Command("turn off all the lights upstairs", ACT,
            ("light.bedroom", "light.bedside_lamp", "light.emma_night_light",
             "light.bathroom_mirror", "light.buro_desk")),
    Command("make the ceiling light in the living room brighter, 80 percent", ACT,
            ("light.living_room_ceiling",)),
    # Covers
    Command("close the living room blinds", ACT, ("cover.living_room_blinds",)),
    Command("open the bedroom curtains halfway", ACT, ("cover.bedroom_curtains",)),
    Command("open the Büro blind", ACT, ("cover.buro_blind",)),
    Command("close the curtains in the master bedroom", ACT, ("cover.bedroom_curtains",)),
    # Climate
    Command("set the bedroom to 21 degrees", ACT, ("climate.bedroom_thermostat",)),
    Command("make it 23 degrees in the living room", ACT, ("climate.living_room_thermostat",)),
    Command("turn the radiator in the study down to 18", ACT, ("climate.buro_radiator",)),
    Command("turn off the heating in the office", ACT, ("climate.buro_radiator",)),
    # Media
    Command("pause the TV", ACT, ("media_player.living_room_tv",)),
    Command("next episode on the telly", ACT, ("media_player.living_room_tv",)),
    Command("mute the TV", ACT, ("media_player.living_room_tv",)),
    Command("resume the music on the kitchen speaker", ACT, ("media_player.kitchen_speaker",)),
    Command("set the kitchen speaker volume to 40", ACT, ("media_player.kitchen_speaker",)),
    # Fans
    Command("turn on the ceiling fan", ACT, ("fan.living_room_ceiling_fan",)),
    Command("set Emma's fan to 50 percent", ACT, ("fan.emma_fan",)),
    Command("switch off the extractor fan", ACT, ("fan.bathroom_extractor",)),
    # Switches
    Command("start the coffee machine", ACT, ("switch.coffee_machine",)),
    Command("turn off the washing machine", ACT, ("switch.washing_machine",)),
    Command("switch on the tumble dryer", ACT, ("switch.tumble_dryer",)),
    Command("turn on the towel warmer", ACT, ("switch.towel_warmer",)),
    Command("printer off", ACT, ("switch.printer",)),
    Command("turn on the wallbox", ACT, ("switch.car_charger",)),
    Command("put the christmas lights on", ACT, ("switch.christmas_lights",)),
    # Locks
    Command("lock the front door", ACT, ("lock.front_door",)),
    Command("unlock the back door", ACT, ("lock.back_door",)),
    # Questions
    Command("is the front door locked", ASK, ("lock.front_door",)),
    Command("what's the temperature in the kitchen", ASK, ("sensor.kitchen_temperature",)),
    Command("how warm is it outside", ASK, ("sensor.outdoor_temperature",)),
    Command("is there anyone in the hallway", ASK, ("binary_sensor.hallway_motion",)),
    Command("how humid is the bathroom", ASK, ("sensor.bathroom_humidity",)),
    Command("is the washing machine still running", ASK, ("switch.washing_machine",)),
    Command("are the bedroom curtains open", ASK, ("cover.bedroom_curtains",)),
    Command("what is the bedroom thermostat set to", ASK, ("climate.bedroom_thermostat",)),
    Command("is the back door locked", ASK, ("lock.back_door",)),
    Command("is there a water leak in the laundry room", ASK, ("binary_sensor.laundry_leak",)),
    # Things not exposed to Assist
    Command("open the garage", NONE),
    Command("open the garage door", NONE),
    Command("turn on the dishwasher", NONE),
    Command("unlock the side door", NONE),
    Command("play some music on Emma's speaker", NONE),
    Command("turn off the alarm siren", NONE),
    Command("is the garage door open", NONE),
    # Things the home does not have
    Command("turn on the hallway light", NONE),
    Command("turn on the porch light", NONE),
    Command("switch on the sauna", NONE),
    Command("close the attic window", NONE),
    Command("turn on the lights in the garden", NONE),
    Command("start the robot vacuum", NONE),
    Command("turn on the basement heater", NONE),
)  # fmt: skip


def select(commands: Sequence[Command], limit: int | None) -> list[Command]:
    """``limit`` commands spread evenly over the list (all kinds in a quick run); all if None."""
    if limit is None or limit >= len(commands):
        return list(commands)
    return [commands[i * len(commands) // limit] for i in range(max(limit, 0))]


# --- Recording what the intents do ----------------------------------------------------

# The services Assist's intents call on these domains, and the state each leaves.
SERVICES: dict[str, tuple[str, ...]] = {
    "light": ("turn_on", "turn_off", "toggle"),
    "switch": ("turn_on", "turn_off", "toggle"),
    "fan": ("turn_on", "turn_off", "toggle", "set_percentage"),
    "cover": ("open_cover", "close_cover", "set_cover_position", "stop_cover", "toggle"),
    "lock": ("lock", "unlock", "open"),
    "climate": ("set_temperature", "set_hvac_mode", "turn_on", "turn_off", "set_fan_mode"),
    "media_player": (
        "turn_on", "turn_off", "media_play", "media_pause", "media_play_pause",
        "media_next_track", "media_previous_track", "volume_set", "volume_mute", "play_media",
    ),
}  # fmt: skip
# Domains in the home with no service the intents call.
SENSORS = ("sensor", "binary_sensor")
NEW_STATE = {
    "turn_on": "on",
    "turn_off": "off",
    "open_cover": "open",
    "close_cover": "closed",
    "lock": "locked",
    "unlock": "unlocked",
    "open": "open",
    "media_play": "playing",
    "media_pause": "paused",
}
# Service data that becomes a state attribute of the same meaning.
NEW_ATTRIBUTES = {
    "brightness_pct": "brightness",
    "temperature": "temperature",
    "position": "current_position",
    "percentage": "percentage",
    "volume_level": "volume_level",
    "is_volume_muted": "is_volume_muted",
}


@dataclass(slots=True)
class ServiceRecorder:
    """Every domain service the intents call: which entities it touched, and their new state."""

    hass: HomeAssistant
    calls: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)

    @callback
    def register(self) -> None:
        """Take over the domains' services (their entity components have no entities here)."""
        for domain, services in SERVICES.items():
            for service in services:
                self.hass.services.async_register(domain, service, self._record)

    @callback
    def _record(self, call: ServiceCall) -> None:
        """Note the call and give its entities the state the service would leave."""
        entity_ids = call.data.get("entity_id", [])
        ids = tuple(sorted([entity_ids] if isinstance(entity_ids, str) else entity_ids))
        self.calls.append((f"{call.domain}.{call.service}", ids))
        for entity_id in ids:
            state = self.hass.states.get(entity_id)
            if state is None:
                continue
            value = NEW_STATE.get(call.service, state.state)
            if call.service == "toggle":
                value = "off" if state.state == "on" else "on"
            attributes = dict(state.attributes)
            for key, attribute in NEW_ATTRIBUTES.items():
                if key in call.data:
                    attributes[attribute] = call.data[key]
            self.hass.states.async_set(entity_id, value, attributes)

    def touched(self) -> set[str]:
        """The entities any recorded call touched."""
        return {entity_id for _service, ids in self.calls for entity_id in ids}


@callback
def async_reset_home(hass: HomeAssistant) -> None:
    """Every entity back to its first state (each command starts from the same home)."""
    for device in HOME:
        hass.states.async_set(
            device.entity_id, device.state, {"friendly_name": device.name, **device.attributes}
        )


async def async_build_home(hass: HomeAssistant) -> None:
    """Floors, areas and HOME's entities in the registries, each exposed to Assist or not."""
    floors = fr.async_get(hass)
    floor_ids = {
        name: floors.async_create(name, aliases=set(aliases)).floor_id for name, aliases in FLOORS
    }
    areas = ar.async_get(hass)
    area_ids = {
        name: areas.async_create(name, floor_id=floor_ids[floor], aliases=set(aliases)).id
        for name, floor, aliases in AREAS
    }
    entities = er.async_get(hass)
    for device in HOME:
        domain, object_id = device.entity_id.split(".")
        entry = entities.async_get_or_create(
            domain, "home_commands", object_id, suggested_object_id=object_id,
            original_name=device.name,
        )  # fmt: skip
        assert entry.entity_id == device.entity_id, entry.entity_id
        # The entity's own name stays one of its names (COMPUTED_NAME), as the UI keeps it.
        entities.async_update_entity(
            entry.entity_id,
            area_id=area_ids[device.area] if device.area else None,
            aliases=[er.COMPUTED_NAME, *device.aliases],
        )
        async_expose_entity(hass, ASSISTANT, entry.entity_id, device.exposed)
    async_reset_home(hass)


@dataclass(frozen=True, slots=True)
class Known:
    """What a tool may name in the home, as Home Assistant matches it (casefolded, stripped).

    Names and aliases of exposed entities and their entity ids; areas and floors with their
    aliases and ids. An entity not exposed to Assist is not known: Assist cannot use it.
    """

    name: frozenset[str]
    area: frozenset[str]
    floor: frozenset[str]

    def missing(self, args: Mapping[str, Any]) -> list[str]:
        """The ``name``, ``area`` and ``floor`` values among ``args`` that name nothing known."""
        missing = []
        for slot in TARGET_SLOTS:
            value = args.get(slot)
            values = value if isinstance(value, list) else [value]
            known: frozenset[str] = getattr(self, slot)
            missing += [
                f"{slot}={v!r}"
                for v in values
                if isinstance(v, str) and v.strip() and normalize(v) not in known
            ]
        return missing


def normalize(name: str) -> str:
    """A name as Home Assistant's intents compare names."""
    return name.strip().casefold()


def known_in(home: Iterable[Device]) -> Known:
    """What the test home exposes to Assist."""
    names: set[str] = set()
    for device in home:
        if device.exposed:
            names.update([device.entity_id, device.name, *device.aliases])
    areas = {n for name, _floor, aliases in AREAS for n in (name, *aliases)}
    floors = {n for name, aliases in FLOORS for n in (name, *aliases)}
    # Areas and floors are also matched by id: the registries make it from the first name.
    areas |= {slugify(name) for name, _floor, _aliases in AREAS}
    floors |= {slugify(name) for name, _aliases in FLOORS}
    return Known(
        frozenset(map(normalize, names)),
        frozenset(map(normalize, areas)),
        frozenset(map(normalize, floors)),
    )


# --- One command, scored -------------------------------------------------------------

# How a tool says it found no entity to act on: an intent's error type, the start of
# GetLiveContext's own messages ("… matched name 'x'", "… found in area 'y'").
MATCH_ERRORS = frozenset({"MatchFailedError", "NoStatesMatchedError"})
LIVE_CONTEXT_NO_MATCH = "No exposed entities"


@dataclass(slots=True)
class Call:
    """One tool call the model made, and what came of it."""

    tool: str
    args: dict[str, Any]
    valid: bool  # an offered tool, with arguments its schema accepts
    missing: list[str]  # target values that name nothing in the home
    error: str | None = None  # the tool's error (its type, or its message), None when it ran
    error_text: str | None = None
    result: str = ""  # what the tool answered, as the model saw it

    @property
    def not_matched(self) -> bool:
        """Whether Home Assistant found nothing in the home that fits the call's targets."""
        return self.error in MATCH_ERRORS or (self.error or "").startswith(LIVE_CONTEXT_NO_MATCH)


@dataclass(slots=True)
class Outcome:
    """What one command led to with one agent."""

    first_token_s: float | None
    total_s: float
    turns: list[Turn]
    calls: list[Call]
    services: list[tuple[str, tuple[str, ...]]]
    answer: str
    correct: bool = False


def is_correct(command: Command, outcome: Outcome) -> bool:
    """Whether the command reached exactly its target (see the module's docstring)."""
    touched = {entity_id for _service, ids in outcome.services for entity_id in ids}
    if command.kind == ACT:
        return touched == set(command.targets)
    if command.kind == NONE or touched:
        return not touched
    device = next(d for d in HOME if d.entity_id == command.targets[0])
    names = [normalize(n) for n in (device.name, *device.aliases)]
    return any(
        call.error is None and any(n in normalize(call.result) for n in names)
        for call in outcome.calls
    )


def judge_call(tool_input: llm.ToolInput, tools: Sequence[llm.Tool], known: Known) -> Call:
    """A call as made: whether it fits an offered tool, and which targets name nothing."""
    tool = next((t for t in tools if t.name == tool_input.tool_name), None)
    args = dict(tool_input.tool_args)
    if tool is None:
        return Call(tool_input.tool_name, args, valid=False, missing=[])
    try:
        tool.parameters(args)
        valid = True
    except probatio.Invalid:
        valid = False
    # A timer's name is its own, and tools outside Assist name no home things.
    kind = targets_home(tool)
    names_home = kind is not None and kind not in TIMER_INTENTS
    return Call(tool.name, args, valid=valid, missing=known.missing(args) if names_home else [])


def read_chat_log(chat_log: conversation.ChatLog, known: Known) -> tuple[list[Call], str]:
    """The tool calls of a finished chat, each with its result, and the last answer's text."""
    tools = list(chat_log.llm_api.tools) if chat_log.llm_api else []
    calls: dict[str, Call] = {}
    answer = ""
    for content in chat_log.content:
        if isinstance(content, conversation.AssistantContent):
            answer = content.content or answer
            for tool_input in content.tool_calls or ():
                calls[tool_input.id] = judge_call(tool_input, tools, known)
        elif isinstance(content, conversation.ToolResultContent):
            call = calls.get(content.tool_call_id)
            if call is None:
                continue
            data = dict(content.result.data)
            call.result = json.dumps(data, ensure_ascii=False, default=str)
            if content.result.error:
                call.error = str(data.get("error", "error"))
                call.error_text = str(data.get("error_text", ""))
            elif data.get("response_type") == "error":
                # An intent that answered with an error rather than raising one.
                details = data.get("data")
                code = details.get("code") if isinstance(details, dict) else None
                call.error = str(code or "error")
    return list(calls.values()), answer


@dataclass(slots=True)
class Turn:
    """One model turn: when it started, gave its first output and ended; its tokens.

    Times are ``time.perf_counter`` readings while the command runs, then seconds since
    the command was said (:func:`async_command`).
    """

    started: float
    first: float | None = None
    ended: float | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None


class TurnClock:
    """Wraps a backend's ``stream``: each model turn's times and token counts."""

    def __init__(self, stream: Any) -> None:
        """Time the calls of ``stream`` (the backend's own method)."""
        self._stream = stream
        self.turns: list[Turn] = []

    async def __call__(self, *args: Any, **kwargs: Any) -> AsyncIterator[Delta]:
        """Stream as the backend does, noting the first and the last delta."""
        turn = Turn(time.perf_counter())
        self.turns.append(turn)
        async for delta in self._stream(*args, **kwargs):
            if turn.first is None:
                turn.first = time.perf_counter()
            if delta.finished:
                turn.ended = time.perf_counter()
                turn.prompt_tokens = delta.prompt_tokens
                turn.cached_tokens = delta.cached_tokens
                turn.completion_tokens = delta.completion_tokens
                turn.finish_reason = delta.finish_reason
            yield delta


# --- The run -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Settings:
    """The engine and agents of a run."""

    model: str = DEFAULT_MODEL
    device: str = "cpu"
    weights: str = "auto"
    kv_budget_mib: int = 1024
    max_tokens: int = 128


def agent_options(grammar: bool, settings: Settings) -> dict[str, Any]:
    """A conversation agent with Assist, greedy, with the home grammar on or off."""
    return {
        CONF_LLM_HASS_API: [llm.LLM_API_ASSIST],
        CONF_PROMPT: llm.DEFAULT_INSTRUCTIONS_PROMPT,
        CONF_MAX_TOKENS: settings.max_tokens,
        CONF_TEMPERATURE: 0.0,
        CONF_HOME_GRAMMAR: grammar,
    }


GRAMMAR = {"on": True, "off": False}
# Kept between runs: the engine's C kernels take a while to build on a small machine.
ENGINE_CACHE = ROOT / ".cache" / "home-commands"


async def async_setup_home_assistant(hass: HomeAssistant) -> ServiceRecorder:
    """Assist's parts, the domains whose intents the commands use, the home, the recorders."""
    # The test harness turns custom integrations off; this checkout's paged_llm is wanted.
    hass.data.pop(loader.DATA_CUSTOM_COMPONENTS, None)
    for domain in ("homeassistant", "intent", "llm", "conversation", *SERVICES, *SENSORS):
        assert await async_setup_component(hass, domain, {}), domain
    recorder = ServiceRecorder(hass)
    recorder.register()
    await async_build_home(hass)
    return recorder


async def async_add_engine(
    hass: HomeAssistant, settings: Settings, modes: Sequence[str]
) -> tuple[MockConfigEntry, dict[str, str]]:
    """The integration's embedded engine with one conversation agent per grammar mode."""
    entry = MockConfigEntry(
        domain=DOMAIN,
        title="home commands",
        data={
            CONF_MODEL: settings.model,
            CONF_DEVICE: settings.device,
            "weights": settings.weights,
            "kv_budget_mib": settings.kv_budget_mib,
            "max_num_seqs": 4,
        },
        unique_id=settings.model,
        subentries_data=[
            {
                "subentry_type": SUBENTRY_CONVERSATION,
                "data": agent_options(GRAMMAR[mode], settings),
                "title": f"grammar {mode}",
                "unique_id": None,
            }
            for mode in modes
        ],
    )
    entry.add_to_hass(hass)
    assert await hass.config_entries.async_setup(entry.entry_id), entry.state
    await hass.async_block_till_done()
    entities = er.async_get(hass)
    agents = {}
    for subentry in entry.subentries.values():
        agent = entities.async_get_entity_id("conversation", DOMAIN, subentry.subentry_id)
        assert agent is not None
        agents[subentry.title.removeprefix("grammar ")] = agent
    return entry, agents


async def async_command(
    hass: HomeAssistant,
    agent_id: str,
    command: Command,
    recorder: ServiceRecorder,
    clock: TurnClock,
    known: Known,
) -> Outcome:
    """Say one command to the agent in a new chat; what the model and the home did."""
    async_reset_home(hass)
    recorder.calls.clear()
    clock.turns.clear()
    context = Context()
    with (
        chat_session.async_get_chat_session(hass, context=context) as session,
        conversation.async_get_chat_log(hass, session) as chat_log,
    ):
        started = time.perf_counter()
        await conversation.async_converse(
            hass, command.text, session.conversation_id, context, agent_id=agent_id
        )
        total = time.perf_counter() - started
        # Tools still running in the background (none should) finish before scoring.
        await hass.async_block_till_done()
        calls, answer = read_chat_log(chat_log, known)
    turns = [
        Turn(
            t.started - started,
            None if t.first is None else t.first - started,
            None if t.ended is None else t.ended - started,
            t.prompt_tokens,
            t.cached_tokens,
            t.completion_tokens,
            t.finish_reason,
        )
        for t in clock.turns
    ]
    outcome = Outcome(
        turns[0].first if turns else None,
        total,
        turns,
        calls,
        list(recorder.calls),
        answer,
    )
    outcome.correct = is_correct(command, outcome)
    return outcome


@contextlib.asynccontextmanager
async def async_home_assistant(config_dir: Path) -> AsyncIterator[HomeAssistant]:
    """A running Home Assistant in this process; its HTTP server binds no port (as in tests)."""
    # The engine's cache (built kernels, GGUF tokenizers) outlives the run: slow to build.
    ENGINE_CACHE.mkdir(parents=True, exist_ok=True)
    (config_dir / ".cache").mkdir(exist_ok=True)
    (config_dir / ".cache" / DOMAIN).symlink_to(ENGINE_CACHE, target_is_directory=True)
    with (
        patch("homeassistant.components.http.HomeAssistantHTTP.async_bind"),
        patch("homeassistant.components.http.HomeAssistantHTTP.start"),
    ):
        async with async_test_home_assistant(config_dir=str(config_dir)) as hass:
            try:
                yield hass
            finally:
                await hass.async_stop(force=True)


async def async_run(
    settings: Settings,
    commands: Sequence[Command],
    modes: Sequence[str],
    progress: bool = True,
    after_command: Callable[[Mapping[str, Sequence[Outcome]]], object] | None = None,
) -> dict[str, list[Outcome]]:
    """Every command with every agent, taking turns; the outcomes by grammar mode.

    ``after_command`` sees the outcomes so far after each command (a long run that is
    stopped keeps what it measured).
    """
    known = known_in(HOME)
    outcomes: dict[str, list[Outcome]] = {mode: [] for mode in modes}
    # A fresh configuration folder: the registries start empty.
    with tempfile.TemporaryDirectory(prefix="home-commands-") as config_dir:
        async with async_home_assistant(Path(config_dir)) as hass:
            recorder = await async_setup_home_assistant(hass)
            entry, agents = await async_add_engine(hass, settings, modes)
            backend = entry.runtime_data.backend
            clock = TurnClock(backend.stream)
            with patch.object(backend, "stream", clock):
                # A first request pays for warming up (grammar tables, kernels): no command.
                for agent in agents.values():
                    await conversation.async_converse(
                        hass, "hello", None, Context(), agent_id=agent
                    )
                for number, command in enumerate(commands, 1):
                    # The second agent finds the command's words cached by the first: each
                    # mode goes first on every other command, so neither gains by it.
                    for mode in modes if number % 2 else list(reversed(modes)):
                        outcome = await async_command(
                            hass, agents[mode], command, recorder, clock, known
                        )
                        outcomes[mode].append(outcome)
                        if progress:
                            print(progress_line(number, len(commands), mode, command, outcome),
                                  file=sys.stderr, flush=True)  # fmt: skip
                    if after_command is not None:
                        after_command(outcomes)
            assert await hass.config_entries.async_unload(entry.entry_id)
    return outcomes


def progress_line(number: int, total: int, mode: str, command: Command, outcome: Outcome) -> str:
    """One command's outcome, for following a long run."""
    calls = "; ".join(
        f"{c.tool.split('__')[-1]}({json.dumps(c.args, ensure_ascii=False)})"
        + (f" -> {c.error}" if c.error else "")
        for c in outcome.calls
    )
    mark = "ok " if outcome.correct else "BAD"
    first = f"{outcome.first_token_s:.2f}s" if outcome.first_token_s is not None else "-"
    turns = " ".join(
        f"{t.prompt_tokens}p/{t.cached_tokens}c/{t.completion_tokens}o" for t in outcome.turns
    )
    return (
        f"[{number}/{total} {mode:>3}] {mark} first {first} total {outcome.total_s:.1f}s "
        f"[{turns}] {command.text!r}: {calls or '(no call)'}"
    )


# --- Figures -------------------------------------------------------------------------


def summarize(commands: Sequence[Command], outcomes: Sequence[Outcome]) -> dict[str, Any]:
    """The figures of one agent over the commands."""
    calls = [call for outcome in outcomes for call in outcome.calls]
    firsts = [o.first_token_s for o in outcomes if o.first_token_s is not None]
    by_kind = {}
    for kind in (ACT, ASK, NONE):
        picked = [o for c, o in zip(commands, outcomes, strict=True) if c.kind == kind]
        by_kind[kind] = {"commands": len(picked), "correct": sum(o.correct for o in picked)}
    return {
        "commands": len(outcomes),
        "commands_with_a_call": sum(bool(o.calls) for o in outcomes),
        "calls": len(calls),
        "valid_calls": sum(c.valid for c in calls),
        "calls_naming_a_missing_target": sum(bool(c.missing) for c in calls),
        "calls_not_matched": sum(c.not_matched for c in calls),
        "calls_failed_otherwise": sum(c.error is not None and not c.not_matched for c in calls),
        "correct": sum(o.correct for o in outcomes),
        "correct_rate": statistics.fmean(o.correct for o in outcomes) if outcomes else None,
        "by_kind": by_kind,
        "first_token_p50_s": pct(firsts, 0.5),
        "first_token_p95_s": pct(firsts, 0.95),
        "seconds_per_command": statistics.fmean(o.total_s for o in outcomes) if outcomes else None,
    }


def table(model: str, summaries: Mapping[str, Mapping[str, Any]]) -> str:
    """The markdown table of one model: a row per grammar mode."""

    def seconds(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    lines = [
        f"**{model}**",
        "",
        "| home grammar | commands | with a call | calls | valid | naming a missing target "
        "| not matched by HA | correct target | act / ask / none correct "
        "| first token p50 / p95 (s) | s per command |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for mode, s in summaries.items():
        kinds = " / ".join(
            f"{s['by_kind'][k]['correct']}/{s['by_kind'][k]['commands']}" for k in (ACT, ASK, NONE)
        )
        rate = "-" if s["correct_rate"] is None else f"{s['correct_rate']:.0%}"
        lines.append(
            f"| {mode} | {s['commands']} | {s['commands_with_a_call']} | {s['calls']} "
            f"| {s['valid_calls']} | {s['calls_naming_a_missing_target']} "
            f"| {s['calls_not_matched']} | {s['correct']} ({rate}) | {kinds} "
            f"| {seconds(s['first_token_p50_s'])} / {seconds(s['first_token_p95_s'])} "
            f"| {seconds(s['seconds_per_command'])} |"
        )
    return "\n".join(lines)


def results(
    settings: Settings, commands: Sequence[Command], outcomes: Mapping[str, Sequence[Outcome]]
) -> dict[str, Any]:
    """The run as JSON: settings, the figures per mode, and every command's outcomes."""
    return {
        "benchmark": "home_commands",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "settings": asdict(settings),
        "machine": {
            "cpu": cpu_name(),
            "cores": os.cpu_count(),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        },
        "home": {
            "entities": len(HOME),
            "exposed": sum(d.exposed for d in HOME),
            "areas": len(AREAS),
            "floors": len(FLOORS),
        },
        "summary": {mode: summarize(commands, o) for mode, o in outcomes.items()},
        "commands": [
            {
                **asdict(command),
                **{mode: asdict(o[i]) for mode, o in outcomes.items()},
            }
            for i, command in enumerate(commands)
        ],
    }


def main(argv: list[str] | None = None) -> int:
    """Run the commands on one model, print the table, write the JSON."""
    parser = argument_parser("home_commands", __doc__.splitlines()[0])
    parser.add_argument(
        "--model", default=DEFAULT_MODEL, help="the bundled model (default) or a .gguf file"
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--weights", default="auto")
    parser.add_argument("--kv-budget-mib", type=int, default=Settings().kv_budget_mib)
    parser.add_argument(
        "--max-tokens", type=int, default=Settings().max_tokens, help="per model turn"
    )
    parser.add_argument("--limit", type=int, help="run only N commands, spread over the list")
    parser.add_argument("--grammar", default="on,off", help="on, off, or on,off (default)")
    parser.add_argument("--out", type=Path, help="the JSON file (default: bench_results/)")
    parser.add_argument("--quiet", action="store_true", help="no line per command")
    args = parser.parse_args(argv)
    modes = [mode.strip() for mode in args.grammar.split(",") if mode.strip()]
    if not modes or any(mode not in GRAMMAR for mode in modes):
        parser.error("--grammar takes on, off or on,off")
    model = args.model
    if model.endswith(".gguf"):
        model = str(Path(model).expanduser().resolve())
    settings = Settings(model, args.device, args.weights, args.kv_budget_mib, args.max_tokens)
    # The camera integration (loaded with media_player's) logs a traceback when libturbojpeg
    # is missing; nothing here takes a snapshot.
    logging.getLogger("homeassistant.components.camera.img_util").setLevel(logging.CRITICAL)
    commands = select(COMMANDS, args.limit)
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    out = args.out or ROOT / "bench_results" / f"home_commands-{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)

    def save(outcomes: Mapping[str, Sequence[Outcome]]) -> dict[str, Any]:
        """Write the commands done so far; the figures."""
        done = len(next(iter(outcomes.values())))
        data = results(settings, commands[:done], outcomes)
        data["complete"] = done == len(commands)
        out.write_text(json.dumps(data, indent=2, ensure_ascii=False, default=str))
        return data

    outcomes = asyncio.run(
        async_run(settings, commands, modes, progress=not args.quiet, after_command=save)
    )
    print(table(settings.model, save(outcomes)["summary"]))
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
