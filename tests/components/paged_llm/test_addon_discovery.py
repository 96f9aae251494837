"""The add-on found by the integration: Supervisor discovery, updates, ignore, and a repair.

The discovery data is what the add-on's own program sends (paged_llm_addon.supervisor),
so the two sides cannot drift apart; the server is a real `paged-llm serve`.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_socket
from homeassistant import config_entries
from homeassistant.config_entries import ConfigEntryState
from homeassistant.const import STATE_UNAVAILABLE
from homeassistant.core import HomeAssistant
from homeassistant.data_entry_flow import FlowResultType
from homeassistant.helpers import entity_registry as er
from homeassistant.helpers import issue_registry as ir
from homeassistant.helpers.service_info.hassio import HassioServiceInfo
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.paged_llm import addon
from paged_llm_addon.supervisor import SERVICE, discovery_config
from tests.helpers.remote_server import ServerProcess, free_port, serving

DOMAIN = "paged_llm"
KEY = "add-on-key"
SLUG = "a0d7b954_paged_llm"

pytestmark = pytest.mark.usefixtures("ha_core")


@pytest.fixture(autouse=True)
def local_sockets(socket_enabled: None) -> None:
    """Let the tests reach the server process (the harness still allows only 127.0.0.1)."""


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path) -> Iterator[ServerProcess]:
    """The add-on's server, with the key the add-on generated."""
    pytest_socket.enable_socket()  # module fixtures start before socket_enabled
    with serving(tiny_model_dir, KEY) as process:
        yield process


def discovery(port: int, key: str = KEY, model: str = "tiny") -> HassioServiceInfo:
    """What Home Assistant's hassio integration hands the flow for the add-on's message."""
    config = {**discovery_config("127.0.0.1", port, key, model), "addon": "Paged LLM"}
    return HassioServiceInfo(config=config, name="Paged LLM", slug=SLUG, uuid="ab" * 16)


async def discover(hass: HomeAssistant, info: HassioServiceInfo) -> Any:
    """Start a discovery flow as the Supervisor's message does."""
    assert SERVICE == DOMAIN  # the add-on announces the integration's domain
    return await hass.config_entries.flow.async_init(
        DOMAIN, context={"source": config_entries.SOURCE_HASSIO}, data=info
    )


async def add_entry(hass: HomeAssistant, server: ServerProcess) -> config_entries.ConfigEntry:
    """Discover the add-on and accept it; the entry, loaded."""
    result = await discover(hass, discovery(server.port))
    result = await hass.config_entries.flow.async_configure(result["flow_id"], {})
    assert result["type"] is FlowResultType.CREATE_ENTRY, result
    await hass.async_block_till_done()
    entry: config_entries.ConfigEntry = result["result"]
    assert entry.state is ConfigEntryState.LOADED
    return entry


@pytest.fixture
async def addon_entry(
    hass: HomeAssistant, server: ServerProcess
) -> AsyncGenerator[config_entries.ConfigEntry]:
    """The entry the add-on's discovery set up; unloaded afterwards."""
    entry = await add_entry(hass, server)
    yield entry
    if entry.state is ConfigEntryState.LOADED:
        assert await hass.config_entries.async_unload(entry.entry_id)
        await hass.async_block_till_done()


