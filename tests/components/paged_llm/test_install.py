"""The install path a HACS user gets: only the integration folder, the library from its pin.

HACS copies `custom_components/paged_llm` and nothing else; Home Assistant then installs
the manifest's requirement with its own machinery (uv). Here that requirement comes from a
local folder of wheels (find-links, no index: nothing leaves the machine), into a fresh
virtualenv that holds Home Assistant only, and the integration answers in remote mode
through a real `paged-llm serve`. A second release in the folder and the manifest: the
next start upgrades the library.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import tomllib
import zipfile
from pathlib import Path

import pytest

from tests.helpers.home_assistant import (
    CONFIGURATION,
    NOT_IN_HOME_ASSISTANT_OS,
    ROOT,
    HomeAssistantProcess,
    free_port,
    kill,
    write_http_settings,
)
from tests.helpers.remote_server import ServerProcess

LIBRARY = "paged-llm"
# Requirements of Home Assistant's own components that it would install at run time
# (one builds C++ from source for minutes); not what this test is about.
HOME_ASSISTANTS_OWN = ("pyspeex-noise", "aiohasupervisor")
# What git ignores too: a developer's checkout can hold gigabytes of models in .cache.
IGNORED_IN_COPY = (".venv", ".git", "bench_results", "*.egg-info", "build", "dist", ".cache")
IGNORED_IN_COPY += (".hypothesis", ".pytest_cache", ".mypy_cache", ".ruff_cache", "__pycache__")
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


class InstallingHomeAssistant(HomeAssistantProcess):
    """Home Assistant that installs requirements itself, from a local wheel folder only."""

    def __init__(self, config_dir: Path, port: int, hass_bin: Path, wheels: Path) -> None:
        super().__init__(config_dir, port, hass_bin)
        self.wheels = wheels

    def start(self) -> None:
        """Start without --skip-pip; uv finds the library in the wheel folder, no index."""
        env = {
            **os.environ,
            "UV_FIND_LINKS": str(self.wheels),
            "UV_NO_INDEX": "1",
            "HF_HUB_OFFLINE": "1",
        }
        for name in ("VIRTUAL_ENV", "UV_PYTHON", "PYTHONPATH"):
            env.pop(name, None)
        command = [str(self.hass_bin), "-c", str(self.config_dir), "--log-file", str(self.log)]
        command += ["--skip-pip-packages", ",".join(HOME_ASSISTANTS_OWN)]
        self.process = subprocess.Popen(
            command,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
            cwd=self.config_dir,
            start_new_session=True,
        )

    def stop(self) -> int:
        """Stop with SIGTERM, as a supervisor would; give shutdown time on a busy machine."""
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                return self.process.wait(timeout=180)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
                raise
        return self.process.returncode

    def wait_until_running(self, timeout: float = 300) -> None:
        """Wait for bootstrap to finish (its signal handlers come last), then stop can work."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status, body = self.request("GET", "/api/config")
            if status == 200 and body["state"] == "RUNNING":
                return
            time.sleep(1)
        raise AssertionError(f"Home Assistant did not finish starting:\n{self.log_tail()}")


def _uv() -> str:
    uv = shutil.which("uv") or str(Path(sys.executable).with_name("uv"))
    assert Path(uv).exists() or shutil.which(uv), "uv is needed (scripts/setup installs it)"
    return uv


def _run(*args: str, cwd: Path | None = None) -> str:
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, check=False)
    assert done.returncode == 0, f"{' '.join(args)}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _build_wheel(source: Path, out: Path) -> Path:
    """Build the library's wheel from ``source`` into ``out``."""
    version = tomllib.loads((source / "pyproject.toml").read_text())["project"]["version"]
    _run(_uv(), "build", "--quiet", "--wheel", "--no-build-isolation", "--python",
         sys.executable, "--out-dir", str(out), str(source))  # fmt: skip
    (wheel,) = out.glob(f"paged_llm-{version}-*.whl")
    return wheel


def _repack_installed(name: str, out: Path) -> Path:
    """A wheel of a distribution installed here, rebuilt from its RECORD.

    The wheel folder must hold the library's own dependencies too (offline, uv has no
    index to fetch them from); this test's interpreter has them installed already, for this
    very platform and Python (binary wheels keep their first tag).
    """
    dist = importlib.metadata.distribution(name)
    files = dist.files or []
    info = next(f for f in files if f.parts[0].endswith(".dist-info"))
    tags = [line for line in dist.read_text("WHEEL").splitlines() if line.startswith("Tag:")]
    tag = tags[0].split(":", 1)[1].strip()
    project = re.sub(r"[-_.]+", "_", dist.metadata["Name"]).lower()
    wheel = out / f"{project}-{dist.version}-{tag}.whl"
    out.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        for file in files:
            path = Path(str(dist.locate_file(file)))
            if path.is_file() and "__pycache__" not in file.parts and ".." not in file.parts:
                archive.write(path, str(file))
    assert info.parts[0] in {Path(n).parts[0] for n in zipfile.ZipFile(wheel).namelist()}
    return wheel


