"""What the forms say: the engine's real choices, load progress, agent names and wording."""

from __future__ import annotations

import json
from itertools import groupby
from pathlib import Path
from typing import Any
from unittest.mock import patch

import pytest
from homeassistant import config_entries
from homeassistant.const import CONF_NAME
from homeassistant.core import Event, HomeAssistant, callback
from homeassistant.data_entry_flow import EVENT_DATA_ENTRY_FLOW_PROGRESS_UPDATE, FlowResultType
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.paged_llm.config_flow import BUNDLED_LABEL, model_label
from custom_components.paged_llm.const import DEFAULT_CONVERSATION_NAME
from paged_llm.defaults import DEFAULT_MODEL
from paged_llm.engine import async_engine
from paged_llm.engine.model.runner import kv_bytes_per_block
from tests.components.paged_llm.test_config_flow import _user_flow

pytestmark = pytest.mark.usefixtures("ha_core")
STRINGS = json.loads(
    (Path(__file__).resolve().parents[3] / "custom_components/paged_llm/strings.json").read_text(
        encoding="utf-8"
    )
)


async def test_reconfigure_says_what_the_engine_chose(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    entry = init_integration
    llm_engine = entry.runtime_data.backend.engine._llm
    result = await entry.start_reconfigure_flow(hass)
    assert result["type"] is FlowResultType.FORM
    chosen = result["description_placeholders"]
    assert chosen["device"] == "cpu"
    assert chosen["dtype"] == "float32"
    assert chosen["weights"] == "float"
    assert chosen["context"] == str(llm_engine.max_model_len)
    assert chosen["blocks"] == f"{llm_engine.num_kv_blocks} × 16"
    per_block = kv_bytes_per_block(llm_engine.loaded.model.config, 16, llm_engine.loaded.dtype)
    blocks = -(-llm_engine.max_model_len // 16)
    assert float(chosen["sequence_mib"]) == pytest.approx(blocks * per_block / 2**20, abs=0.05)
    # Every placeholder the English text names is filled.
    text = STRINGS["config"]["step"]["reconfigure"]["description"]
    text.format(**chosen)


async def test_the_load_dialog_receives_the_loaders_progress(
    hass: HomeAssistant, engine_settings: dict[str, Any]
) -> None:
    updates: list[float] = []

    @callback
    def on_update(event: Event) -> None:
        updates.append(event.data["progress"])

    hass.bus.async_listen(EVENT_DATA_ENTRY_FLOW_PROGRESS_UPDATE, on_update)
    real_load = async_engine.load_model

    def load(config: Any, progress: Any = None) -> Any:
        """The real loader; a folder model converts nothing, so report as a GGUF would."""
        assert progress is not None
        for fraction in (0.25, 0.5, 1.0):
            progress(fraction)
        return real_load(config, progress)

    with patch.object(async_engine, "load_model", load):
        result = await _user_flow(hass, engine_settings)
        await hass.async_block_till_done()
    assert result["type"] is FlowResultType.CREATE_ENTRY
    # The dialog is told the latest fraction again each second while a slow load runs.
    assert [fraction for fraction, _ in groupby(updates)] == [0.25, 0.5, 1.0]
    assert await hass.config_entries.async_unload(result["result"].entry_id)


def test_models_are_named_as_the_list_names_them() -> None:
    assert model_label(DEFAULT_MODEL) == BUNDLED_LABEL
    assert model_label("/models/qwen2.5-1.5b-instruct-q4_k_m.gguf") == (
        "qwen2.5-1.5b-instruct-q4_k_m"
    )


async def test_new_agents_get_unique_names_titles_and_descriptions(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    entry = init_integration

    async def new_conversation_form() -> dict[str, Any]:
        return await hass.config_entries.subentries.async_init(
            (entry.entry_id, "conversation"), context={"source": config_entries.SOURCE_USER}
        )

    result = await new_conversation_form()
    name = next(key for key in result["data_schema"].schema if key == CONF_NAME)
    assert name.default() == DEFAULT_CONVERSATION_NAME
    assert result["description_placeholders"] == {"model": model_label(entry.data["model"])}
    await hass.config_entries.subentries.async_configure(
        result["flow_id"], {CONF_NAME: DEFAULT_CONVERSATION_NAME}
    )
    await hass.async_block_till_done()
    result = await new_conversation_form()
    name = next(key for key in result["data_schema"].schema if key == CONF_NAME)
    assert name.default() == f"{DEFAULT_CONVERSATION_NAME} 2"
    steps = STRINGS["config_subentries"]
    for kind in ("conversation", "ai_task_data"):
        step = steps[kind]["step"]["set_options"]
        assert step["title"]
        assert "{model}" in step["description"]
    conversation = steps["conversation"]["step"]["set_options"]
    assert "round" in conversation["data"]["max_history"].lower()
    assert "round" in conversation["data_description"]["max_history"]


def test_summarize_says_it_needs_a_text_or_a_path() -> None:
    summarize = STRINGS["services"]["summarize"]
    assert "either a text or a file path" in summarize["description"]
    assert "or a file path" in summarize["fields"]["text"]["description"]
    assert "or a text" in summarize["fields"]["path"]["description"]
