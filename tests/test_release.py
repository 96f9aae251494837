"""scripts/release: one command bumps every version and tags; a mismatch fails the check."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = ROOT / ".github" / "workflows"


def run(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, check=False)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A throwaway git repository holding the files the release script edits."""
    dest = tmp_path / "repo"
    (dest / "scripts").mkdir(parents=True)
    (dest / "custom_components" / "paged_llm").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "release", dest / "scripts" / "release")
    shutil.copy(ROOT / "pyproject.toml", dest / "pyproject.toml")
    manifest = ROOT / "custom_components" / "paged_llm" / "manifest.json"
    shutil.copy(manifest, dest / "custom_components" / "paged_llm" / "manifest.json")
    (dest / "addon").mkdir()
    for name in ("config.yaml", "Dockerfile"):
        shutil.copy(ROOT / "addon" / name, dest / "addon" / name)
    (dest / "kernels_wheel").mkdir()
    shutil.copy(
        ROOT / "kernels_wheel" / "pyproject.toml", dest / "kernels_wheel" / "pyproject.toml"
    )
    for args in (
        ("git", "init", "-q"),
        ("git", "config", "user.email", "release-test@example.invalid"),
        ("git", "config", "user.name", "release test"),
        ("git", "add", "."),
        ("git", "commit", "-qm", "start"),
    ):
        assert run(dest, *args).returncode == 0
    return dest


def current_version() -> str:
    return json.loads((ROOT / "custom_components/paged_llm/manifest.json").read_text())["version"]


def test_check_passes_on_this_checkout() -> None:
    done = run(ROOT, sys.executable, "scripts/release", "--check", current_version())
    assert done.returncode == 0, done.stdout


def test_check_fails_on_a_tag_that_differs() -> None:
    done = run(ROOT, sys.executable, "scripts/release", "--check", "v99.0.0")
    assert done.returncode == 1
    assert "do not say 99.0.0" in done.stdout


