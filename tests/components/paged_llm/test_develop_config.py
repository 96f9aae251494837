"""scripts/develop's config: HTTP settings stored as stable, so no trial and no YAML repair."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import yaml
from homeassistant.components.http.config import ActiveConfigType, async_load_config
from homeassistant.components.http.const import DOMAIN as HTTP_DOMAIN
from homeassistant.core import HomeAssistant
from homeassistant.helpers import issue_registry as ir

ROOT = Path(__file__).resolve().parents[3]


def _develop_http() -> Any:
    """scripts/develop_http.py as a module."""
    spec = importlib.util.spec_from_file_location("develop_http", ROOT / "scripts/develop_http.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_configuration_yaml_has_no_http_block() -> None:
    class Loader(yaml.SafeLoader):
        """Accepts Home Assistant's tags."""

    Loader.add_multi_constructor("!", lambda loader, suffix, node: None)
    text = (ROOT / "config" / "configuration.yaml").read_text(encoding="utf-8")
    assert "http" not in yaml.load(text, Loader=Loader)


async def test_stored_http_settings_start_without_trial_or_repair(
    hass: HomeAssistant, hass_storage: dict[str, Any], tmp_path: Path
) -> None:
    _develop_http().main(str(tmp_path), "8127")
    stored = json.loads((tmp_path / ".storage" / "http").read_text(encoding="utf-8"))
    hass_storage["http"] = stored
    conf = await async_load_config(hass, {})
    assert conf["server_host"] == ["127.0.0.1"]
    assert conf["server_port"] == 8127
    store = hass.data["http"]
    assert store.active_config_type is ActiveConfigType.STABLE
    assert store.revert_deadline is None
    assert not [i for i in ir.async_get(hass).issues if i[0] == HTTP_DOMAIN]
