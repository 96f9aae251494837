"""Build and load the engine's C kernels (gguf_kernels.c, cpu_attention.c, ...) on this machine.

Each source is built with ``$CC``, cc, gcc or clang (``-O3 -march=native``, OpenMP when
the compiler has it, sharing torch's runtime) into a cache folder, keyed by the source,
the compiler and the CPU, so a build is made once and never loaded on a CPU it was not
made for. Loading says why it could not happen instead of raising: the engine then takes
its torch path.

cpu_forward.c includes gguf_kernels.c (with the header and the portable and per-arch
files it is made of, src/arch/) and cpu_attention.c, so its one library exports every
function of the two: :func:`forward` builds it once per process and the three
modules take their functions from it. A first start then compiles that code once, not
three times (seconds each on a small machine).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

_LOGGER = logging.getLogger(__name__)


def default_build_dir() -> Path:
    """Where libraries are built when no folder is given: the user's own cache folder.

    Not a shared temp folder: another user could leave a library there to be loaded.
    """
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "paged-llm" / "kernels"


# Every library made, so a new model load can retry the builds that failed.
_LIBRARIES: list[Library] = []


class Library:
    """One of the engine's C libraries: built and loaded by the first caller, once per process."""

    def __init__(
        self, what: str, load_library: Callable[[Path], tuple[ctypes.CDLL | None, str | None]]
    ) -> None:
        """``what`` names it in errors; ``load_library(build_dir)`` builds and loads it."""
        self._what = what
        self._load_library = load_library
        self._lock = threading.Lock()
        # (library, why not) once the first caller tried to load it.
        self._state: tuple[ctypes.CDLL | None, str | None] | None = None
        _LIBRARIES.append(self)

    def forget_failure(self) -> None:
        """Let the next use try the build again if the last try failed (a full disk, say)."""
        with self._lock:
            if self._state is not None and self._state[0] is None:
                self._state = None

    def unavailable(self, build_dir: Path | None = None) -> str | None:
        """Why it cannot run here (no compiler, a failed build), or None when it can.

        The first call builds and loads it, in build_dir (the user's cache folder when
        None); later calls answer from that attempt.
        """
        state = self._state  # the per-call path (every layer asks): no lock once tried
        if state is None:
            with self._lock:
                if self._state is None:
                    self._state = self._load_library(build_dir or default_build_dir())
                state = self._state
        return state[1]

    def get(self) -> ctypes.CDLL:
        """The loaded library, or a RuntimeError saying why there is none."""
        reason = self.unavailable()
        if reason is not None:
            raise RuntimeError(f"the {self._what} are unavailable: {reason}")
        assert self._state is not None
        assert self._state[0] is not None
        return self._state[0]


def retry_failed_builds() -> None:
    """Let each library whose build failed try again at its next use: a new model load.

    A cache folder that was full or unwritable at the first load is often fixed by the
    time the user reloads; without this only a restart of the process built them.
    """
    for library in list(_LIBRARIES):
        library.forget_failure()


FORWARD_SOURCE = Path(__file__).parent / "src" / "cpu_forward.c"
# The forward library, built by the first of the three modules that asks for it.
_FORWARD = Library(
    "CPU forward kernels", lambda build_dir: load(build_dir, FORWARD_SOURCE, "cpu_forward")
)


def forward(build_dir: Path) -> tuple[ctypes.CDLL | None, str | None]:
    """The library of cpu_forward.c (gguf_kernels.c and cpu_attention.c included), or why not.

    Built and loaded once per process, in the first caller's build_dir; each module sets
    the argument types of its own functions on the one library.
    """
    reason = _FORWARD.unavailable(build_dir)
    return (None, reason) if reason is not None else (_FORWARD.get(), None)


def load_part(build_dir: Path, source: Path, name: str) -> tuple[ctypes.CDLL | None, str | None]:
    """A library with ``source``'s functions: the forward library when it includes source.

    Where the forward does not build (a compiler that rejects its code), or for a source
    it does not include (a test's copy), source is built alone as ``name-<key>.so``.
    """
    if source.resolve() in included(FORWARD_SOURCE):
        lib, reason = forward(build_dir)
        if lib is not None:
            return lib, None
        _LOGGER.info("building %s alone: the CPU forward is unavailable (%s)", source.name, reason)
    return load(build_dir, source, name)


