"""Which extra the integration installs: the light cpu one for a GGUF model on the CPU, the
torch path's for a GPU or a model that is not a GGUF file, and the engine ready without torch.

The flows run in the real Home Assistant harness; only the installer itself is replaced
(no index here): it records what it was asked for and "installs" it by making the modules
a test blocked importable again.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest.mock import patch

import pytest
import yaml
from homeassistant import config_entries
from homeassistant.config_entries import ConfigEntryState
from homeassistant.const import CONF_DEVICE, CONF_MODEL
from homeassistant.core import HomeAssistant
from homeassistant.data_entry_flow import FlowResultType
from homeassistant.requirements import RequirementsNotFound

from custom_components.paged_llm.const import DOMAIN
from custom_components.paged_llm.engine_import import needed_extra
from custom_components.paged_llm.engine_install import extra_requirements
from custom_components.paged_llm.schemas import form_values
from paged_llm.defaults import DEFAULT_MODEL
from paged_llm.engine.api import EngineConfig
from paged_llm.extras import CPU_MODULES
from tests.helpers.without_torch import BLOCKED, run_without_torch

pytestmark = pytest.mark.usefixtures("ha_core")

CPU_REQUIREMENTS = extra_requirements("cpu")
ENGINE_REQUIREMENTS = extra_requirements("engine")


class Installer:
    """Home Assistant's installer as the flow sees it: records requests, unblocks modules."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, blocked: tuple[str, ...]) -> None:
        """Block ``blocked`` until an install; keep what each one was before."""
        if "torch" in blocked:
            # torch initializes once per process: a fresh import after an earlier one was
            # dropped from sys.modules fails, so the real module is kept and put back.
            importlib.import_module("torch")
        self.saved = {name: sys.modules.get(name) for name in blocked}
        for name in blocked:
            monkeypatch.setitem(sys.modules, name, None)
        self.asked: list[list[str]] = []
        self.fail = False

    async def __call__(
        self, hass: HomeAssistant, name: str, requirements: list[str], is_built_in: bool
    ) -> None:
        """Install: the blocked modules asked for import again (or fail, as offline)."""
        assert name == DOMAIN
        assert not is_built_in
        self.asked.append(requirements)
        if self.fail:
            raise RequirementsNotFound(DOMAIN, requirements)
        asked = {re.split(r"[<>=!~; ]", req)[0] for req in requirements}
        for module in asked & set(self.saved):
            if (saved := self.saved.pop(module)) is None:
                sys.modules.pop(module, None)
            else:
                sys.modules[module] = saved


