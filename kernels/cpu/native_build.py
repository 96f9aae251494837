"""Load the engine's C kernels (gguf_kernels.c, cpu_attention.c, ...): prebuilt, or built here.

The paged-llm-kernels wheel's build for this CPU is loaded first when it is installed and
passes its checks (prebuilt.py); otherwise, the reason logged once, each source is built
with ``$CC``, cc, gcc or clang (``-O3 -march=native``, OpenMP when
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
import errno
import hashlib
import logging
import os
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

from paged_llm.kernels.cpu import prebuilt
from paged_llm.kernels.cpu.compiler import (
    NATIVE,
    compile_library,
    cpu_flags,
    find_compiler,
    included,
    source_digest,
    sources,
)
from paged_llm.kernels.cpu.compiler import (
    has_openmp as has_openmp,
)

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


def kernels_unavailable() -> str | None:
    """Why the CPU forward's kernels could be neither loaded prebuilt nor built here, or None.

    Checked without loading or building anything (cheap: a manifest, one file's sha256 and
    a look for a compiler), for a host to say so before it installs or loads an engine.
    """
    try:
        prebuilt.find(
            "cpu_forward",
            source_digest(FORWARD_SOURCE),
            prebuilt.cpu_features(cpu_flags()),
        )
        return None
    except prebuilt.PrebuiltRefused as err:
        why_not_prebuilt = str(err)
    return None if find_compiler() is not None else _no_compiler(why_not_prebuilt)


def _no_compiler(why_not_prebuilt: str) -> str:
    """Why nothing can serve: no prebuilt library fits, and nothing can build one here."""
    return (
        f"no prebuilt kernels fit ({why_not_prebuilt}) and there is no C compiler "
        "($CC, cc, gcc or clang) on PATH to build them"
    )


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
    """The prebuilt ``name`` for this CPU if one fits, else a local build of ``source``.

    The prebuilt one comes from the paged-llm-kernels wheel, checked (sources, sha256,
    the CPU's features, the library's own report); where it is missing or refused, the
    reason is logged once and ``source`` is built here (once per source, compiler and CPU)
    as ``name-<key>.so``. Returns the library and None, or None and why not (no compiler,
    a failed build, no folder to build in), never raising.
    """
    try:
        lib = prebuilt.load(name, source_digest(source), prebuilt.cpu_features(cpu_flags()))
        _LOGGER.debug("loaded the prebuilt %s from %s", name, lib._name)
        return lib, None
    except prebuilt.PrebuiltRefused as err:
        why_not_prebuilt = str(err)
    _log_once(name, why_not_prebuilt)
    compiler = find_compiler()
    if compiler is None:
        return None, _no_compiler(why_not_prebuilt)
    try:
        path = build(compiler, build_dir, source, name)
    except OSError as err:
        if err.errno not in _NOT_WRITABLE:
            _LOGGER.warning("could not build %s: %s", source.name, err)
            return None, f"building them with {compiler} failed: {err}"
        return None, (
            f"no prebuilt kernels fit ({why_not_prebuilt}) and the folder to build them in "
            f"is not writable: {err.filename or build_dir} ({err.strerror})"
        )
    except subprocess.SubprocessError as err:
        _LOGGER.warning("could not build %s: %s", source.name, err)
        return None, f"building them with {compiler} failed: {err}"
    try:
        return ctypes.CDLL(str(path)), None
    except OSError as err:
        return None, f"the library built with {compiler} does not load: {err}"


# A build folder that cannot be written: no permission, or a read-only file system.
_NOT_WRITABLE = {errno.EACCES, errno.EPERM, errno.EROFS}

# Libraries whose fallback was logged: a reason is said once per process, not per load.
_LOGGED: set[str] = set()


def _log_once(name: str, why: str) -> None:
    """Say once per library why the prebuilt one is not used (the local build follows)."""
    if name in _LOGGED:
        return
    _LOGGED.add(name)
    # A missing wheel is a normal install (a developer's checkout); a refused one is not.
    level = logging.INFO if "not installed" in why else logging.WARNING
    _LOGGER.log(level, "not using the prebuilt %s kernels (%s): building them here", name, why)


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
    if not os.access(build_dir, os.W_OK):  # else the compiler's own message says it less well
        raise PermissionError(errno.EACCES, "permission denied", str(build_dir))
    compile_library(compiler, source, path, NATIVE)
    return path
