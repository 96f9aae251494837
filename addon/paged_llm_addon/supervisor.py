"""The Supervisor's API as the add-on calls it: its own hostname, and the discovery message."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from typing import Any

# The discovery service: the integration's domain, listed under `discovery` in config.yaml.
SERVICE = "paged_llm"
SUPERVISOR_URL = "http://supervisor"


class SupervisorError(Exception):
    """The Supervisor did not do what was asked."""


def discovery_config(host: str, port: int, api_key: str, model: str) -> dict[str, Any]:
    """What the integration's discovery step reads: where the server is, its key, its model."""
    return {"host": host, "port": port, "api_key": api_key, "model": model}


class Supervisor:
    """The Supervisor's REST API, with the token it gives the add-on."""

    def __init__(self, url: str, token: str) -> None:
        """Call the Supervisor at ``url`` with ``token``."""
        self.url = url.rstrip("/")
        self._token = token

    @classmethod
    def from_env(cls) -> Supervisor | None:
        """The Supervisor this add-on runs under, or None outside one (plain Docker)."""
        token = os.environ.get("SUPERVISOR_TOKEN")
        if not token:
            return None
        return cls(os.environ.get("PAGED_LLM_ADDON_SUPERVISOR", SUPERVISOR_URL), token)

    def hostname(self) -> str:
        """The name Home Assistant reaches this add-on's container by."""
        return str(self._call("GET", "/addons/self/info")["hostname"])

    def announce(self, port: int, api_key: str, model: str) -> str:
        """Send the discovery message; Home Assistant offers the server. Returns its URL."""
        host = self.hostname()
        body = {"service": SERVICE, "config": discovery_config(host, port, api_key, model)}
        self._call("POST", "/discovery", body)
        return f"http://{host}:{port}"

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        """One request; the answer's data, or a SupervisorError saying what went wrong."""
        request = urllib.request.Request(
            f"{self.url}{path}",
            data=None if body is None else json.dumps(body).encode(),
            method=method,
            headers={"Authorization": f"Bearer {self._token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                answer = json.loads(response.read())
        except urllib.error.HTTPError as err:
            raise SupervisorError(f"{method} {path}: HTTP {err.code} {err.reason}") from err
        except (OSError, ValueError) as err:
            raise SupervisorError(f"{method} {path}: {err}") from err
        if not isinstance(answer, dict) or answer.get("result") != "ok":
            raise SupervisorError(f"{method} {path}: {answer}")
        data = answer.get("data") or {}
        return data if isinstance(data, dict) else {}
