"""The prebuilt kernels: loaded when they fit this CPU and pass their checks, else built here.

The prebuilt folder is made as the paged-llm-kernels wheel makes it (kernels_wheel/
build_libraries.py, the real compile), for the quant library at this machine's two least
demanding levels (the small source, so the test builds in seconds); each test damages its
own copy.
"""

from __future__ import annotations

import base64
import ctypes
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

from paged_llm.kernels.cpu import compiler, native_build, prebuilt

ROOT = Path(__file__).resolve().parents[2]
QUANT = native_build.FORWARD_SOURCE.with_name("cpu_quant.c")


def _wheel_module(name: str) -> ModuleType:
    """A script of kernels_wheel/, loaded by its path as the wheel's build loads it."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "kernels_wheel" / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


build_libraries = _wheel_module("build_libraries")
VARIANTS = compiler.VARIANTS.get(build_libraries.machine(), ())
pytestmark = pytest.mark.skipif(
    compiler.find_compiler() is None or not VARIANTS,
    reason="no C compiler, or no prebuilt builds for this machine",
)
CPU = prebuilt.cpu_features(compiler.cpu_flags())


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The quant library built as the wheel builds it, at the two least demanding levels."""
    out = tmp_path_factory.mktemp("paged_llm_kernels")
    build_libraries.write_libraries(out, {"cpu_quant": "src/cpu_quant.c"}, VARIANTS[-2:])
    return out


