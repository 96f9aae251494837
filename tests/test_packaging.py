"""The repository's packaging: the library mapping, the built wheel, HACS and manifest rules."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = ROOT / "custom_components" / "paged_llm" / "manifest.json"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_editable_install_maps_folders_to_paged_llm() -> None:
    import paged_llm.engine
    import paged_llm.kernels
    import paged_llm.protocol
    import paged_llm.server

    assert Path(paged_llm.engine.__file__).parent == ROOT / "engine"
    assert Path(paged_llm.kernels.__file__).parent == ROOT / "kernels"
    assert Path(paged_llm.protocol.__file__).parent == ROOT / "protocol"
    assert Path(paged_llm.server.__file__).parent == ROOT / "server"


def test_no_generic_top_level_modules(tmp_path: Path) -> None:
    # Hugging Face ships a real package named `kernels`; ours must never shadow it. Checked
    # in a fresh interpreter away from the checkout, as Home Assistant would import.
    probe = (
        "import importlib.util as u, sys;"
        "names = ('engine', 'kernels', 'server', 'protocol', 'package');"
        "print([n for n in names if (s := u.find_spec(n)) and s.origin and"
        f" s.origin.startswith({str(ROOT)!r})])"
    )
    result = subprocess.run(
        [sys.executable, "-I", "-c", probe],
        cwd=tmp_path,
        check=True,
        capture_output=True,
        text=True,
    )
    assert result.stdout.strip() == "[]"


def _names(requirements: list[str]) -> set[str]:
    from packaging.requirements import Requirement

    return {Requirement(req).name for req in requirements}


def test_library_declares_python_and_dependencies() -> None:
    project = PYPROJECT["project"]
    assert project["requires-python"] == ">=3.12"
    # The plain install is what Home Assistant OS (musl) gets: nothing of PyTorch's world.
    base = _names(project["dependencies"])
    assert not base & {"torch", "transformers", "gguf", "accelerate", "numpy", "triton"}
    assert {"aiohttp", "prometheus-client"} <= base
    engine = _names(project["optional-dependencies"]["engine"])
    assert {"torch", "transformers", "gguf", "accelerate", "numpy", "triton"} <= engine


def test_the_cpu_extra_is_the_numpy_runners_and_the_engine_extra_holds_it() -> None:
    from paged_llm.extras import CPU_MODULES, EXTRA_MODULES

    extras = PYPROJECT["project"]["optional-dependencies"]
    # The prebuilt kernels aside: a local build stands in for them where they do not install.
    cpu = _names(extras["cpu"]) - {"paged-llm-kernels"}
    # Only what the numpy runner imports: nothing of the torch path's world.
    assert cpu == {"numpy", "tokenizers", "jinja2", "gguf", "llguidance"}
    # Each distribution's import name is its own here; the installer's checks rely on that.
    assert set(CPU_MODULES) == cpu
    # Listed again, not as "paged-llm[cpu]" (Home Assistant's installer ignores extras).
    assert set(extras["cpu"]) <= set(extras["engine"])
    assert "paged-llm" not in _names(extras["engine"])
    assert set(EXTRA_MODULES["cpu"]) < set(EXTRA_MODULES["engine"])


def test_both_extras_pin_this_releases_prebuilt_kernels_where_they_are_built() -> None:
    """paged-llm-kernels of this very version (a build loads only for its own sources), on the
    four platforms its wheels exist for: Linux (glibc and musl) on x86_64 and aarch64."""
    from packaging.requirements import Requirement

    project = PYPROJECT["project"]
    for extra in ("cpu", "engine"):
        reqs = [Requirement(r) for r in project["optional-dependencies"][extra]]
        kernels = [r for r in reqs if r.name == "paged-llm-kernels"]
        assert len(kernels) == 1
        assert str(kernels[0].specifier) == f"=={project['version']}"
        marker = kernels[0].marker
        assert marker is not None
        for system, machine, wanted in [
            ("linux", "x86_64", True),
            ("linux", "aarch64", True),
            ("linux", "riscv64", False),
            ("darwin", "arm64", False),
            ("win32", "AMD64", False),
        ]:
            env = {"sys_platform": system, "platform_machine": machine}
            assert marker.evaluate(env) is wanted


def test_engine_without_torch_says_what_to_install(tmp_path: Path) -> None:
    # paged_llm.engine and paged_llm.kernels import without torch (the numpy runner serves
    # GGUF files on the CPU); the torch path's entry modules and names say what to install.
    probe = (
        "import sys; sys.modules['torch'] = None\n"
        "import paged_llm.protocol.snapshot, paged_llm.client\n"
        "import paged_llm.engine.api\n"
        "for name, attr in (\n"
        "    ('paged_llm.engine.model.loader', None), ('paged_llm.kernels', 'store_kv')\n"
        "):\n"
        "    try:\n"
        "        module = __import__(name, fromlist=['_'])\n"
        "        if attr:\n"
        "            getattr(module, attr)\n"
        "    except ImportError as err:\n"
        "        print(name, '|', err)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, check=True, capture_output=True, text=True
    )
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 2, result.stdout
    for line in lines:
        assert "'torch'" in line
        assert "pip install 'paged-llm[engine]'" in line


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    uv = shutil.which("uv")
    if uv is None:
        pytest.fail("uv is needed to build the wheel (scripts/setup installs it)")
    subprocess.run(
        [
            uv,
            "build",
            "--wheel",
            "--no-build-isolation",
            "--python",
            sys.executable,
            "--out-dir",
            str(out),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    (built,) = out.glob("paged_llm-*.whl")
    return built


def test_wheel_holds_only_the_namespaced_packages(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    code = [n for n in names if n.endswith(".py")]
    assert any(n == "paged_llm/engine/core/scheduler.py" for n in code)
    assert any(n.startswith("paged_llm/kernels/") for n in code)
    assert any(n == "paged_llm/server/cli.py" for n in code)
    assert any(n == "paged_llm/protocol/tool_calls.py" for n in code)
    assert any(n == "paged_llm/client/openai.py" for n in code)
    assert any(n == "paged_llm/protocol/snapshot.py" for n in code)
    assert any(n == "paged_llm/engine/core/kv/block_pool.py" for n in code)
    top = (
        "paged_llm/__init__.py",
        "paged_llm/__main__.py",
        "paged_llm/catalogue.py",
        "paged_llm/defaults.py",
        "paged_llm/download.py",
        "paged_llm/extras.py",
        "paged_llm/hub.py",
        "paged_llm/metric_windows.py",
        "paged_llm/net.py",
    )
    assert set(top) <= set(code)
    parts = ("client", "engine", "kernels", "protocol", "server")
    assert all(n.startswith(tuple(f"paged_llm/{p}/" for p in parts)) or n in top for n in code)
    assert all(f"paged_llm/{p}/py.typed" in names for p in parts)
    # The C kernels (products, attention, the whole CPU forward) are compiled where the
    # engine runs: every source under kernels/cpu/src/ except the kernels' own self-test.
    src = ROOT / "kernels" / "cpu"
    sources = {
        p.relative_to(src).as_posix() for p in src.rglob("*.[ch]") if not p.stem.endswith("_test")
    }
    assert "src/cpu_forward.c" in sources
    assert {f"paged_llm/kernels/cpu/{name}" for name in sources} <= set(names)
    (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "paged-llm = paged_llm.server.cli:main" in text


def test_wheel_installs_and_imports_without_the_checkout(wheel: Path, tmp_path: Path) -> None:
    uv = shutil.which("uv")
    assert uv is not None
    venv = tmp_path / "venv"
    subprocess.run([uv, "venv", "--quiet", "--python", sys.executable, str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run(
        [uv, "pip", "install", "--quiet", "--no-deps", "--python", str(python), str(wheel)],
        check=True,
    )
    # The heavy dependencies come from the dev venv's site-packages through a plain path
    # line; its editable-install hook is a .pth file there, which such a path never runs.
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    Path(site, "dev_deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    probe = (
        "import paged_llm.engine.core.scheduler, paged_llm.kernels, paged_llm.engine as e;"
        "print(e.__file__)"
    )
    result = subprocess.run(
        [str(python), "-I", "-c", probe], cwd=tmp_path, check=True, capture_output=True, text=True
    )
    location = Path(result.stdout.strip())
    assert location.is_relative_to(venv), location
    assert not location.is_relative_to(ROOT)
    # The command, both as the console script and as `python -m paged_llm`.
    for command in ([str(venv / "bin" / "paged-llm")], [str(python), "-I", "-m", "paged_llm"]):
        shown = subprocess.run(
            [*command, "serve", "--help"], cwd=tmp_path, check=True, capture_output=True, text=True
        )
        assert "--api-key" in shown.stdout


def test_protocol_imports_without_torch() -> None:
    # The remote backend runs where PyTorch cannot be installed (Home Assistant OS).
    probe = (
        "import sys, paged_llm.protocol.tool_calls, paged_llm.protocol.requests,"
        " paged_llm.protocol.responses, paged_llm.protocol.priority, paged_llm.protocol.metrics,"
        " paged_llm.server.cli, paged_llm.server.app;"
        "print(sorted(m for m in ('torch', 'transformers', 'homeassistant') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], check=True, capture_output=True, text=True
    )
    assert result.stdout.strip() == "[]"


def test_python_m_paged_llm_runs_the_command() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "paged_llm", "--help"], check=True, capture_output=True, text=True
    )
    assert "serve" in result.stdout
    assert "generate" in result.stdout


def test_hacs_json() -> None:
    hacs = json.loads((ROOT / "hacs.json").read_text())
    allowed = {
        "name",
        "content_in_root",
        "zip_release",
        "filename",
        "hide_default_branch",
        "country",
        "homeassistant",
        "persistent_directory",
        "render_readme",
    }
    assert set(hacs) <= allowed
    assert hacs["name"]
    assert hacs.get("content_in_root") is False
    from awesomeversion import AwesomeVersion

    assert AwesomeVersion(hacs["homeassistant"]).valid


def test_manifest_follows_hassfest_rules() -> None:
    from awesomeversion import AwesomeVersion, AwesomeVersionStrategy

    manifest = json.loads(MANIFEST.read_text())
    keys = list(manifest)
    # hassfest: domain, name, then every other key in alphabetical order.
    assert keys[:2] == ["domain", "name"]
    assert keys[2:] == sorted(keys[2:])
    assert manifest["domain"] == "paged_llm" == MANIFEST.parent.name
    for key in (
        "codeowners",
        "config_flow",
        "dependencies",
        "documentation",
        "integration_type",
        "iot_class",
        "issue_tracker",
        "requirements",
        "version",
    ):
        assert key in manifest, key
    assert manifest["config_flow"] is True
    assert (MANIFEST.parent / "config_flow.py").is_file()
    assert manifest["integration_type"] in {
        "device",
        "entity",
        "hardware",
        "helper",
        "hub",
        "service",
        "system",
        "virtual",
    }
    assert manifest["iot_class"] in {
        "assumed_state",
        "cloud_polling",
        "cloud_push",
        "local_polling",
        "local_push",
        "calculated",
    }
    assert manifest["documentation"].startswith("https://")
    # The PyPI name pinned to this version (not a git URL): Home Assistant upgrades the
    # library when the pin changes, and the plain install brings no PyTorch.
    assert manifest["requirements"] == [f"paged-llm=={PYPROJECT['project']['version']}"]
    assert isinstance(manifest["dependencies"], list)
    version = AwesomeVersion(manifest["version"])
    assert version.strategy in {AwesomeVersionStrategy.SEMVER, AwesomeVersionStrategy.SIMPLEVER}
    assert manifest["version"] == PYPROJECT["project"]["version"]


def test_brand_icon() -> None:
    from PIL import Image

    icon = Image.open(MANIFEST.parent / "brand" / "icon.png")
    assert icon.format == "PNG"
    assert icon.size == (256, 256)


def test_the_manifest_documentation_link_points_at_a_file_and_heading_of_this_repository() -> None:
    """A link into this repository must name a file (and heading) that exists here."""
    link = json.loads(MANIFEST.read_text())["documentation"]
    repository = yaml.safe_load((ROOT / "repository.yaml").read_text())["url"]
    page, _, anchor = link.removeprefix(repository).partition("#")
    path = ROOT / (page.removeprefix("/blob/main/") or "README.md")
    assert link.startswith(repository), link
    assert path.is_file(), link
    if anchor:
        headings = re.findall(r"^#+ (.+)$", path.read_text(), flags=re.MULTILINE)
        slugs = {re.sub(r"[^\w\- ]", "", h).strip().lower().replace(" ", "-") for h in headings}
        assert anchor in slugs, (anchor, sorted(slugs))
