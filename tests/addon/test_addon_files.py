"""The add-on repository as the Supervisor reads it: config, build, translations, image, CI.

The rules are the Supervisor's (supervisor/apps/validate.py, options.py) and its add-on
linter's (frenck/action-addon-linter, which CI runs); kept here so a change fails locally.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
import yaml
from PIL import Image

from paged_llm.defaults import WEIGHT_CHOICES
from paged_llm_addon.options import Options, parse_options
from paged_llm_addon.supervisor import SERVICE

ROOT = Path(__file__).resolve().parents[2]
ADDON = ROOT / "addon"
INTEGRATION = ROOT / "custom_components" / "paged_llm"
CONFIG: dict[str, Any] = yaml.safe_load((ADDON / "config.yaml").read_text(encoding="utf-8"))
DOCKERFILE = (ADDON / "Dockerfile").read_text(encoding="utf-8")
LANGUAGES = sorted(path.stem for path in (ADDON / "translations").glob("*.yaml"))

# The Supervisor's option types (apps/options.py RE_SCHEMA_ELEMENT).
SCHEMA_ELEMENT = re.compile(
    r"^(?:|bool|email|url|port|device(?:\((?P<filter>subsystem=[a-z]+)\))?"
    r"|str(?:\((?P<s_min>\d+)?,(?P<s_max>\d+)?\))?"
    r"|password(?:\((?P<p_min>\d+)?,(?P<p_max>\d+)?\))?"
    r"|int(?:\((?P<i_min>-?\d+)?,(?P<i_max>-?\d+)?\))?"
    r"|float(?:\((?P<f_min>-?\d*\.?\d+)?,(?P<f_max>-?\d*\.?\d+)?\))?"
    r"|match\((?P<match>.*)\)|list\((?P<list>.+)\))\??$"
)
# The Supervisor's base images for builds (apps/validate.py RE_DOCKER_IMAGE_BUILD).
IMAGE_BUILD = re.compile(r"^([a-zA-Z\-\.:\d{}]+/)*?([\-\w{}]+)/([\-\w{}]+)(:[\.\-\w{}]+)?$")
# Keys the linter refuses at their default value ("should be removed").
DEFAULTS = {
    "boot": "auto",
    "startup": "application",
    "init": True,
    "host_network": False,
    "hassio_api": False,
    "homeassistant_api": False,
    "ingress": False,
    "stage": "stable",
    "timeout": 10,
    "apparmor": True,
    "backup": "hot",
}


def test_the_repository_is_an_add_on_repository_beside_hacs() -> None:
    assert (ROOT / "hacs.json").is_file()
    repository = yaml.safe_load((ROOT / "repository.yaml").read_text(encoding="utf-8"))
    manifest = json.loads((INTEGRATION / "manifest.json").read_text(encoding="utf-8"))
    assert repository["name"]
    assert manifest["documentation"].startswith(repository["url"])
    # The Supervisor reads every config.* it finds in the repository, outside rootfs and
    # dot folders, as an add-on's.
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    found = [
        name
        for name in [*tracked, "addon/config.yaml"]  # new files count before they are added
        if re.search(r"(^|/)config\.(json|ya?ml)$", name)
        and not any(part.startswith(".") or part == "rootfs" for part in Path(name).parts)
    ]
    assert sorted(set(found)) == ["addon/config.yaml"]


def test_config_is_what_the_supervisor_and_its_linter_accept() -> None:
    manifest = json.loads((INTEGRATION / "manifest.json").read_text(encoding="utf-8"))
    assert {"name", "version", "slug", "description", "arch"} <= set(CONFIG)
    assert CONFIG["version"] == manifest["version"]  # scripts/release keeps them together
    assert re.fullmatch(r"[a-z0-9_]+", CONFIG["slug"])
    assert set(CONFIG["arch"]) == {"amd64", "aarch64"}
    assert CONFIG["discovery"] == [SERVICE] == [manifest["domain"]]
    assert CONFIG["image"].startswith("ghcr.io/")
    assert "{arch}" not in CONFIG["image"]  # one multi-arch name (the builder's manifest)
    for key, default in DEFAULTS.items():
        assert CONFIG.get(key, object()) != default, f"{key}: the default, remove it"
    assert "watchdog" not in CONFIG  # obsolete: the program exits when the server fails
    assert all(re.fullmatch(r"(share|media)(:ro)?", volume) for volume in CONFIG["map"])
    assert 10 <= CONFIG["timeout"] <= 300
    assert set(CONFIG["ports"]) == set(CONFIG["ports_description"]) == {"8000/tcp"}


def test_every_option_has_a_schema_entry_the_program_reads() -> None:
    options, schema = CONFIG["options"], CONFIG["schema"]
    assert set(options) <= set(schema)
    # Optional entries ("?") are the ones without a default shown in the form.
    assert {k for k, v in schema.items() if v.endswith("?")} == set(schema) - set(options)
    assert set(schema) == {field.name for field in fields(Options)}
    for name, element in schema.items():
        assert SCHEMA_ELEMENT.match(element), (name, element)
    assert schema["weights"] == f"list({'|'.join(WEIGHT_CHOICES)})"
    # config.yaml's defaults are the program's, and pass its checks.
    assert parse_options(options) == Options()


@pytest.mark.parametrize("language", LANGUAGES)
def test_each_language_translates_every_option_and_port(language: str) -> None:
    strings = yaml.safe_load((ADDON / "translations" / f"{language}.yaml").read_text("utf-8"))
    assert set(strings) == {"configuration", "network"}
    assert set(strings["configuration"]) == set(CONFIG["schema"])
    for name, text in strings["configuration"].items():
        assert set(text) == {"name", "description"}, (language, name)
        assert text["name"].strip(), (language, name)
        assert text["description"].strip(), (language, name)
    assert set(strings["network"]) == set(CONFIG["ports"])


def test_the_add_on_speaks_the_integrations_languages() -> None:
    assert sorted(path.stem for path in (INTEGRATION / "translations").glob("*")) == LANGUAGES


def test_the_dockerfile_alone_builds_the_image_for_every_architecture() -> None:
    # Home Assistant's builder actions read no build.yaml; the Supervisor still would, with
    # a warning, so there is none.
    assert not (ADDON / "build.yaml").exists()
    # No BUILD_FROM comes from the builder: the default is a multi-platform Debian base.
    (default,) = re.findall(r"^ARG BUILD_FROM=(\S+)$", DOCKERFILE, re.MULTILINE)
    assert IMAGE_BUILD.match(default)
    assert "slim-" in default  # Debian (glibc)
    # The label the Supervisor knows an add-on's image by, and the image's own description.
    labels = dict(re.findall(r'([\w.]+)="([^"]*)"', DOCKERFILE.split("\nLABEL ", 1)[1]))
    assert labels["io.hass.type"] == "addon"
    assert labels["io.hass.arch"] == "${BUILD_ARCH}"
    assert {"title", "description", "source", "licenses"} <= {
        key.removeprefix("org.opencontainers.image.") for key in labels
    }
    assert f"\nARG BUILD_VERSION={CONFIG['version']}\n" in DOCKERFILE
    # The light cpu extra (the numpy runner), no PyTorch, and no C compiler: the kernels
    # come prebuilt (libgomp1 runs their threads), checked by the build once the add-on's
    # program, which checks them, is in.
    assert "[cpu]" in DOCKERFILE
    assert "[engine]" not in DOCKERFILE
    assert "pytorch.org" not in DOCKERFILE
    (packages,) = re.findall(r"apt-get install -y --no-install-recommends (.*?) \\", DOCKERFILE)
    assert packages.split() == ["libgomp1"]
    copy = DOCKERFILE.index("COPY paged_llm_addon /opt/paged-llm-addon/paged_llm_addon")
    assert copy < DOCKERFILE.index(
        "RUN PYTHONPATH=/opt/paged-llm-addon python3 -m paged_llm_addon.kernels\n"
    )
    assert 'CMD ["/run.sh"]' in DOCKERFILE


def test_the_offline_build_makes_the_image_without_torch_for_both_arches() -> None:
    """scripts/addon_image_offline: no torch in its base, the wheels the Dockerfile takes
    (the library's and the kernels' for the image's arch), then the smoke test."""
    script = (ROOT / "scripts" / "addon_image_offline").read_text(encoding="utf-8")
    assert not re.search(r"pip install\b.*\btorch\b", script)
    assert "amd64 | x86_64)" in script
    assert "aarch64 | arm64)" in script
    assert 'CC=$cc uv build --wheel -q -o "$kept" kernels_wheel' in script
    assert 'cp "$wheel" addon/wheels/' in script
    assert "uv build --wheel -q -o addon/wheels ." in script
    assert 'ENGINE=podman scripts/addon_smoke_test "$image"' in script
    smoke = (ROOT / "scripts" / "addon_smoke_test").read_text(encoding="utf-8")
    # Damaged prebuilt kernels, with no compiler to fall back on, stop it with the reason.
    assert '"is damaged or replaced"' in smoke
    assert '"and there is no C compiler"' in smoke
    for name in ("addon_image_offline", "addon_smoke_test"):
        path = ROOT / "scripts" / name
        assert os.access(path, os.X_OK)
        subprocess.run(["bash", "-n", str(path)], check=True)


def test_the_run_script_starts_the_program() -> None:
    run_sh = ADDON / "run.sh"
    assert os.access(run_sh, os.X_OK)
    text = run_sh.read_text(encoding="utf-8")
    assert text.startswith("#!/bin/sh\n")
    assert "export PYTHONPATH=/opt/paged-llm-addon" in text
    assert "exec python3 -m paged_llm_addon" in text


def test_docs_icon_and_logo() -> None:
    docs = (ADDON / "DOCS.md").read_text(encoding="utf-8")
    for name in CONFIG["schema"]:
        assert f"`{name}`" in docs, name
    assert "docker build" in docs
    assert "podman build" in docs
    with Image.open(ADDON / "icon.png") as icon:
        assert icon.size == (128, 128)
    with Image.open(ADDON / "logo.png") as logo:
        assert logo.size == (250, 100)


def test_ci_lints_builds_and_starts_the_image() -> None:
    flow = yaml.safe_load((ROOT / ".github" / "workflows" / "addon.yml").read_text())
    steps = [step for job in flow["jobs"].values() for step in job["steps"]]
    uses = [step.get("uses", "") for step in steps]
    lint = next(s for s in steps if s.get("uses", "").startswith("frenck/action-addon-linter"))
    assert lint["with"]["path"] == "./addon"
    assert any(u.startswith("home-assistant/builder/actions/build-image@") for u in uses)
    assert any("scripts/addon_smoke_test" in step.get("run", "") for step in steps)
    # The image has no compiler: the kernels its library pins are built for it first.
    runs = [step.get("run", "") for step in steps]
    kernels = next(i for i, run in enumerate(runs) if "scripts/kernels_wheel addon/wheels" in run)
    assert kernels < next(i for i, u in enumerate(uses) if "build-image@" in u)
    assert json.loads(flow["env"]["ARCHITECTURES"]) == sorted(CONFIG["arch"], reverse=True)
    # On a version tag the manifest over the architectures' images is the image config.yaml
    # pulls (the builder names those ghcr.io/OWNER/ARCH-NAME and the manifest OWNER/NAME).
    owner = CONFIG["image"].split("/")[1]
    assert CONFIG["image"] == f"ghcr.io/{owner}/{flow['env']['IMAGE_NAME']}"
    manifest = flow["jobs"]["manifest"]
    assert manifest["if"] == "startsWith(github.ref, 'refs/tags/v')"
    assert set(manifest["needs"]) == {"init", "build"}
    (publish,) = manifest["steps"]
    assert publish["uses"].startswith("home-assistant/builder/actions/publish-multi-arch-manifest@")
    assert publish["with"]["image-name"] == "${{ env.IMAGE_NAME }}"
    assert publish["with"]["architectures"] == "${{ env.ARCHITECTURES }}"
