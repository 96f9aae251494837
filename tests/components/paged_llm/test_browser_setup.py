"""Setting up the bundled model in a real browser: the engine form, loading dialog, device."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import aiohttp
import pytest

from tests.components.paged_llm.test_browser_card import (
    SCREENSHOT_DIR,
    _load_provisioner,
    chromium_page,
    log_in,
    ws_messages,
)
from tests.components.paged_llm.test_browser_card import pytestmark as browser_marks
from tests.helpers.home_assistant import CONFIGURATION, HomeAssistantProcess, running_home_assistant

if TYPE_CHECKING:
    from playwright.sync_api import Locator, Page

pytestmark = browser_marks
# The bundled model's first start converts it; on a slow CPU in float32 that is a minute.
LOAD_TIMEOUT_MS = 240_000


def _bundled_option() -> str:
    """The bundled model's name in the form's model list, as the English translation has it."""
    strings = Path(__file__).parents[3] / "custom_components" / "paged_llm" / "translations"
    options = json.loads((strings / "en.json").read_text())["selector"]["model"]["options"]
    return str(options["bundled"])


@pytest.fixture
def home_assistant(tmp_path: Path, socket_enabled: None) -> Iterator[HomeAssistantProcess]:
    """A fresh Home Assistant with the frontend: no entry, no converted model in its cache."""
    (tmp_path / "config").mkdir()
    with running_home_assistant(tmp_path, CONFIGURATION + "frontend:\n") as hass:
        yield hass


async def _onboard(provisioner: ModuleType, base: str) -> str:
    """Create the development user the way scripts/develop does; return its token."""
    async with aiohttp.ClientSession() as session:
        api = provisioner.HomeAssistantAPI(session, base)
        try:
            steps = await api.wait_until_up(120)
            await provisioner.ensure_user(api, steps)
            await provisioner.confirm_http_config(api)
        finally:
            await api.close()
    return str(api.token)


async def _engine_device(base: str, token: str) -> dict[str, Any]:
    """The entry's engine device (the one its sensors belong to) from the device registry."""
    (reply,) = await ws_messages(base, token, {"type": "config/device_registry/list"}, 1)
    devices = reply["result"]
    # The engine's device belongs to the entry itself (subentry None), not to an agent.
    engine = [
        d
        for d in devices
        if any(i[0] == "paged_llm" for i in d["identifiers"])
        and None in next(iter(d["config_entries_subentries"].values()))
    ]
    assert len(engine) == 1, devices
    return dict(engine[0])


def _dialog(page: Page) -> Locator:
    """The config flow dialog."""
    return page.locator("dialog-data-entry-flow")


def _save(shot: Path) -> None:
    """Copy a screenshot to PAGED_LLM_SCREENSHOT_DIR when refreshing the docs' pictures."""
    assert shot.stat().st_size > 0
    if SCREENSHOT_DIR:
        shutil.copy(shot, Path(SCREENSHOT_DIR) / shot.name)


def test_setup_names_the_model_shows_the_conversion_and_the_device(
    home_assistant: HomeAssistantProcess, tmp_path: Path
) -> None:
    hass = home_assistant
    provisioner = _load_provisioner()
    hass.token = asyncio.run(_onboard(provisioner, hass.base))

    with chromium_page() as page:
        log_in(
            page,
            hass.base + "/config/integrations/dashboard/add?domain=paged_llm",
            provisioner.DEV_USERNAME,
            provisioner.DEV_PASSWORD,
        )
        page.get_by_role("button", name="OK").click(timeout=60_000)
        # First question: where the model runs; the engine here is preselected.
        dialog = _dialog(page)
        dialog.get_by_text("On this Home Assistant", exact=True).wait_for(timeout=60_000)
        dialog.get_by_role("button", name="Submit").click()

        # The engine form names the bundled model, never its raw value.
        dialog.get_by_text("Choose a model and how the engine may use memory").wait_for()
        dialog.get_by_text(_bundled_option()).filter(visible=True).first.wait_for()
        assert dialog.get_by_text("bundled:").filter(visible=True).count() == 0
        form = tmp_path / "setup-engine-form.png"
        page.screenshot(path=str(form))
        _save(form)
        dialog.get_by_role("button", name="Submit").click()

        # The loading dialog shows how far the conversion is, as a percentage.
        dialog.get_by_text("Loading the model").wait_for()
        ring = dialog.locator("ha-progress-ring")
        ring.wait_for(timeout=LOAD_TIMEOUT_MS)
        assert re.fullmatch(r"\d{1,3}%", ring.inner_text().strip())
        loading = tmp_path / "setup-loading-dialog.png"
        page.screenshot(path=str(loading))
        _save(loading)
        dialog.get_by_role("button", name="Skip and finish").click(timeout=LOAD_TIMEOUT_MS)

        # One question, so the device page shows a used engine.
        status, body = hass.request(
            "POST",
            "/api/conversation/process",
            {"text": "What is the capital of France?", "agent_id": _agent(hass)},
            timeout=120,
        )
        assert status == 200, body
        # Playwright's sync API runs a loop in this thread; ask from another one.
        with ThreadPoolExecutor(1) as pool:
            device = pool.submit(asyncio.run, _engine_device(hass.base, hass.token)).result(
                timeout=30
            )
        page.set_viewport_size({"width": 1100, "height": 1240})
        page.goto(f"{hass.base}/config/devices/device/{device['id']}")
        for name in ("Engine state", "KV cache usage", "Time to first token, interactive"):
            page.get_by_text(name).first.wait_for(timeout=30_000)
        page.wait_for_timeout(1000)  # let the sensor values render
        device_page = tmp_path / "device-page.png"
        page.screenshot(path=str(device_page))
        _save(device_page)
    errors = [line for line in _our_log(hass) if " ERROR " in line or " WARNING " in line]
    assert not errors, errors


def _agent(hass: HomeAssistantProcess) -> str:
    """The entity id of the new conversation agent."""
    return next(e for e in hass.states() if e.startswith("conversation.paged_llm"))


def _our_log(hass: HomeAssistantProcess) -> list[str]:
    """The lines of Home Assistant's log that come from this integration or its engine."""
    text = hass.log.read_text(encoding="utf-8", errors="replace")
    loggers = ("[custom_components.paged_llm", "[paged_llm")
    return [line for line in text.splitlines() if any(name in line for name in loggers)]
