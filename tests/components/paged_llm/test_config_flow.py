"""Config flow: test-loading a model, form errors, duplicates, reconfigure and agent subentries."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any
from unittest.mock import patch

import pytest
from homeassistant import config_entries
from homeassistant.config_entries import ConfigEntryState
from homeassistant.const import CONF_LLM_HASS_API, CONF_MODEL, CONF_NAME, CONF_PROMPT
from homeassistant.core import HomeAssistant
from homeassistant.data_entry_flow import FlowResultType
from homeassistant.helpers import entity_registry as er
from homeassistant.helpers import llm
from homeassistant.setup import async_setup_component
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.paged_llm.config_flow import chosen_model
from custom_components.paged_llm.const import DOMAIN
from custom_components.paged_llm.schemas import form_values
from paged_llm.defaults import DEFAULT_MODEL
from paged_llm.engine.async_engine import AsyncEngine

pytestmark = pytest.mark.usefixtures("ha_core")


def _form(settings: dict[str, Any]) -> dict[str, Any]:
    """Entry data as the form sends it (selects of strings, the model in two fields)."""
    return form_values(settings)


async def _embedded_form(hass: HomeAssistant) -> dict[str, Any]:
    """Start a flow and choose to run the model here; return the engine settings form."""
    result = await hass.config_entries.flow.async_init(
        DOMAIN, context={"source": config_entries.SOURCE_USER}
    )
    assert result["type"] is FlowResultType.FORM
    assert result["step_id"] == "user"
    assert result["errors"] == {}
    options = result["data_schema"].schema["backend"].config["options"]
    assert options == ["embedded", "remote"]
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], {"backend": "embedded"}
    )
    assert result["type"] is FlowResultType.FORM
    assert result["step_id"] == "embedded"
    return result


async def _user_flow(hass: HomeAssistant, settings: dict[str, Any]) -> dict[str, Any]:
    """Run the engine form and the progress step; return the result after the load."""
    result = await _embedded_form(hass)
    result = await hass.config_entries.flow.async_configure(result["flow_id"], _form(settings))
    assert result["type"] is FlowResultType.SHOW_PROGRESS
    assert result["step_id"] == "load"
    assert result["progress_action"] == "load_model"
    await hass.async_block_till_done()
    return await hass.config_entries.flow.async_configure(result["flow_id"])


async def test_form_offers_the_bundled_default(hass: HomeAssistant) -> None:
    result = await _embedded_form(hass)
    schema = result["data_schema"].schema
    model_key = next(key for key in schema if key == CONF_MODEL)
    assert model_key.default() == "bundled"
    # A fixed, translated list: a combo box would show the raw value once chosen.
    options = [option["value"] for option in schema[model_key].config["options"]]
    # The bundled model, the recommended files (test_model_picker.py), another file.
    assert options[0] == "bundled"
    assert options[-1] == "other"
    assert schema[model_key].config["translation_key"] == CONF_MODEL
    assert not schema[model_key].config.get("custom_value")
    assert {str(key) for key in schema} >= {
        "custom_model",
        "device",
        "dtype",
        "weights",
        "kv_budget_mib",
        "block_size",
        "max_num_seqs",
        "max_model_len",
    }


async def test_another_model_needs_a_typed_model(
    hass: HomeAssistant, engine_settings: dict[str, Any]
) -> None:
    result = await _embedded_form(hass)
    typed = {**_form(engine_settings), CONF_MODEL: "other", "custom_model": "  "}
    result = await hass.config_entries.flow.async_configure(result["flow_id"], typed)
    assert result["type"] is FlowResultType.FORM
    assert result["step_id"] == "embedded"
    assert result["errors"] == {"custom_model": "model_missing"}
    # What the user entered stays on the form.
    kv_key = next(key for key in result["data_schema"].schema if key == "kv_budget_mib")
    assert kv_key.description == {"suggested_value": engine_settings["kv_budget_mib"]}


def test_the_two_model_fields_name_one_model(tmp_path: Path) -> None:
    assert chosen_model({CONF_MODEL: "bundled", "custom_model": "/leftover"}) == DEFAULT_MODEL
    assert chosen_model({CONF_MODEL: "other", "custom_model": " Qwen/Qwen3-0.6B "}) == (
        "Qwen/Qwen3-0.6B"
    )
    assert chosen_model({CONF_MODEL: "other", "custom_model": f"{tmp_path}/./"}) == str(tmp_path)
    # And back: the form shows an entry's model in the same two fields.
    assert form_values({CONF_MODEL: DEFAULT_MODEL})[CONF_MODEL] == "bundled"
    values = form_values({CONF_MODEL: str(tmp_path)})
    assert (values[CONF_MODEL], values["custom_model"]) == ("other", str(tmp_path))


async def test_happy_path_loads_once_and_creates_entry_with_agents(
    hass: HomeAssistant, engine_settings: dict[str, Any]
) -> None:
    with patch.object(AsyncEngine, "start", autospec=True, side_effect=AsyncEngine.start) as start:
        result = await _user_flow(hass, engine_settings)
        await hass.async_block_till_done()
    assert result["type"] is FlowResultType.CREATE_ENTRY
    assert result["title"] == Path(engine_settings[CONF_MODEL]).name
    assert result["data"] == {
        "backend": "embedded",
        **engine_settings,
        "idle_unload_minutes": 0,
        "weights": "auto",
    }
    entry = result["result"]
    assert entry.unique_id == engine_settings[CONF_MODEL]
    assert sorted(s.subentry_type for s in entry.subentries.values()) == [
        "ai_task_data",
        "conversation",
    ]
    assert entry.state is ConfigEntryState.LOADED
    # The engine the flow test-loaded is the one the entry runs: the model loaded once.
    assert start.call_count == 1
    assert entry.runtime_data.backend.engine.is_running
    entities = er.async_entries_for_config_entry(er.async_get(hass), entry.entry_id)
    domains = sorted({e.domain for e in entities})
    assert domains == ["ai_task", "conversation", "sensor"]
    engine = entry.runtime_data.backend.engine
    assert await hass.config_entries.async_unload(entry.entry_id)
    assert not engine.is_running


async def test_unloadable_model_is_a_form_error_naming_the_cause(
    hass: HomeAssistant, engine_settings: dict[str, Any], tmp_path: Path
) -> None:
    result = await _user_flow(hass, {**engine_settings, CONF_MODEL: str(tmp_path)})
    assert result["type"] is FlowResultType.FORM
    assert result["step_id"] == "embedded"
    assert result["errors"] == {"base": "model_load_failed"}
    assert "config.json is missing" in result["description_placeholders"]["reason"]
    assert str(tmp_path) in result["description_placeholders"]["reason"]

    # The user can correct the model and go on from the same flow.
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], _form(engine_settings)
    )
    assert result["type"] is FlowResultType.SHOW_PROGRESS
    await hass.async_block_till_done()
    result = await hass.config_entries.flow.async_configure(result["flow_id"])
    assert result["type"] is FlowResultType.CREATE_ENTRY
    await hass.async_block_till_done()
    assert await hass.config_entries.async_unload(result["result"].entry_id)


async def test_unsupported_architecture_is_a_translated_form_error(
    hass: HomeAssistant, engine_settings: dict[str, Any], tmp_path: Path
) -> None:
    from transformers import BloomConfig

    BloomConfig(n_layer=1, hidden_size=32, n_head=2).save_pretrained(tmp_path)
    result = await _user_flow(hass, {**engine_settings, CONF_MODEL: str(tmp_path)})
    assert result["type"] is FlowResultType.FORM
    assert result["errors"] == {"base": "unsupported_model"}
    assert "ALiBi" in result["description_placeholders"]["reason"]


async def test_missing_gguf_file_is_a_form_error(
    hass: HomeAssistant, engine_settings: dict[str, Any], tmp_path: Path
) -> None:
    missing = tmp_path / "nothing.gguf"
    result = await _user_flow(hass, {**engine_settings, CONF_MODEL: str(missing)})
    assert result["errors"] == {"base": "model_load_failed"}
    assert "does not exist" in result["description_placeholders"]["reason"]


async def test_broken_torch_is_named_where_the_settings_need_it(
    hass: HomeAssistant, engine_settings: dict[str, Any]
) -> None:
    """The engine itself needs no torch, so a broken torch leaves it on offer; a model on
    the torch path (the tiny model is a folder, not a GGUF file) then fails naming it."""
    real_import = importlib.import_module

    def no_torch(name: str, package: str | None = None) -> Any:
        if name == "torch":
            raise ImportError("libtorch_cpu.so: cannot open shared object file")
        return real_import(name, package)

    with patch("custom_components.paged_llm.engine_import.importlib.import_module", no_torch):
        result = await _user_flow(hass, engine_settings)
    assert result["type"] is FlowResultType.FORM
    assert result["step_id"] == "embedded"
    assert result["errors"] == {"base": "torch_unavailable"}
    assert "libtorch_cpu.so" in result["description_placeholders"]["reason"]


async def test_duplicate_model_is_aborted(
    hass: HomeAssistant, mock_config_entry: MockConfigEntry, engine_settings: dict[str, Any]
) -> None:
    result = await _embedded_form(hass)
    # The same folder spelt differently is the same model.
    spelled = engine_settings[CONF_MODEL] + "/./"
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], _form({**engine_settings, CONF_MODEL: spelled})
    )
    assert result["type"] is FlowResultType.ABORT
    assert result["reason"] == "already_configured"


async def test_reconfigure_restarts_engine_with_new_kv_budget(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    entry = init_integration
    old_engine = entry.runtime_data.backend.engine
    old_blocks = old_engine.info.num_kv_blocks

    result = await entry.start_reconfigure_flow(hass)
    assert result["type"] is FlowResultType.FORM
    assert result["step_id"] == "reconfigure"
    # The model picker too; "Another file or model" left empty keeps the entry's model.
    assert CONF_MODEL in {str(key) for key in result["data_schema"].schema}
    with patch.object(AsyncEngine, "start", autospec=True, side_effect=AsyncEngine.start) as start:
        result = await hass.config_entries.flow.async_configure(
            result["flow_id"],
            {
                "device": "cpu",
                "dtype": "float32",
                "weights": "q8",
                "kv_budget_mib": 8,
                "block_size": "16",
                "max_num_seqs": 8,
                "max_model_len": 0,
            },
        )
        # Settings that load the model differently are test-loaded first, as the first run.
        assert result["type"] is FlowResultType.SHOW_PROGRESS
        assert result["step_id"] == "load"
        await hass.async_block_till_done()
        result = await hass.config_entries.flow.async_configure(result["flow_id"])
        assert result["type"] is FlowResultType.ABORT
        assert result["reason"] == "reconfigure_successful"
        await hass.async_block_till_done()
    # The engine the flow test-loaded is the one the entry restarts with: loaded once.
    assert start.call_count == 1

    assert entry.state is ConfigEntryState.LOADED
    assert entry.data["kv_budget_mib"] == 8
    new_engine = entry.runtime_data.backend.engine
    assert new_engine is not old_engine
    assert not old_engine.is_running
    assert new_engine.is_running
    # Twice the budget, and a float16 KV cache (auto, under quantized weights): 4x blocks.
    assert new_engine.info.num_kv_blocks == 4 * old_blocks
    assert new_engine.config.max_num_seqs == 8
    # The weights choice reaches the loader: the linear layers are 8-bit now.
    assert new_engine._llm.loaded.weights.startswith("q8 (")


async def test_reconfigure_rejects_settings_the_model_cannot_hold(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    entry = init_integration
    engine = entry.runtime_data.backend.engine
    result = await entry.start_reconfigure_flow(hass)
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"],
        {
            "device": "cpu",
            "dtype": "float32",
            "kv_budget_mib": 4,
            "block_size": "16",
            "max_num_seqs": 16,
            "max_model_len": 8192,
        },
    )
    assert result["type"] is FlowResultType.FORM
    assert result["errors"] == {"base": "kv_budget_too_small"}
    assert "4096" in result["description_placeholders"]["reason"]
    await hass.async_block_till_done()
    # Nothing changed: the same engine keeps running.
    assert entry.runtime_data.backend.engine is engine
    assert engine.is_running


async def _reconfigure_to(hass: HomeAssistant, entry: MockConfigEntry, model: str) -> Any:
    """Reconfigure ``entry`` to ``model`` ("another file"), other settings as they are."""
    result = await entry.start_reconfigure_flow(hass)
    assert result["step_id"] == "reconfigure"
    values = {**_form(dict(entry.data)), CONF_MODEL: "other", "custom_model": model}
    result = await hass.config_entries.flow.async_configure(result["flow_id"], values)
    # Another model is test-loaded first, as the first run's flow does.
    assert result["type"] is FlowResultType.SHOW_PROGRESS, result
    assert result["step_id"] == "load"
    assert result["progress_action"] == "load_model"
    await hass.async_block_till_done()
    # A body sent after the load (as to a progress step) gets the flow's form, not a crash.
    return await hass.config_entries.flow.async_configure(
        result["flow_id"], {"custom_model": "anything"}
    )


@pytest.mark.parametrize("kind", ["not_gguf", "missing"])
async def test_reconfigure_to_a_model_that_does_not_load_keeps_the_entry(
    hass: HomeAssistant, init_integration: MockConfigEntry, tmp_path: Path, kind: str
) -> None:
    """A bad choice is found by the test load, on the form: nothing saved, nothing restarted."""
    entry = init_integration
    engine = entry.runtime_data.backend.engine
    before = dict(entry.data)
    model = tmp_path / "notes.gguf"
    if kind == "not_gguf":
        model.write_text("a shopping list, not a model\n" * 100)
    result = await _reconfigure_to(hass, entry, str(model))
    assert result["type"] is FlowResultType.FORM
    assert result["step_id"] == "reconfigure"
    assert result["errors"] == {"base": "model_load_failed"}
    reason = result["description_placeholders"]["reason"]
    assert str(model) in reason
    if kind == "missing":
        assert "does not exist" in reason
    await hass.async_block_till_done()
    assert dict(entry.data) == before
    assert entry.unique_id == before[CONF_MODEL]
    assert entry.state is ConfigEntryState.LOADED
    assert entry.runtime_data.backend.engine is engine
    assert engine.is_running
    # The form still shows the choice that failed, to correct; the entry's model is named.
    schema = result["data_schema"].schema
    assert CONF_MODEL in {str(key) for key in schema}


async def test_conversation_subentry_flow(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    entry = init_integration
    engine = entry.runtime_data.backend.engine
    before = set(entry.subentries)
    assert await async_setup_component(hass, "llm", {})
    result = await hass.config_entries.subentries.async_init(
        (entry.entry_id, "conversation"), context={"source": config_entries.SOURCE_USER}
    )
    assert result["type"] is FlowResultType.FORM
    assert result["step_id"] == "set_options"
    fields = {str(key) for key in result["data_schema"].schema}
    assert fields == {
        CONF_NAME,
        CONF_PROMPT,
        CONF_LLM_HASS_API,
        "max_tokens",
        "temperature",
        "max_history",
        "home_grammar",
        "think",
    }
    result = await hass.config_entries.subentries.async_configure(
        result["flow_id"],
        {
            CONF_NAME: "Kitchen helper",
            CONF_PROMPT: "Answer briefly.",
            CONF_LLM_HASS_API: [llm.LLM_API_ASSIST],
            "max_tokens": 16.0,
            "temperature": 0.3,
            "max_history": 4.0,
            "home_grammar": False,
            "think": True,
        },
    )
    assert result["type"] is FlowResultType.CREATE_ENTRY
    assert result["title"] == "Kitchen helper"
    assert result["data"] == {
        CONF_PROMPT: "Answer briefly.",
        CONF_LLM_HASS_API: [llm.LLM_API_ASSIST],
        "max_tokens": 16,
        "temperature": 0.3,
        "max_history": 4,
        "home_grammar": False,
        "think": True,
    }
    await hass.async_block_till_done()
    (subentry_id,) = set(entry.subentries) - before
    entity_id = er.async_get(hass).async_get_entity_id("conversation", DOMAIN, subentry_id)
    assert entity_id is not None
    assert hass.states.get(entity_id) is not None
    # A new agent does not reload the model.
    assert entry.runtime_data.backend.engine is engine

    result = await entry.start_subentry_reconfigure_flow(hass, subentry_id)
    assert result["type"] is FlowResultType.FORM
    assert CONF_NAME not in {str(key) for key in result["data_schema"].schema}
    result = await hass.config_entries.subentries.async_configure(
        result["flow_id"], {CONF_PROMPT: "Answer in one word.", "max_tokens": 4}
    )
    assert result["type"] is FlowResultType.ABORT
    assert result["reason"] == "reconfigure_successful"
    await hass.async_block_till_done()
    assert entry.subentries[subentry_id].data == {
        CONF_PROMPT: "Answer in one word.",
        "max_tokens": 4,
    }
    assert entry.runtime_data.backend.engine is engine
    assert hass.states.get(entity_id) is not None


async def test_ai_task_subentry_flow(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    entry = init_integration
    before = set(entry.subentries)
    result = await hass.config_entries.subentries.async_init(
        (entry.entry_id, "ai_task_data"), context={"source": config_entries.SOURCE_USER}
    )
    assert result["type"] is FlowResultType.FORM
    fields = {str(key) for key in result["data_schema"].schema}
    assert fields == {CONF_NAME, "max_tokens", "temperature"}
    result = await hass.config_entries.subentries.async_configure(
        result["flow_id"], {CONF_NAME: "Summaries", "max_tokens": 32, "temperature": 0}
    )
    assert result["type"] is FlowResultType.CREATE_ENTRY
    await hass.async_block_till_done()
    (subentry_id,) = set(entry.subentries) - before
    entity_id = er.async_get(hass).async_get_entity_id("ai_task", DOMAIN, subentry_id)
    assert entity_id is not None
    assert hass.states.get(entity_id) is not None


@pytest.mark.skipif(
    importlib.import_module("torch").cuda.is_available(), reason="needs a machine without CUDA"
)
async def test_reconfigure_to_a_missing_gpu_is_a_form_error(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    entry = init_integration
    result = await entry.start_reconfigure_flow(hass)
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"],
        {
            "device": "cuda",
            "dtype": "float32",
            "kv_budget_mib": 4,
            "block_size": "16",
            "max_num_seqs": 16,
            "max_model_len": 0,
        },
    )
    assert result["type"] is FlowResultType.FORM
    assert result["errors"] == {"base": "model_load_failed"}
    assert "no CUDA GPU" in result["description_placeholders"]["reason"]
    assert entry.data["device"] == "cpu"
