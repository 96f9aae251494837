"""One native build for the CPU forward and the kernels it includes; their own as fallback."""

from __future__ import annotations

import ctypes
import subprocess
import tomllib
from pathlib import Path

import pytest

from paged_llm.kernels.cpu import attention as cpu_attention
from paged_llm.kernels.cpu import forward as cpu_forward
from paged_llm.kernels.cpu import gguf_matmul as gguf_kernels
from paged_llm.kernels.cpu import native_build

# The C files under src/ that are not part of the forward's library.
APART = {"cpu_quant.c", "gguf_kernels_test.c"}


def test_the_forward_includes_every_kernel_source() -> None:
    """Its build key sees every file the kernels are made of: a change to any rebuilds it."""
    src = native_build.FORWARD_SOURCE.parent
    parts = {p.resolve() for p in src.rglob("*.[ch]") if p.name not in APART}
    assert {cpu_forward.SOURCE, cpu_attention.SOURCE, gguf_kernels.SOURCE} <= parts
    assert {src / "gguf_kernels.h", src / "cpu_needs.h", src / "arch/x86/gguf_avx2.c"} <= parts
    assert set(native_build.included(native_build.FORWARD_SOURCE)) == parts


def test_the_package_ships_every_kernel_source() -> None:
    """pyproject.toml's package data names every file the builds read (arch/ folders too)."""
    root = Path(__file__).parents[2]
    data = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    globs = data["package-data"]["paged_llm.kernels.cpu"]
    package = native_build.FORWARD_SOURCE.parents[1]
    shipped = {p.resolve() for pattern in globs for p in package.glob(pattern)}
    src = native_build.FORWARD_SOURCE.parent
    assert {p.resolve() for p in src.rglob("*.[ch]")} <= shipped


@pytest.mark.skipif(
    cpu_forward.unavailable() is not None, reason=f"no C forward: {cpu_forward.unavailable()}"
)
def test_the_three_modules_share_the_forward_library() -> None:
    """A first start compiles the kernels' code once, as the forward's library."""
    shared = cpu_forward._LIBRARY.get()
    assert gguf_kernels._LIBRARY.get() is shared
    assert cpu_attention._LIBRARY.get() is shared
    assert Path(shared._name).name.startswith("cpu_forward-")


def test_without_the_forward_each_kernel_builds_alone(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A compiler that rejects the forward's code still gets the kernels it can build."""
    monkeypatch.setattr(native_build._FORWARD, "_state", (None, "building them failed"))
    built: list[tuple[Path, str]] = []

    def load(build_dir: Path, source: Path, name: str) -> tuple[ctypes.CDLL | None, str | None]:
        """Record the build instead of compiling."""
        built.append((source, name))
        return None, "no C compiler ($CC, cc, gcc or clang) on PATH"

    monkeypatch.setattr(native_build, "load", load)
    assert gguf_kernels.load_library(tmp_path) == (
        None,
        "no C compiler ($CC, cc, gcc or clang) on PATH",
    )
    assert cpu_attention.load_library(tmp_path)[0] is None
    assert built == [
        (gguf_kernels.SOURCE, "gguf_kernels"),
        (cpu_attention.SOURCE, "cpu_attention"),
    ]


def test_a_source_the_forward_does_not_include_builds_alone(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A test's or benchmark's copy of a kernel is its own build, never the forward's."""
    other = tmp_path / "other.c"
    other.write_text("int x;\n")
    monkeypatch.setattr(
        native_build, "forward", lambda build_dir: pytest.fail("the forward was built")
    )
    monkeypatch.setattr(native_build, "load", lambda *args: (None, f"built {args[1].name}"))
    assert native_build.load_part(tmp_path, other, "other") == (None, "built other.c")


@pytest.mark.skipif(native_build.find_compiler() is None, reason="no C compiler")
def test_code_that_fails_under_openmp_is_an_error_not_a_one_thread_build(tmp_path: Path) -> None:
    """Only a compiler without OpenMP builds without it; an error in the code is reported."""
    compiler = native_build.find_compiler()
    assert compiler is not None
    if not native_build.has_openmp(compiler):
        pytest.skip(f"{compiler} has no OpenMP")
    source = tmp_path / "broken.c"
    # Valid C, but an OpenMP loop directive must be followed by the loop itself.
    source.write_text(
        "void f(int *x) {\n#pragma omp for\n    int n = 4;\n"
        "    for (int i = 0; i < n; i++) x[i] = i;\n}\n"
    )
    with pytest.raises(subprocess.SubprocessError):
        native_build.build(compiler, tmp_path / "build", source, "broken")


def _tiny_source(tmp_path: Path) -> Path:
    """A one-function C file: quick to build."""
    source = tmp_path / "tiny.c"
    source.write_text("int tiny(int x) { return x + 1; }\n")
    return source


def test_an_unwritable_build_folder_is_a_reason_not_a_crash(tmp_path: Path) -> None:
    """The kernels cannot be built where the cache cannot be written: load says why.

    The tests run as root, for whom no mode bit forbids writing, so the folder sits under a
    plain file (mkdir fails with an OSError as it does for a read-only folder).
    """
    blocker = tmp_path / "cache"
    blocker.write_text("a file, not a folder")
    lib, reason = native_build.load(blocker / "kernels", _tiny_source(tmp_path), "tiny")
    assert lib is None
    assert reason is not None
    assert "failed" in reason
    assert blocker.read_text() == "a file, not a folder"


def test_a_build_cut_short_by_a_full_disk_leaves_no_partial_library(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """ "Full" is simulated: the compiler writes half its output, then fails with ENOSPC."""
    compiler = native_build.find_compiler()
    if compiler is None:
        pytest.skip("no C compiler")
    real_run = subprocess.run

    def full_disk(command: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        """The compile writes part of its output and stops as a full disk stops it."""
        if "-o" not in command:
            return real_run(command, **kwargs)  # type: ignore[call-overload,no-any-return]
        Path(command[command.index("-o") + 1]).write_bytes(b"\x7fELF half")
        return subprocess.CompletedProcess(command, 1, "", "No space left on device")

    monkeypatch.setattr(native_build.subprocess, "run", full_disk)
    build_dir = tmp_path / "kernels"
    lib, reason = native_build.load(build_dir, _tiny_source(tmp_path), "tiny")
    assert lib is None
    assert reason is not None
    assert "No space left on device" in reason
    # Nothing half-written stays to be loaded (or to fill the disk) later.
    assert list(build_dir.iterdir()) == []
    monkeypatch.setattr(native_build.subprocess, "run", real_run)
    lib, reason = native_build.load(build_dir, _tiny_source(tmp_path), "tiny")
    assert reason is None
    assert lib is not None
    assert lib.tiny(41) == 42


def test_a_failed_build_is_tried_again_at_the_next_load(tmp_path: Path) -> None:
    """A cache full or unwritable at the first load: fixed, the next model load builds."""
    blocker = tmp_path / "cache"
    blocker.write_text("a file, not a folder")
    source = _tiny_source(tmp_path)
    library = native_build.Library(
        "tiny", lambda _dir: native_build.load(blocker / "k", source, "tiny")
    )
    assert library.unavailable() is not None
    blocker.unlink()  # the user frees the folder
    assert library.unavailable() is not None  # remembered: no build per call
    native_build.retry_failed_builds()  # what each model load does first
    assert library.unavailable() is None
    assert library.get().tiny(1) == 2
    native_build.retry_failed_builds()  # a library that built is kept
    assert library.get().tiny(2) == 3