async def test_the_add_on_is_offered_and_set_up_without_typing(
    hass: HomeAssistant, server: ServerProcess
) -> None:
    result = await discover(hass, discovery(server.port))
    assert result["type"] is FlowResultType.FORM
    assert result["step_id"] == "hassio_confirm"
    assert result["description_placeholders"]["addon"] == "Paged LLM"
    assert result["description_placeholders"]["model"] == "tiny"
    assert result["data_schema"] is None  # nothing to type: a yes
    (flow,) = hass.config_entries.flow.async_progress_by_handler(DOMAIN)
    assert flow["context"]["title_placeholders"] == {"name": "Paged LLM"}

    result = await hass.config_entries.flow.async_configure(result["flow_id"], {})
    assert result["type"] is FlowResultType.CREATE_ENTRY
    assert result["title"] == "tiny"
    assert result["data"] == {
        "backend": "remote",
        "url": f"http://127.0.0.1:{server.port}",
        "api_key": KEY,
        "timeout": 60,
        "model": "tiny",
        "addon": SLUG,
    }
    entry = result["result"]
    assert entry.unique_id == f"addon:{SLUG}"
    assert sorted(s.subentry_type for s in entry.subentries.values()) == [
        "ai_task_data",
        "conversation",
    ]
    await hass.async_block_till_done()
    assert entry.state is ConfigEntryState.LOADED
    response = await hass.services.async_call(
        DOMAIN, "generate", {"prompt": "Hi", "max_tokens": 2}, blocking=True, return_response=True
    )
    assert response is not None
    assert response["completion_tokens"] >= 1
    assert await hass.config_entries.async_unload(entry.entry_id)


async def test_a_new_url_or_key_updates_the_entry_which_follows_it(
    hass: HomeAssistant, server: ServerProcess, addon_entry: config_entries.ConfigEntry
) -> None:
    entry = addon_entry
    # The add-on restarted with another port and key: the entry takes them and restarts.
    moved = free_port()
    result = await discover(hass, discovery(moved, key="new-key"))
    assert result["type"] is FlowResultType.ABORT
    assert result["reason"] == "already_configured"
    await hass.async_block_till_done()
    assert entry.data["url"] == f"http://127.0.0.1:{moved}"
    assert entry.data["api_key"] == "new-key"
    assert entry.state is ConfigEntryState.SETUP_RETRY  # nothing listens there

    # Announced back where the server is: the waiting entry starts at once.
    result = await discover(hass, discovery(server.port))
    assert result["reason"] == "already_configured"
    await hass.async_block_till_done()
    assert entry.data["url"] == f"http://127.0.0.1:{server.port}"
    assert entry.state is ConfigEntryState.LOADED
    assert not hass.config_entries.flow.async_progress_by_handler(DOMAIN)


async def test_a_new_model_renames_an_entry_named_after_the_model_only(
    hass: HomeAssistant, server: ServerProcess, addon_entry: config_entries.ConfigEntry
) -> None:
    entry = addon_entry
    assert entry.title == "tiny"
    # The add-on now serves another model: the title, the model's name, follows it.
    result = await discover(hass, discovery(server.port, model="tiny-2"))
    assert result["reason"] == "already_configured"
    await hass.async_block_till_done()
    assert (entry.title, entry.data["model"]) == ("tiny-2", "tiny-2")
    # A name the user gave stays through the next change.
    hass.config_entries.async_update_entry(entry, title="Kitchen brain")
    result = await discover(hass, discovery(server.port, model="tiny"))
    await hass.async_block_till_done()
    assert (entry.title, entry.data["model"]) == ("Kitchen brain", "tiny")


async def test_an_ignored_add_on_stays_ignored(hass: HomeAssistant, server: ServerProcess) -> None:
    result = await discover(hass, discovery(server.port))
    assert result["step_id"] == "hassio_confirm"
    await hass.config_entries.flow.async_init(
        DOMAIN,
        context={"source": config_entries.SOURCE_IGNORE},
        data={"unique_id": f"addon:{SLUG}", "title": "Paged LLM"},
    )
    await hass.async_block_till_done()
    # The add-on restarts with a new key: still ignored, nothing offered.
    result = await discover(hass, discovery(free_port(), key="other"))
    assert result["type"] is FlowResultType.ABORT
    assert result["reason"] == "already_configured"
    (entry,) = hass.config_entries.async_entries(DOMAIN, include_ignore=True)
    assert entry.source == config_entries.SOURCE_IGNORE
    assert not hass.config_entries.flow.async_progress_by_handler(DOMAIN)