@pytest.fixture
def installer_for(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """An Installer factory, patched in where the integration installs extras."""
    made: list[Installer] = []

    def make(*blocked: str) -> Installer:
        made.append(Installer(monkeypatch, blocked))
        return made[-1]

    async def install(
        hass: HomeAssistant, name: str, requirements: list[str], is_built_in: bool = True
    ) -> None:
        await made[-1](hass, name, requirements, is_built_in)

    with patch("custom_components.paged_llm.engine_install.async_process_requirements", install):
        yield make


def test_the_cpu_extra_holds_no_torch_and_the_engine_extra_holds_it_all() -> None:
    names = {re.split(r"[<>=]", req)[0] for req in CPU_REQUIREMENTS}
    # The prebuilt kernels come with it where they are built for (not a module the runner
    # needs: a local build stands in for them).
    assert names - {"paged-llm-kernels"} == set(CPU_MODULES)
    assert set(CPU_REQUIREMENTS) < set(ENGINE_REQUIREMENTS)
    assert {"torch>=2.9", "transformers<6,>=5.0"} <= set(ENGINE_REQUIREMENTS)


@pytest.mark.parametrize(
    ("model", "device", "extra"),
    [
        (DEFAULT_MODEL, "cpu", "cpu"),
        (DEFAULT_MODEL, "auto", "cpu"),
        ("/models/qwen2.5-1.5b-instruct-q4_k_m.gguf", "cpu", "cpu"),
        (DEFAULT_MODEL, "cuda", "engine"),
        ("/models/qwen2.5-1.5b-instruct-q4_k_m.gguf", "cuda:0", "engine"),
        ("Qwen/Qwen2.5-1.5B-Instruct", "cpu", "engine"),
        ("/models/smollm2-folder", "auto", "engine"),
    ],
)
def test_the_extra_follows_the_model_and_the_device(
    model: str, device: str, extra: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As on a box that has neither extra yet: torch is not there.
    monkeypatch.setitem(sys.modules, "torch", None)
    config = EngineConfig(model=model, device=device, cache_dir=Path("/nowhere"))
    assert needed_extra(config) == extra


@pytest.mark.timeout(300)
def test_the_engine_is_ready_without_torch_when_the_cpu_packages_are_there() -> None:
    # A fresh Python where torch, transformers, triton, xgrammar and accelerate cannot be
    # imported: the engine is ready; without one of the cpu extra's packages, installable.
    code = """
        from custom_components.paged_llm.engine_import import EngineState, engine_state

        state, reason = engine_state()
        assert state is EngineState.READY, (state, reason)
        print("ready")
    """
    done = run_without_torch(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ready"

    missing = """
        from custom_components.paged_llm.engine_import import EngineState, engine_state

        state, reason = engine_state()
        assert state is EngineState.MISSING, (state, reason)
        assert "llguidance" in reason, reason
    """
    done = run_without_torch(missing, (*BLOCKED, "llguidance"))
    assert done.returncode == 0, done.stderr


async def _embedded(hass: HomeAssistant) -> dict[str, Any]:
    """Start a flow and choose to run the model on this Home Assistant."""
    result = await hass.config_entries.flow.async_init(
        DOMAIN, context={"source": config_entries.SOURCE_USER}
    )
    assert result["data_schema"].schema["backend"].config["options"] == ["embedded", "remote"]
    return await hass.config_entries.flow.async_configure(
        result["flow_id"], {"backend": "embedded"}
    )


async def _finish(hass: HomeAssistant, result: dict[str, Any]) -> dict[str, Any]:
    """Let a progress step's task end and take the step after it."""
    assert result["type"] is FlowResultType.SHOW_PROGRESS
    await hass.async_block_till_done()
    return await hass.config_entries.flow.async_configure(result["flow_id"])


async def test_a_gguf_model_on_the_cpu_installs_only_the_cpu_extra(
    hass: HomeAssistant, engine_settings: dict[str, Any], installer_for: Any
) -> None:
    """No torch anywhere, before or after: the light extra is installed, the bundled GGUF
    model loads on the numpy runner, the entry runs; then a GPU asks for the torch path."""
    installer = installer_for("torch", "llguidance")
    result = await _embedded(hass)
    assert result["step_id"] == "install"
    assert result["progress_action"] == "install_engine"
    assert result["description_placeholders"] == {"extra": "paged-llm[cpu]"}
    result = await _finish(hass, result)
    assert installer.asked == [CPU_REQUIREMENTS]
    # torch is not the light extra's: it stays out, through the load and the entry's start.
    assert sys.modules.get("torch", "absent") is None
    assert result["step_id"] == "embedded"

    settings = {
        **engine_settings,
        CONF_MODEL: DEFAULT_MODEL,
        "kv_budget_mib": 16,
        "max_model_len": 512,
    }
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], form_values(settings)
    )
    assert result["step_id"] == "load", result
    result = await _finish(hass, result)
    assert result["type"] is FlowResultType.CREATE_ENTRY, result
    entry = result["result"]
    await hass.async_block_till_done()
    assert entry.state is ConfigEntryState.LOADED
    assert entry.runtime_data.backend.engine.info.device == "cpu"
    assert installer.asked == [CPU_REQUIREMENTS]

    # A GPU is the torch path's: reconfiguring to one installs the engine extra first
    # (here the install fails, as offline: the form says so, the entry keeps its settings).
    result = await hass.config_entries.flow.async_init(
        DOMAIN,
        context={"source": config_entries.SOURCE_RECONFIGURE, "entry_id": entry.entry_id},
    )
    fields = {str(key) for key in result["data_schema"].schema}
    values = {k: v for k, v in form_values(settings).items() if k in fields}
    # Set before the install starts: Home Assistant may run its task at once (eager start).
    installer.fail = True
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], {**values, CONF_DEVICE: "cuda"}
    )
    assert result["step_id"] == "install_torch", result
    assert result["description_placeholders"] == {"extra": "paged-llm[engine]"}
    result = await _finish(hass, result)
    assert result.get("step_id") == "reconfigure", result
    assert result["errors"] == {"base": "engine_install_failed"}
    assert installer.asked == [CPU_REQUIREMENTS, ENGINE_REQUIREMENTS]
    assert entry.data[CONF_DEVICE] == "cpu"

    # Online again: the same form installs it, then test-loads the model on the GPU as the
    # first run does. Saved where a GPU is; elsewhere the form says there is none and the
    # entry keeps its settings.
    installer.fail = False
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], {**values, CONF_DEVICE: "cuda"}
    )
    result = await _finish(hass, result)
    assert installer.asked[-1] == ENGINE_REQUIREMENTS
    assert result["step_id"] == "load", result
    result = await _finish(hass, result)
    if importlib.import_module("torch").cuda.is_available():
        assert result["type"] is FlowResultType.ABORT
        assert result["reason"] == "reconfigure_successful"
        assert entry.data[CONF_DEVICE] == "cuda"
    else:
        assert result["step_id"] == "reconfigure", result
        assert result["errors"] == {"base": "model_load_failed"}
        assert "no CUDA GPU" in result["description_placeholders"]["reason"]
        assert entry.data[CONF_DEVICE] == "cpu"
    await hass.async_block_till_done()
    await hass.config_entries.async_unload(entry.entry_id)


