"""Fixtures for the Home Assistant tests: config entries over a real engine and a tiny model."""

from __future__ import annotations

import importlib
from collections.abc import AsyncGenerator, Callable
from pathlib import Path
from typing import Any

import pytest
from homeassistant.components.homeassistant.exposed_entities import async_expose_entity
from homeassistant.config_entries import ConfigEntryState
from homeassistant.const import CONF_DEVICE, CONF_MODEL, CONF_PROMPT
from homeassistant.core import HomeAssistant
from homeassistant.helpers import area_registry as ar
from homeassistant.helpers import entity_registry as er
from homeassistant.helpers import floor_registry as fr
from homeassistant.helpers import llm
from homeassistant.setup import async_setup_component
from pytest_homeassistant_custom_component.common import MockConfigEntry

# Home Assistant finds custom integrations by importing the `custom_components` package.
# Import ours now (the checkout's root is on sys.path through pytest's `pythonpath`): Home
# Assistant's loader would otherwise import the test harness's own `custom_components`
# (from its testing config folder) first, which lacks paged_llm.
importlib.import_module("custom_components")

DOMAIN = "paged_llm"

# Varied English; the SmolLM2 tokenizer gives about one token per word.
SENTENCE = (
    "the kitchen light turned on at seven while the heating in the hall kept the "
    "temperature near twenty degrees and the washing machine finished its cycle before "
    "noon so the family went out for a walk along the river past the old mill"
)
CONVERSATION_TITLE = "Tiny conversation"
AI_TASK_TITLE = "Tiny AI task"


@pytest.fixture(autouse=True)
def auto_enable_custom_integrations(enable_custom_integrations: None) -> None:
    """Let Home Assistant load custom_components/paged_llm in every test."""


@pytest.fixture
def engine_settings(tiny_model_dir: Path) -> dict[str, Any]:
    """Entry data for a CPU engine over the tiny model with a small KV pool."""
    return {
        CONF_MODEL: str(tiny_model_dir),
        CONF_DEVICE: "cpu",
        "dtype": "float32",
        "kv_budget_mib": 4,
        "block_size": 16,
        "max_num_seqs": 16,
        "max_model_len": 0,
    }


@pytest.fixture
def conversation_options() -> dict[str, Any]:
    """A conversation agent that answers in a few tokens (random models rarely stop)."""
    return {
        CONF_PROMPT: llm.DEFAULT_INSTRUCTIONS_PROMPT,
        "max_tokens": 8,
        "temperature": 0.0,
        "max_history": 20,
    }


@pytest.fixture
def ai_task_options() -> dict[str, Any]:
    """An AI task agent with short answers."""
    return {"max_tokens": 12, "temperature": 0.0}


@pytest.fixture
def mock_config_entry(
    hass: HomeAssistant,
    engine_settings: dict[str, Any],
    conversation_options: dict[str, Any],
    ai_task_options: dict[str, Any],
) -> MockConfigEntry:
    """An entry for the tiny model with one conversation and one AI task agent."""
    entry = MockConfigEntry(
        domain=DOMAIN,
        title="tiny",
        data=engine_settings,
        unique_id=engine_settings[CONF_MODEL],
        subentries_data=[
            {
                "subentry_type": "conversation",
                "data": conversation_options,
                "title": CONVERSATION_TITLE,
                "unique_id": None,
            },
            {
                "subentry_type": "ai_task_data",
                "data": ai_task_options,
                "title": AI_TASK_TITLE,
                "unique_id": None,
            },
        ],
    )
    entry.add_to_hass(hass)
    return entry


@pytest.fixture
async def ha_core(hass: HomeAssistant) -> None:
    """Home Assistant's core integration, which conversation agents need (exposed entities)."""
    assert await async_setup_component(hass, "homeassistant", {})


@pytest.fixture
async def small_home(hass: HomeAssistant, ha_core: None) -> None:
    """A small home: two floors, three areas, exposed lights and a sensor, a hidden lock.

    With Assist's intents and LLM API set up, as an agent that controls the home has them.
    """
    assert await async_setup_component(hass, "intent", {})
    assert await async_setup_component(hass, "llm", {})
    floors = fr.async_get(hass)
    ground = floors.async_create("Ground floor", aliases={"downstairs"})
    floors.async_create("Attic")
    areas = ar.async_get(hass)
    kitchen = areas.async_create("Kitchen", floor_id=ground.floor_id, aliases={"Küche"})
    areas.async_create("Bedroom")
    areas.async_create('Kid\'s "den" 🦖')
    entities = er.async_get(hass)
    home = [
        ("light", "ceiling", "Ceiling light", kitchen.id, ["big lamp"], True, {}),
        ("light", "desk", "Desk lamp 寝室", None, [], True, {}),
        (
            "sensor",
            "temp",
            "Kitchen temperature",
            kitchen.id,
            [],
            True,
            {"device_class": "temperature"},
        ),
        ("lock", "front", "Front door", None, [], False, {}),
    ]
    for domain, key, name, area_id, aliases, exposed, attributes in home:
        entry = entities.async_get_or_create(domain, "test", key, original_name=name)
        # The entity's own name is an alias entry of its own (COMPUTED_NAME), first here.
        entities.async_update_entity(
            entry.entity_id, area_id=area_id, aliases=[er.COMPUTED_NAME, *aliases]
        )
        hass.states.async_set(entry.entity_id, "off", {"friendly_name": name, **attributes})
        async_expose_entity(hass, "conversation", entry.entity_id, exposed)


@pytest.fixture
async def init_integration(
    hass: HomeAssistant, ha_core: None, mock_config_entry: MockConfigEntry
) -> AsyncGenerator[MockConfigEntry]:
    """Set the entry up with a real engine; unload it afterwards so no thread is left."""
    assert await hass.config_entries.async_setup(mock_config_entry.entry_id)
    # With the conversation agent's warm-up (a background task: its prompt read cold, then
    # again cached), so a test's own requests are the only ones it sees.
    await hass.async_block_till_done(wait_background_tasks=True)
    assert mock_config_entry.state is ConfigEntryState.LOADED
    yield mock_config_entry
    if mock_config_entry.state is ConfigEntryState.LOADED:
        assert await hass.config_entries.async_unload(mock_config_entry.entry_id)
        await hass.async_block_till_done()


@pytest.fixture
def make_long_text() -> Callable[[int], str]:
    """Make a text of roughly the given number of tokens."""

    def long_text(tokens: int) -> str:
        words = SENTENCE.split(" ")
        return " ".join(
            words[i % len(words)] + ("." if i % 17 == 16 else "") for i in range(tokens)
        )

    return long_text