@pytest.fixture
def wheel(built: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of it, installed as the prebuilt folder; the fallback log forgotten."""
    copy = Path(shutil.copytree(built, tmp_path / "wheel"))
    monkeypatch.setattr(prebuilt, "folder", lambda: copy)
    monkeypatch.setattr(native_build, "_LOGGED", set())
    return copy


def no_compiler(monkeypatch: pytest.MonkeyPatch) -> None:
    """No C compiler on this machine, as in Home Assistant's containers."""
    monkeypatch.setattr(native_build, "find_compiler", lambda: None)


def manifest(wheel: Path) -> dict:
    """The folder's manifest.json."""
    return json.loads((wheel / "manifest.json").read_text())


def best_fit(wheel: Path) -> dict:
    """The manifest's entry for the build this CPU should get."""
    builds = manifest(wheel)["libraries"]["cpu_quant"]["builds"]
    return next(b for b in builds if set(b["needs"].split()) <= CPU)


def test_the_prebuilt_library_is_loaded_with_no_compiler(
    wheel: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The best build this CPU runs, passing its checks; nothing built, nothing written."""
    no_compiler(monkeypatch)
    lib, why = native_build.load(tmp_path / "build", QUANT, "cpu_quant")
    assert why is None
    assert lib is not None
    assert Path(lib._name) == wheel / best_fit(wheel)["file"]
    lib.quant_max_rows.restype = ctypes.c_int
    assert lib.quant_max_rows() == 64  # a real call into it
    assert not (tmp_path / "build").exists()


def test_the_recorded_needs_are_what_the_library_reports(wheel: Path) -> None:
    """The preprocessor's reading of cpu_needs.h at build time equals the built library's."""
    entry = best_fit(wheel)
    lib = ctypes.CDLL(str(wheel / entry["file"]))
    lib.paged_llm_cpu_needs.restype = ctypes.c_char_p
    assert lib.paged_llm_cpu_needs().decode() == entry["needs"]
    assert entry["needs"]  # every build needs at least its base (sse2, asimd)


def test_a_lesser_cpu_gets_the_lesser_build(wheel: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A CPU with only the least demanding build's features is given that build."""
    least = manifest(wheel)["libraries"]["cpu_quant"]["builds"][-1]
    monkeypatch.setattr(native_build, "cpu_flags", lambda: f"flags\t: {least['needs']}".encode())
    no_compiler(monkeypatch)
    lib, why = native_build.load(wheel / "unused", QUANT, "cpu_quant")
    assert why is None
    assert lib is not None
    assert Path(lib._name).name == least["file"]


def test_a_cpu_without_the_features_falls_back_logged_once(
    wheel: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """No build fits: the local build serves, and the reason is logged once per library."""
    real_flags = compiler.cpu_flags()
    prefix = real_flags.partition(b":")[0]
    monkeypatch.setattr(prebuilt, "cpu_features", lambda line: {"fpu", "vme"})
    caplog.set_level(logging.INFO, logger=native_build.__name__)
    for _ in range(2):
        lib, why = native_build.load(tmp_path / "build", QUANT, "cpu_quant")
        assert why is None
        assert lib is not None
        assert Path(lib._name).parent == tmp_path / "build"
    said = [r for r in caplog.records if "not using the prebuilt" in r.getMessage()]
    assert len(said) == 1
    assert "this CPU lacks" in said[0].getMessage()
    assert said[0].levelno == logging.WARNING
    assert prefix  # the real line has a name before its colon, as cpu_features expects


def test_a_cpu_without_the_features_and_no_compiler_says_both(
    wheel: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing can serve: the reason names the missing features and the missing compiler."""
    monkeypatch.setattr(prebuilt, "cpu_features", lambda line: set())
    no_compiler(monkeypatch)
    lib, why = native_build.load(tmp_path / "build", QUANT, "cpu_quant")
    assert lib is None
    assert why is not None
    assert "this CPU lacks" in why
    assert "no C compiler" in why


def test_a_damaged_library_is_refused_then_built_here(
    wheel: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """One flipped byte: refused by its sha256 before it is loaded; the local build serves."""
    path = wheel / best_fit(wheel)["file"]
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    lib, why = native_build.load(tmp_path / "build", QUANT, "cpu_quant")
    assert why is None
    assert lib is not None
    assert Path(lib._name).parent == tmp_path / "build"
    assert f"{path.name} is damaged or replaced" in caplog.text
    no_compiler(monkeypatch)
    monkeypatch.setattr(native_build, "_LOGGED", set())
    lib, why = native_build.load(tmp_path / "build", QUANT, "cpu_quant")
    assert lib is None
    assert why is not None
    assert "damaged or replaced" in why


def test_a_mislabelled_library_fails_its_self_check(
    wheel: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The best build's entry pointing at the lesser file (its sha256 too): the library's own
    report of the features it needs differs from the entry's, so it is refused."""
    data = manifest(wheel)
    builds = data["libraries"]["cpu_quant"]["builds"]
    best, least = builds[0], builds[-1]
    if best["needs"] == least["needs"]:
        pytest.skip("this machine's two builds need the same features")
    best["file"], best["sha256"] = least["file"], least["sha256"]
    (wheel / "manifest.json").write_text(json.dumps(data))
    monkeypatch.setattr(prebuilt, "cpu_features", lambda line: set(best["needs"].split()))
    no_compiler(monkeypatch)
    lib, why = native_build.load(wheel / "unused", QUANT, "cpu_quant")
    assert lib is None
    assert why is not None
    assert f"{least['file']} says it needs {least['needs']}, not the recorded" in why


def test_a_library_built_from_other_sources_is_refused(
    wheel: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another release's wheel (other sources) is never loaded for this library's code."""
    data = manifest(wheel)
    data["libraries"]["cpu_quant"]["sources"] = "0" * 64
    (wheel / "manifest.json").write_text(json.dumps(data))
    no_compiler(monkeypatch)
    lib, why = native_build.load(wheel / "unused", QUANT, "cpu_quant")
    assert lib is None
    assert why is not None
    assert "built from other sources than this paged-llm's" in why


@pytest.mark.parametrize("damage", ["not json", '{"format": 99}', '{"format": 1}'])
def test_an_unreadable_manifest_is_refused(
    wheel: Path, monkeypatch: pytest.MonkeyPatch, damage: str
) -> None:
    """A manifest that is not the format the loader knows is a reason, not an exception."""
    (wheel / "manifest.json").write_text(damage)
    no_compiler(monkeypatch)
    lib, why = native_build.load(wheel / "unused", QUANT, "cpu_quant")
    assert lib is None
    assert why is not None
    assert "manifest.json" in why


def test_no_writable_folder_for_a_local_build_is_a_clear_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No prebuilt kernels and a build folder that cannot be written: a reason, no crash."""
    monkeypatch.setattr(prebuilt, "folder", lambda: None)
    monkeypatch.setattr(native_build, "_LOGGED", set())
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    if os.access(locked, os.W_OK):  # root ignores the mode: let os.access answer as for others
        monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != locked / "kernels")
    library = native_build.Library(
        "quantized float32 CPU kernels", lambda d: native_build.load(d, QUANT, "cpu_quant")
    )
    why = library.unavailable(locked / "kernels")
    assert why is not None
    assert "the paged-llm-kernels package is not installed" in why
    assert "is not writable" in why
    assert str(locked / "kernels") in why
    with pytest.raises(RuntimeError, match="not writable"):
        library.get()


def test_seal_records_the_repaired_bytes(tmp_path: Path) -> None:
    """After auditwheel rewrote a library, the manifest and RECORD name its new bytes."""
    seal = _wheel_module("seal")
    wheel = tmp_path / "paged_llm_kernels-0.1.0-py3-none-manylinux_2_28_x86_64.whl"
    recorded = {
        "format": 1,
        "libraries": {
            "cpu_quant": {
                "sources": "x",
                "builds": [
                    {"variant": "v", "file": "cpu_quant-v.so", "sha256": "old", "needs": "sse2"}
                ],
            }
        },
    }
    record = "paged_llm_kernels-0.1.0.dist-info/RECORD"
    with zipfile.ZipFile(wheel, "w") as out:
        out.writestr("paged_llm_kernels/cpu_quant-v.so", b"repaired bytes")
        out.writestr("paged_llm_kernels/manifest.json", json.dumps(recorded))
        out.writestr(record, "stale\n")
    done = subprocess.run(
        [sys.executable, str(ROOT / "kernels_wheel" / "seal.py"), str(tmp_path)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert seal.MANIFEST == "paged_llm_kernels/manifest.json"
    with zipfile.ZipFile(wheel) as sealed:
        data = json.loads(sealed.read("paged_llm_kernels/manifest.json"))
        lines = sealed.read(record).decode().splitlines()
        manifest_bytes = sealed.read("paged_llm_kernels/manifest.json")
    build = data["libraries"]["cpu_quant"]["builds"][0]
    assert build["sha256"] == hashlib.sha256(b"repaired bytes").hexdigest()

    def entry(name: str, content: bytes) -> str:
        digest = base64.urlsafe_b64encode(hashlib.sha256(content).digest()).rstrip(b"=")
        return f"{name},sha256={digest.decode()},{len(content)}"

    assert entry("paged_llm_kernels/cpu_quant-v.so", b"repaired bytes") in lines
    assert entry("paged_llm_kernels/manifest.json", manifest_bytes) in lines
    assert lines[-1] == f"{record},,"


@pytest.mark.skipif(
    build_libraries.machine() == "aarch64" or not shutil.which("aarch64-linux-gnu-gcc"),
    reason="no aarch64 cross compiler here (apt-get install gcc-aarch64-linux-gnu)",
)
def test_a_cross_compiler_builds_its_own_machines_kernels(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """$CC=aarch64-linux-gnu-gcc on x86-64 (the add-on's aarch64 image): aarch64's builds."""
    monkeypatch.setenv("CC", "aarch64-linux-gnu-gcc")
    assert build_libraries.machine("aarch64-linux-gnu-gcc") == "aarch64"
    arm = compiler.VARIANTS["aarch64"]
    made = build_libraries.write_libraries(tmp_path, {"cpu_quant": "src/cpu_quant.c"}, arm[-1:])
    assert made["machine"] == "aarch64"
    (build,) = made["libraries"]["cpu_quant"]["builds"]
    assert build["needs"] == "asimd"
    header = (tmp_path / build["file"]).read_bytes()[:20]
    assert header[18:20] == (183).to_bytes(2, "little")  # e_machine: EM_AARCH64