async def test_a_model_folder_installs_the_engine_extra_before_it_loads(
    hass: HomeAssistant, engine_settings: dict[str, Any], installer_for: Any
) -> None:
    """The cpu extra is there, torch is not: the engine form comes at once, and a model
    folder (not a GGUF file) installs the torch path's extra, then loads on it."""
    installer = installer_for("torch")
    result = await _embedded(hass)
    assert result["step_id"] == "embedded"
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], form_values(engine_settings)
    )
    assert result["step_id"] == "install_torch", result
    assert result["progress_action"] == "install_torch"
    assert result["description_placeholders"] == {"extra": "paged-llm[engine]"}
    result = await _finish(hass, result)
    assert installer.asked == [ENGINE_REQUIREMENTS]
    assert result["step_id"] == "load", result
    result = await _finish(hass, result)
    assert result["type"] is FlowResultType.CREATE_ENTRY, result
    await hass.async_block_till_done()
    assert await hass.config_entries.async_unload(result["result"].entry_id)


async def test_a_failed_torch_install_is_named_on_the_engine_form(
    hass: HomeAssistant, engine_settings: dict[str, Any], installer_for: Any
) -> None:
    installer = installer_for("torch")
    installer.fail = True
    result = await _embedded(hass)
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], form_values(engine_settings)
    )
    result = await _finish(hass, result)
    assert result["step_id"] == "embedded"
    assert result["errors"] == {"base": "engine_install_failed"}
    assert "torch" in result["description_placeholders"]["reason"]
    assert installer.asked == [ENGINE_REQUIREMENTS]


# ---- musl (Home Assistant OS, the container image) -----------------------------------------


@pytest.fixture
def musl(monkeypatch: pytest.MonkeyPatch) -> None:
    """This Home Assistant uses musl, as Home Assistant OS does (its C library is all that
    differs for the integration: the packages and kernels are this machine's own)."""
    monkeypatch.setattr("custom_components.paged_llm.engine_import.is_musl", lambda: True)
    monkeypatch.setattr("custom_components.paged_llm.config_flow.is_musl", lambda: True)


def no_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """Neither a prebuilt kernels wheel nor a C compiler, as on Home Assistant OS before the
    kernels were published."""
    from paged_llm.kernels.cpu import native_build, prebuilt

    monkeypatch.setattr(prebuilt, "folder", lambda: None)
    monkeypatch.setattr(native_build, "find_compiler", lambda: None)


def musl_refusal() -> str:
    """The refusal's English text, as strings.json gives it."""
    strings = json.loads((Path(__file__).parents[3] / STRINGS).read_text())
    return str(strings["config"]["error"]["embedded_musl"])


STRINGS = "custom_components/paged_llm/strings.json"