async def test_a_server_set_up_by_hand_is_not_offered_again(
    hass: HomeAssistant, server: ServerProcess
) -> None:
    url = f"http://127.0.0.1:{server.port}"
    data = {"backend": "remote", "url": url, "timeout": 60, "model": "tiny"}
    entry = MockConfigEntry(domain=DOMAIN, title="tiny", data=data, unique_id=f"{url}#tiny")
    entry.add_to_hass(hass)
    result = await discover(hass, discovery(server.port))
    assert result["type"] is FlowResultType.ABORT
    assert result["reason"] == "already_configured"
    await hass.async_block_till_done()
    # The entry is the add-on's now: its key, and the updates of later discoveries.
    assert entry.unique_id == f"addon:{SLUG}"
    assert entry.data == {**data, "api_key": KEY, "addon": SLUG}
    assert entry.state is ConfigEntryState.LOADED
    assert await hass.config_entries.async_unload(entry.entry_id)


async def test_a_message_without_a_server_or_a_server_gone_is_said(
    hass: HomeAssistant,
) -> None:
    info = HassioServiceInfo(config={"addon": "Paged LLM"}, name="Paged LLM", slug=SLUG, uuid="0")
    result = await discover(hass, info)
    assert result["type"] is FlowResultType.ABORT
    assert result["reason"] == "invalid_discovery_info"

    gone = free_port()
    result = await discover(hass, discovery(gone))
    result = await hass.config_entries.flow.async_configure(result["flow_id"], {})
    assert result["type"] is FlowResultType.FORM
    assert result["step_id"] == "hassio_confirm"
    assert result["errors"] == {"base": "cannot_connect"}
    assert str(gone) in result["description_placeholders"]["reason"]


@pytest.fixture
def own_server(tiny_model_dir: Path) -> Iterator[ServerProcess]:
    """A server this test may stop and start, as removing and reinstalling the add-on."""
    with serving(tiny_model_dir, KEY) as process:
        yield process


def _repair(hass: HomeAssistant, entry: config_entries.ConfigEntry) -> ir.IssueEntry | None:
    return ir.async_get(hass).async_get_issue(DOMAIN, f"addon_unreachable_{entry.entry_id}")


async def test_an_add_on_gone_is_a_repair_until_it_answers_again(
    hass: HomeAssistant, own_server: ServerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    entry = await add_entry(hass, own_server)
    coordinator = entry.runtime_data.coordinator
    state = er.async_get(hass).async_get_entity_id(
        "sensor", DOMAIN, f"{entry.entry_id}_running_requests"
    )
    assert state is not None
    assert hass.states.get(state).state == "0"

    # Removed (or stopped): unavailable at once; the repair once that outlasts a restart.
    own_server.stop()
    await coordinator.async_refresh()
    await hass.async_block_till_done()
    assert hass.states.get(state).state == STATE_UNAVAILABLE
    assert _repair(hass, entry) is None
    monkeypatch.setattr(addon, "UNREACHABLE_REPAIR_S", 0.0)
    await coordinator.async_refresh()
    issue = _repair(hass, entry)
    assert issue is not None
    assert issue.translation_key == "addon_unreachable"
    assert issue.severity is ir.IssueSeverity.ERROR
    assert issue.translation_placeholders == {
        "entry": "tiny",
        "url": f"http://127.0.0.1:{own_server.port}",
    }

    # A restart of Home Assistant meanwhile: the entry waits, and the repair stays.
    assert await hass.config_entries.async_reload(entry.entry_id) is False
    assert entry.state is ConfigEntryState.SETUP_RETRY
    assert _repair(hass, entry) is not None

    # Installed again: its discovery starts the waiting entry; the repair goes.
    own_server.start()
    result = await discover(hass, discovery(own_server.port))
    assert result["reason"] == "already_configured"
    await hass.async_block_till_done()
    assert entry.state is ConfigEntryState.LOADED
    assert _repair(hass, entry) is None
    assert hass.states.get(state).state == "0"

    # Deleting the entry takes a repair with it.
    monkeypatch.setattr(addon, "UNREACHABLE_REPAIR_S", 0.0)
    own_server.stop()
    await entry.runtime_data.coordinator.async_refresh()
    assert _repair(hass, entry) is not None
    assert await hass.config_entries.async_remove(entry.entry_id)
    await hass.async_block_till_done()
    assert _repair(hass, entry) is None