def test_release_bumps_every_place_commits_and_tags(repo: Path) -> None:
    done = run(repo, sys.executable, "scripts/release", "0.2.0")
    assert done.returncode == 0, done.stdout + done.stderr
    manifest = json.loads((repo / "custom_components/paged_llm/manifest.json").read_text())
    assert manifest["version"] == "0.2.0"
    assert any("paged-llm==0.2.0" in req for req in manifest["requirements"])
    assert 'version = "0.2.0"' in (repo / "pyproject.toml").read_text()
    # The add-on names the same release: its image's tag and the library it installs.
    assert 'version: "0.2.0"' in (repo / "addon/config.yaml").read_text()
    assert "ARG BUILD_VERSION=0.2.0\n" in (repo / "addon/Dockerfile").read_text()
    # The prebuilt kernels: the same release, and the extras pin that one (both extras).
    assert 'version = "0.2.0"' in (repo / "kernels_wheel/pyproject.toml").read_text()
    extras = tomllib.loads((repo / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    for extra in ("cpu", "engine"):
        pins = [req for req in extras[extra] if req.startswith("paged-llm-kernels")]
        assert pins == [pins[0]]
        assert pins[0].startswith("paged-llm-kernels==0.2.0;")
    assert run(repo, "git", "tag", "--list", "v0.2.0").stdout.strip() == "v0.2.0"
    assert run(repo, "git", "status", "--porcelain").stdout == ""
    assert run(repo, sys.executable, "scripts/release", "--check", "v0.2.0").returncode == 0


def test_check_catches_a_hand_edited_mismatch(repo: Path) -> None:
    path = repo / "pyproject.toml"
    path.write_text(
        path.read_text().replace(f'version = "{current_version()}"', 'version = "7.7.7"')
    )
    done = run(repo, sys.executable, "scripts/release", "--check", current_version())
    assert done.returncode == 1
    assert "BAD pyproject.toml version: 7.7.7" in done.stdout


def test_check_catches_kernels_of_another_release(repo: Path) -> None:
    """A kernels wheel of another version would be refused at load: the check says so first."""
    path = repo / "kernels_wheel" / "pyproject.toml"
    path.write_text(
        path.read_text().replace(f'version = "{current_version()}"', 'version = "7.7.7"')
    )
    done = run(repo, sys.executable, "scripts/release", "--check", current_version())
    assert done.returncode == 1
    assert "BAD kernels_wheel/pyproject.toml version: 7.7.7" in done.stdout


@pytest.mark.parametrize("version", ["1.2", "v", "1.2.3-beta", "latest"])
def test_release_refuses_a_malformed_version(repo: Path, version: str) -> None:
    done = run(repo, sys.executable, "scripts/release", version)
    assert done.returncode == 2
    assert "not a release version" in done.stdout


def test_release_refuses_a_dirty_tree_and_an_existing_tag(repo: Path) -> None:
    (repo / "pyproject.toml").write_text((repo / "pyproject.toml").read_text() + "\n")
    assert "uncommitted changes" in run(repo, sys.executable, "scripts/release", "0.3.0").stdout
    assert run(repo, "git", "checkout", "--", ".").returncode == 0
    assert run(repo, "git", "tag", "v0.3.0").returncode == 0
    done = run(repo, sys.executable, "scripts/release", "0.3.0")
    assert done.returncode == 1
    assert "exists already" in done.stdout


def test_release_workflow_checks_versions_before_publishing() -> None:
    flow = yaml.safe_load((WORKFLOWS / "release.yml").read_text())
    build = flow["jobs"]["build"]["steps"]
    assert any("scripts/release --check" in step.get("run", "") for step in build)
    publish = flow["jobs"]["publish"]
    # The library only after the prebuilt kernels its extras pin.
    assert publish["needs"] == ["build", "publish-kernels"]
    assert publish["permissions"] == {"id-token": "write"}
    assert "environment" in publish
    assert any(
        step.get("uses", "").startswith("pypa/gh-action-pypi-publish") for step in publish["steps"]
    )
    assert flow["jobs"]["github-release"]["needs"] == "publish"


def test_release_workflow_builds_tests_and_publishes_the_kernels_first() -> None:
    """cibuildwheel builds the kernels wheel in manylinux and musllinux images on x86_64 and
    aarch64 (QEMU), repairs, seals and tests each; PyPI gets them before the library."""
    flow = yaml.safe_load((WORKFLOWS / "release.yml").read_text())
    kernels = flow["jobs"]["kernels"]
    assert kernels["needs"] == "build"  # the versions are checked first
    assert set(kernels["strategy"]["matrix"]["arch"]) == {"x86_64", "aarch64"}
    steps = kernels["steps"]
    qemu = next(s for s in steps if s.get("uses", "").startswith("docker/setup-qemu-action"))
    assert "aarch64" in qemu["if"]
    cibw = next(s for s in steps if s.get("uses", "").startswith("pypa/cibuildwheel@"))
    assert cibw["with"]["package-dir"] == "kernels_wheel"
    assert cibw["env"]["CIBW_ARCHS_LINUX"] == "${{ matrix.arch }}"
    checks = " ".join(s.get("run", "") for s in steps)
    assert "manylinux" in checks
    assert "musllinux_1_2" in checks
    publish = flow["jobs"]["publish-kernels"]
    assert publish["needs"] == "kernels"
    assert publish["permissions"] == {"id-token": "write"}
    assert publish["environment"]["url"].endswith("/paged-llm-kernels/")
    assert any(
        s.get("uses", "").startswith("pypa/gh-action-pypi-publish") for s in publish["steps"]
    )
    # The wheel's own cibuildwheel settings: both C libraries, repaired, sealed and tested.
    wheel = tomllib.loads((ROOT / "kernels_wheel" / "pyproject.toml").read_text())
    cibw_config = wheel["tool"]["cibuildwheel"]
    for arch in ("x86_64", "aarch64"):
        assert cibw_config[f"manylinux-{arch}-image"].startswith("manylinux")
        assert cibw_config[f"musllinux-{arch}-image"].startswith("musllinux")
    assert "auditwheel repair" in cibw_config["repair-wheel-command"]
    assert "seal.py" in cibw_config["repair-wheel-command"]
    assert "check_wheel.py" in cibw_config["test-command"]
    assert "test_kernels_native" in cibw_config["test-command"]
    assert (
        wheel["project"]["version"]
        == tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    )


def test_validate_workflow_runs_hassfest_and_hacs_daily() -> None:
    flow = yaml.safe_load((WORKFLOWS / "validate.yml").read_text())
    triggers = flow[True]  # YAML 1.1 reads the key `on` as True
    assert {"push", "pull_request", "schedule"} <= set(triggers)
    uses = [step.get("uses", "") for job in flow["jobs"].values() for step in job["steps"]]
    assert any(u.startswith("home-assistant/actions/hassfest") for u in uses)
    hacs = [
        s
        for job in flow["jobs"].values()
        for s in job["steps"]
        if "hacs/action" in s.get("uses", "")
    ]
    assert hacs
    assert hacs[0]["with"]["category"] == "integration"