def load(build_dir: Path, source: Path, name: str) -> tuple[ctypes.CDLL | None, str | None]:
    """Build ``source`` (once per source, compiler and CPU) as ``name-<key>.so`` and load it.

    Returns the library and None, or None and why not (no compiler, a failed build).
    """
    compiler = find_compiler()
    if compiler is None:
        return None, "no C compiler ($CC, cc, gcc or clang) on PATH"
    try:
        path = build(compiler, build_dir, source, name)
        return ctypes.CDLL(str(path)), None
    except (OSError, subprocess.SubprocessError) as err:
        _LOGGER.warning("could not build %s: %s", source.name, err)
        return None, f"building them with {compiler} failed: {err}"


def find_compiler() -> str | None:
    """The C compiler to use: $CC, else the first of cc, gcc and clang on PATH."""
    names = [os.environ["CC"]] if os.environ.get("CC") else ["cc", "gcc", "clang"]
    return next((path for name in names if (path := shutil.which(name))), None)


def build(compiler: str, build_dir: Path, source: Path, name: str) -> Path:
    """Compile source into build_dir unless a build for this compiler and CPU exists."""
    version = subprocess.run(
        [compiler, "--version"], capture_output=True, text=True, check=True, timeout=30
    ).stdout
    key = hashlib.sha256()
    for part in (*sources(source), compiler.encode(), version.encode(), cpu_flags()):
        key.update(part)
    path = build_dir / f"{name}-{key.hexdigest()[:16]}.so"
    if path.is_file():
        return path
    build_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    # -ffp-contract=off: each product is rounded as torch rounds it (clang would fuse it).
    base = [compiler, "-O3", "-march=native", "-ffp-contract=off", "-shared", "-fPIC",
            "-std=c11", str(source), "-lm"]  # fmt: skip
    tmp = path.with_name(f"{path.name}.{os.getpid()}.partial")
    # OpenMP shares torch's runtime (the same libgomp); without it one core does the work.
    # Only a compiler without OpenMP builds without it: trying the plain build after any
    # failure once hid an OpenMP-only error in the code behind a one-thread library.
    extra = ["-fopenmp"] if has_openmp(compiler) else []
    try:
        done = subprocess.run(
            [*base, *extra, "-o", str(tmp)], capture_output=True, text=True, timeout=120
        )
        if done.returncode != 0:
            raise subprocess.SubprocessError(
                done.stderr.strip()[-500:] or f"exit {done.returncode}"
            )
        os.replace(tmp, path)
    except BaseException:
        # A build cut short (a full disk, a timeout) leaves no half-written library behind.
        tmp.unlink(missing_ok=True)
        raise
    return path


@functools.cache
def has_openmp(compiler: str) -> bool:
    """Whether ``compiler`` builds a shared library with -fopenmp (a tiny one, once)."""
    with tempfile.TemporaryDirectory(prefix="paged-llm-openmp-") as tmp:
        source = Path(tmp) / "probe.c"
        source.write_text("#include <omp.h>\nint threads(void) { return omp_get_max_threads(); }\n")
        command = [compiler, "-fopenmp", "-shared", "-fPIC", str(source), "-o", f"{tmp}/probe.so"]
        try:
            done = subprocess.run(command, capture_output=True, timeout=60)
        except (OSError, subprocess.SubprocessError):
            return False
        return done.returncode == 0


def sources(source: Path) -> list[bytes]:
    """The bytes of source and of every file it includes with quotes, at any depth.

    A library built from one file that includes others (cpu_forward.c) is rebuilt when
    any of them changes.
    """
    return [path.read_bytes() for path in included(source)]


def included(source: Path) -> list[Path]:
    """Source and every file it includes with quotes, at any depth (resolved paths)."""
    seen: list[Path] = []
    todo = [source.resolve()]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.append(path)
        for line in path.read_text().splitlines():
            if line.startswith('#include "'):  # relative to the including file, as cc reads it
                todo.append((path.parent / line.split('"')[1]).resolve())
    return seen


def cpu_flags() -> bytes:
    """The CPU's feature flags (a build with -march=native is only good for them)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return b""
    flags = (line for line in text.splitlines() if line.startswith(("flags", "Features")))
    return next(flags, "").encode()
