""" "Control Home Assistant" is on by default exactly when the model's chat template calls tools."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from homeassistant import config_entries
from homeassistant.const import CONF_LLM_HASS_API, CONF_MODEL
from homeassistant.core import HomeAssistant
from homeassistant.data_entry_flow import FlowResultType
from homeassistant.helpers import llm

from custom_components.paged_llm.const import DOMAIN
from custom_components.paged_llm.schemas import form_values
from tests.components.paged_llm.test_conversation import TOOL_TEMPLATE

pytestmark = pytest.mark.usefixtures("ha_core")


async def _create(hass: HomeAssistant, settings: dict[str, Any]) -> dict[str, Any]:
    """Run the whole embedded flow with ``settings``; return its create-entry result."""
    result = await hass.config_entries.flow.async_init(
        DOMAIN, context={"source": config_entries.SOURCE_USER}
    )
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], {"backend": "embedded"}
    )
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], form_values(settings)
    )
    assert result["type"] is FlowResultType.SHOW_PROGRESS
    await hass.async_block_till_done()
    result = await hass.config_entries.flow.async_configure(result["flow_id"])
    assert result["type"] is FlowResultType.CREATE_ENTRY, result
    return result


def _conversation_api(result: dict[str, Any]) -> Any:
    """The LLM APIs of the entry's first conversation agent (None: no key at all)."""
    entry = result["result"]
    sub = next(s for s in entry.subentries.values() if s.subentry_type == "conversation")
    return sub.data.get(CONF_LLM_HASS_API)


async def _new_agent_suggestion(hass: HomeAssistant, entry_id: str) -> Any:
    """What the form for a new conversation agent suggests for "Control Home Assistant"."""
    result = await hass.config_entries.subentries.async_init(
        (entry_id, "conversation"), context={"source": config_entries.SOURCE_USER}
    )
    assert result["type"] is FlowResultType.FORM
    key = next(k for k in result["data_schema"].schema if k == CONF_LLM_HASS_API)
    return key.description["suggested_value"]


async def test_a_template_without_tools_leaves_control_off_and_says_why(
    hass: HomeAssistant, engine_settings: dict[str, Any]
) -> None:
    result = await _create(hass, engine_settings)
    assert result["description"] == "tools_off"
    assert result["description_placeholders"]["model"]
    assert _conversation_api(result) is None
    assert await _new_agent_suggestion(hass, result["result"].entry_id) == []
    assert await hass.config_entries.async_unload(result["result"].entry_id)


async def test_a_template_that_calls_tools_turns_control_on(
    hass: HomeAssistant, engine_settings: dict[str, Any], tmp_path: Path
) -> None:
    folder = tmp_path / "tool-model"
    shutil.copytree(engine_settings[CONF_MODEL], folder)
    (folder / "chat_template.jinja").write_text(TOOL_TEMPLATE, encoding="utf-8")
    result = await _create(hass, {**engine_settings, CONF_MODEL: str(folder)})
    assert result["description"] == "tools_on"
    assert _conversation_api(result) == [llm.LLM_API_ASSIST]
    entry = result["result"]
    assert entry.runtime_data.backend.native_tools
    assert await _new_agent_suggestion(hass, entry.entry_id) == [llm.LLM_API_ASSIST]
    assert await hass.config_entries.async_unload(entry.entry_id)