def _home_assistant_only(folder: Path, without: frozenset[str] = frozenset()) -> Path:
    """A virtualenv with Home Assistant and the components it loads, and no paged-llm.

    ``without``: more pins to leave out, for Home Assistant to install itself.
    """
    pins = [
        line.split("#")[0].strip()
        for line in (ROOT / "requirements_dev.txt").read_text().splitlines()
        if line.split("#")[0].strip()
    ]
    # The library's own dependency must come through Home Assistant's install too.
    skip = NOT_IN_HOME_ASSISTANT_OS | {"prometheus-client"} | without
    wanted = [pin for pin in pins if re.split(r"[=<>\[ ]", pin)[0] not in skip]
    venv = folder / "venv"
    _run(_uv(), "venv", "--quiet", "--python", sys.executable, str(venv))
    _run(_uv(), "pip", "install", "--quiet", "--python", str(venv / "bin" / "python"), *wanted)
    return venv


def _installed_version(venv: Path) -> str | None:
    """The version of paged-llm in the virtualenv, or None."""
    probe = (
        "import importlib.metadata as m\n"
        "try: print(m.version('paged-llm'))\n"
        "except m.PackageNotFoundError: print('')"
    )
    # Away from the checkout, whose egg-info would answer for the library.
    out = _run(str(venv / "bin" / "python"), "-c", probe, cwd=venv).strip()
    return out or None


def _config_folder(tmp_path: Path, port: int) -> Path:
    """A config folder holding a copy of the integration, as HACS leaves it."""
    config_dir = tmp_path / "config"
    shutil.copytree(
        ROOT / "custom_components" / "paged_llm",
        config_dir / "custom_components" / "paged_llm",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    docs = tmp_path / "docs"
    docs.mkdir()
    (config_dir / "configuration.yaml").write_text(CONFIGURATION.format(docs=docs))
    write_http_settings(config_dir, port)
    return config_dir


def _set_up_remote(hass: HomeAssistantProcess, server: ServerProcess) -> str:
    """Run the config flow in remote mode; return the conversation agent's entity id."""
    flow = "/api/config/config_entries/flow"
    status, result = hass.request("POST", flow, {"handler": "paged_llm"}, timeout=300)
    assert status == 200, (result, hass.log_tail())
    flow_id = result["flow_id"]
    for step in ({"backend": "remote"}, {"url": server.url, "timeout": 60}, {"model": "tiny"}):
        status, result = hass.request("POST", f"{flow}/{flow_id}", step)
        assert status == 200, result
    assert result["type"] == "create_entry", result
    return _agent(hass)


def _agent(hass: HomeAssistantProcess) -> str:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        agents = [e for e in hass.states() if e.startswith("conversation.") and "paged_llm" in e]
        if agents:
            return agents[0]
        time.sleep(0.5)
    raise AssertionError(f"no conversation agent appeared:\n{hass.log_tail()}")


def _converse(hass: HomeAssistantProcess, agent: str) -> None:
    status, reply = hass.request(
        "POST",
        "/api/conversation/process",
        {"text": "Turn on the kitchen lights", "agent_id": agent, "language": "en"},
    )
    assert status == 200, reply
    assert reply["response"]["response_type"] != "error", reply
    assert reply["response"]["speech"]["plain"]["speech"], reply


@pytest.mark.slow
def test_hacs_install_gets_the_library_from_its_pin_and_upgrades_it(
    tmp_path: Path, socket_enabled: None, tiny_model_dir: Path
) -> None:
    server = ServerProcess(tiny_model_dir)
    hass: InstallingHomeAssistant | None = None
    server.launch()  # the server loads its model while the wheels and virtualenv are built
    try:
        wheels = tmp_path / "wheels"
        _build_wheel(ROOT, wheels)
        _repack_installed("prometheus-client", wheels)
        venv = _home_assistant_only(tmp_path / "ha")
        assert _installed_version(venv) is None
        port = free_port()
        config_dir = _config_folder(tmp_path, port)
        manifest_path = config_dir / "custom_components" / "paged_llm" / "manifest.json"
        assert json.loads(manifest_path.read_text())["requirements"] == [f"{LIBRARY}=={VERSION}"]

        hass = InstallingHomeAssistant(config_dir, port, venv / "bin" / "hass", wheels)
        hass.start()
        server.wait_until_healthy()
        hass.wait_until_up()
        hass.onboard()
        agent = _set_up_remote(hass, server)
        assert _installed_version(venv) == VERSION
        probe = "import importlib.util as u; print(u.find_spec('torch') is None)"
        assert _run(str(venv / "bin" / "python"), "-c", probe, cwd=venv).strip() == "True"
        _converse(hass, agent)
        hass.wait_until_running()
        assert hass.stop() == 0

        # A new release: its wheel in the folder and its pin in the manifest, as HACS would
        # deliver the next version of the integration.
        bumped = f"{VERSION}.post1"
        source = tmp_path / "source"
        shutil.copytree(
            ROOT,
            source,
            ignore=shutil.ignore_patterns(*IGNORED_IN_COPY),
        )
        pyproject = source / "pyproject.toml"
        pyproject.write_text(
            pyproject.read_text().replace(f'version = "{VERSION}"', f'version = "{bumped}"', 1)
        )
        _build_wheel(source, wheels)
        manifest = json.loads(manifest_path.read_text())
        manifest["requirements"] = [f"{LIBRARY}=={bumped}"]
        manifest["version"] = bumped
        manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")

        hass.start()
        hass.wait_until_up()
        agent = _agent(hass)
        assert _installed_version(venv) == bumped, hass.log_tail()
        _converse(hass, agent)
        hass.wait_until_running()
        assert hass.stop() == 0
        # Home Assistant's own optional installs fail without an index; ours must not.
        log = hass.log.read_text(errors="replace")
        assert f"Unable to install package {LIBRARY}" not in log
    finally:
        if hass is not None:
            kill(hass)
        server.stop()
