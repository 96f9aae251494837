"""The image's check of its prebuilt kernels (paged_llm_addon/kernels.py), which its build runs.

On a paged-llm-kernels wheel built here as a release builds it (this CPU's best build only,
tests/helpers/kernels_wheel.py), unpacked; each test damages its own copy.
"""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path

import pytest

from paged_llm.kernels.cpu import prebuilt
from paged_llm_addon import kernels
from tests.helpers.kernels_wheel import kernels_wheel


@pytest.fixture(scope="module")
def unpacked(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel's paged_llm_kernels folder, unpacked once."""
    wheel = kernels_wheel()
    if wheel is None:
        pytest.skip("no C compiler, or no prebuilt builds for this machine")
    out = tmp_path_factory.mktemp("wheel")
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(out)
    return out / prebuilt.PACKAGE


@pytest.fixture
def where(unpacked: Path, tmp_path: Path) -> Path:
    """A copy of the unpacked folder for one test to change."""
    return Path(shutil.copytree(unpacked, tmp_path / prebuilt.PACKAGE))


def _manifest(where: Path) -> dict:
    """The folder's manifest.json."""
    return json.loads((where / prebuilt.MANIFEST).read_text())


def test_every_library_loads_from_the_wheel(where: Path) -> None:
    builds = {
        name: library["builds"][0]["file"]
        for name, library in _manifest(where)["libraries"].items()
    }
    assert kernels.check(where) == [builds["cpu_forward"], builds["cpu_quant"]]


def test_a_damaged_build_for_another_cpu_is_found(where: Path) -> None:
    """The image runs on other CPUs than the one that builds it: every build is checked."""
    manifest = _manifest(where)
    forward = manifest["libraries"]["cpu_forward"]
    other = dict(forward["builds"][0], variant="other", file="cpu_forward-other.so")
    other["needs"] = "a-feature-no-cpu-has"
    forward["builds"].insert(0, other)  # best first: this CPU skips it
    (where / other["file"]).write_bytes(b"not the recorded bytes")
    (where / prebuilt.MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(kernels.KernelsError) as err:
        kernels.check(where)
    assert str(err.value) == (
        "the prebuilt cpu_forward kernels cannot be used: cpu_forward-other.so is damaged "
        "or replaced (its sha256 is not the recorded one)"
    )


def test_kernels_of_other_sources_are_refused(where: Path) -> None:
    manifest = _manifest(where)
    manifest["libraries"]["cpu_quant"]["sources"] = "0" * 64
    (where / prebuilt.MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(kernels.KernelsError, match="cpu_quant kernels cannot be used: its "):
        kernels.check(where)


def test_a_cpu_no_build_fits_is_named(where: Path) -> None:
    if not _manifest(where)["libraries"]["cpu_forward"]["builds"][0]["needs"]:
        pytest.skip("this CPU's best build is the portable one, which every CPU runs")
    with pytest.raises(kernels.KernelsError, match="this CPU lacks"):
        kernels.check(where, cpu=set())


def test_without_the_wheel_it_says_so(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(prebuilt, "folder", lambda: None)
    assert kernels.main() == 1
    assert capsys.readouterr().err == (
        "paged-llm-addon: error: the paged-llm-kernels package is not installed\n"
    )
