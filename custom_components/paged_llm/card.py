"""Serves the block-map card's JavaScript and loads it on every dashboard (no HACS step)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from homeassistant.components.frontend import add_extra_js_url
from homeassistant.components.http.server import StaticPathConfig
from homeassistant.core import HomeAssistant

from .const import DOMAIN

FRONTEND_DIR = Path(__file__).parent / "frontend"
CARD_FILE = "paged-llm-block-map-card.js"
URL_BASE = f"/{DOMAIN}_frontend"
CARD_URL = f"{URL_BASE}/{CARD_FILE}"


def _card_version() -> str:
    """A short digest of the card's source, so browsers fetch it again after an update."""
    return hashlib.sha256((FRONTEND_DIR / CARD_FILE).read_bytes()).hexdigest()[:12]


async def async_register_card(hass: HomeAssistant) -> str | None:
    """Serve the card and add it to the frontend's extra modules; its URL, or None without one.

    Home Assistant without the frontend (a headless install, the test harness) skips this.
    """
    if "frontend" not in hass.config.components or hass.http is None:
        return None
    version = await hass.async_add_executor_job(_card_version)
    await hass.http.async_register_static_paths(
        [StaticPathConfig(URL_BASE, str(FRONTEND_DIR), cache_headers=True)]
    )
    url = f"{CARD_URL}?v={version}"
    add_extra_js_url(hass, url)
    return url