@pytest.mark.usefixtures("musl")
async def test_on_musl_the_engine_installs_and_runs_where_its_kernels_do(
    hass: HomeAssistant, engine_settings: dict[str, Any], installer_for: Any
) -> None:
    """ "On this Home Assistant" is offered on musl: the cpu extra is installed (its packages
    publish musllinux wheels), the kernels load, the entry runs the bundled GGUF model."""
    installer = installer_for("torch", "llguidance")
    result = await _embedded(hass)
    assert result["step_id"] == "install"
    result = await _finish(hass, result)
    assert installer.asked == [CPU_REQUIREMENTS]
    assert result["step_id"] == "embedded"
    settings = {**engine_settings, CONF_MODEL: DEFAULT_MODEL, "kv_budget_mib": 16}
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], form_values({**settings, "max_model_len": 512})
    )
    result = await _finish(hass, result)
    assert result["type"] is FlowResultType.CREATE_ENTRY, result
    await hass.async_block_till_done()
    assert result["result"].state is ConfigEntryState.LOADED


@pytest.mark.usefixtures("musl")
async def test_on_musl_without_kernels_the_form_names_it_and_points_to_the_addon(
    hass: HomeAssistant, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No prebuilt kernels and no compiler: only the server is offered, the reason says both,
    and the text sends the user to the add-on (not to `paged-llm serve`)."""
    no_kernels(monkeypatch)
    result = await hass.config_entries.flow.async_init(
        DOMAIN, context={"source": config_entries.SOURCE_USER}
    )
    assert result["errors"] == {"base": "embedded_musl"}
    assert result["data_schema"].schema["backend"].config["options"] == ["remote"]
    reason = result["description_placeholders"]["reason"]
    assert "the paged-llm-kernels package is not installed" in reason
    assert "no C compiler" in reason
    text = musl_refusal()
    assert "{reason}" in text
    assert "Paged LLM app (add-on)" in text
    assert "paged-llm serve" not in text


@pytest.mark.usefixtures("musl")
async def test_on_musl_a_package_that_does_not_install_is_named_with_the_addon(
    hass: HomeAssistant, installer_for: Any
) -> None:
    """A package without a musllinux wheel for this machine: the install fails, the choice
    form names it under the musl refusal (the add-on), and offers the server only."""
    installer = installer_for("torch", "llguidance")
    installer.fail = True
    result = await _embedded(hass)
    result = await _finish(hass, result)
    assert result["step_id"] == "user"
    assert result["errors"] == {"base": "embedded_musl"}
    assert result["data_schema"].schema["backend"].config["options"] == ["remote"]
    assert "llguidance" in result["description_placeholders"]["reason"]


@pytest.mark.usefixtures("musl")
async def test_on_musl_a_machine_without_builds_is_refused_before_any_install(
    hass: HomeAssistant, installer_for: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a musl machine the packages are not published for, nothing is installed: the form
    says which machine and points to the add-on."""
    installer = installer_for("torch", "llguidance")
    monkeypatch.setattr(
        "custom_components.paged_llm.engine_import.platform.machine", lambda: "riscv64"
    )
    result = await hass.config_entries.flow.async_init(
        DOMAIN, context={"source": config_entries.SOURCE_USER}
    )
    assert result["errors"] == {"base": "embedded_musl"}
    assert "not riscv64" in result["description_placeholders"]["reason"]
    assert installer.asked == []


def test_the_refusal_names_the_addons_hostname_for_this_repository() -> None:
    """The host in the refusal is the Supervisor's for this repository's add-on: the first 8
    hex digits of the sha1 of the repository's URL, a hyphen, the slug with hyphens."""
    root = Path(__file__).parents[3]
    url = yaml.safe_load((root / "repository.yaml").read_text())["url"]
    slug = yaml.safe_load((root / "addon" / "config.yaml").read_text())["slug"]
    host = f"{hashlib.sha1(url.lower().encode()).hexdigest()[:8]}-{slug.replace('_', '-')}"
    for path in [root / STRINGS, *sorted((root / STRINGS).parent.glob("translations/*.json"))]:
        text = json.loads(path.read_text())["config"]["error"]["embedded_musl"]
        assert f"http://{host}:8000" in text, path.name
        assert url in text, path.name
