"""Write Home Assistant's stored HTTP settings for scripts/develop: loopback, a chosen port.

Home Assistant 2026.10 keeps these settings in .storage/http (edited in the UI) instead of
the http: YAML; YAML is migrated once with a deprecation repair, and a changed setting
starts a five-minute trial that must be confirmed. Writing the stored settings as stable,
with the YAML migration marked done, gives neither.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from homeassistant.components.http.config import (
    HTTP_STORAGE_SCHEMA,
    STORAGE_KEY,
    STORAGE_MINOR_VERSION,
    STORAGE_VERSION,
)
from homeassistant.util import dt as dt_util


def main(config_dir: str, port: str) -> None:
    """Write <config>/.storage/http when it does not hold these settings already."""
    stable = {
        **HTTP_STORAGE_SCHEMA({"server_host": ["127.0.0.1"], "server_port": int(port)}),
        "created_at": dt_util.utcnow().isoformat(),
        "error": None,
        "error_message": None,
    }
    path = Path(config_dir) / ".storage" / STORAGE_KEY
    if path.is_file():
        data = json.loads(path.read_text(encoding="utf-8")).get("data", {})
        old = data.get("stable", {})
        if (
            old.get("server_host") == stable["server_host"]
            and old.get("server_port") == stable["server_port"]
            and data.get("pending") is None
        ):
            return
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "version": STORAGE_VERSION,
        "minor_version": STORAGE_MINOR_VERSION,
        "key": STORAGE_KEY,
        "data": {"stable": stable, "pending": None, "yaml_migration_done": True},
    }
    path.write_text(json.dumps(payload, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
