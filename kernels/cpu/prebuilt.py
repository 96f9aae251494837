"""The kernels prebuilt in the paged-llm-kernels wheel: find the build for this CPU, check it.

The wheel (kernels_wheel/) holds each library once per instruction-set level (x86-64,
x86-64-v3, AVX-VNNI, x86-64-v4, AVX-512 VNNI; armv8-a and armv8.2-a with dotprod), since
the C code picks its vector path when it is compiled, and a manifest.json naming, per
library: the digest of the sources it was built from, and per build its file, sha256 and the
CPU features it needs. A build is loaded only when its sources are this package's, its bytes
are the ones recorded, this CPU has every feature it needs, and the loaded library itself
reports the same features (paged_llm_cpu_needs); otherwise the caller builds locally.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

# The wheel's import name and its manifest's file name and format.
PACKAGE = "paged_llm_kernels"
MANIFEST = "manifest.json"
FORMAT = 1


class PrebuiltRefused(Exception):
    """A prebuilt library exists but must not be loaded here; the message says why."""


@dataclass(slots=True, frozen=True)
class Build:
    """One prebuilt library: its file, its bytes' sha256, the CPU features it needs."""

    variant: str
    path: Path
    sha256: str
    needs: tuple[str, ...]


def folder() -> Path | None:
    """Where the installed paged-llm-kernels wheel keeps its libraries, or None.

    Found without importing it (nothing of it runs before its files are checked).
    """
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def builds(where: Path, name: str, digest: str) -> list[Build]:
    """The builds of library name in the manifest at where, best first.

    Raises PrebuiltRefused when the manifest is unreadable, names no such library, or its
    library was built from other sources than digest (another version of paged-llm).
    """
    try:
        manifest = json.loads((where / MANIFEST).read_text())
        if manifest.get("format") != FORMAT:
            raise PrebuiltRefused(f"its {MANIFEST} is format {manifest.get('format')!r}")
        library = manifest["libraries"].get(name)
        if library is None:
            raise PrebuiltRefused(f"it holds no {name} library")
        if library["sources"] != digest:
            raise PrebuiltRefused(
                f"its {name} was built from other sources than this paged-llm's "
                f"(install the paged-llm-kernels of the same version)"
            )
        return [
            Build(b["variant"], where / b["file"], b["sha256"], tuple(b["needs"].split()))
            for b in library["builds"]
        ]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise PrebuiltRefused(f"its {MANIFEST} cannot be read: {err!r}") from err


def choose(candidates: list[Build], cpu: set[str]) -> Build:
    """The best build whose every needed feature this CPU has.

    Raises PrebuiltRefused naming what the least demanding build needs that the CPU lacks.
    """
    for build in candidates:
        if set(build.needs) <= cpu:
            return build
    if not candidates:
        raise PrebuiltRefused("it holds no build for this machine")
    least = candidates[-1]
    missing = " ".join(f for f in least.needs if f not in cpu)
    raise PrebuiltRefused(f"this CPU lacks {missing}, which even its {least.variant} build needs")


def verify(build: Build) -> None:
    """Raise PrebuiltRefused unless the file's bytes have the sha256 the manifest records."""
    try:
        actual = hashlib.sha256(build.path.read_bytes()).hexdigest()
    except OSError as err:
        raise PrebuiltRefused(f"{build.path.name} cannot be read: {err}") from err
    if actual != build.sha256:
        raise PrebuiltRefused(
            f"{build.path.name} is damaged or replaced (its sha256 is not the recorded one)"
        )


def open_build(build: Build) -> ctypes.CDLL:
    """Load a verified build and check that it reports the features its manifest records."""
    try:
        lib = ctypes.CDLL(str(build.path))
    except OSError as err:
        raise PrebuiltRefused(f"{build.path.name} does not load: {err}") from err
    try:
        report = lib.paged_llm_cpu_needs
    except AttributeError as err:
        raise PrebuiltRefused(f"{build.path.name} has no paged_llm_cpu_needs") from err
    report.restype = ctypes.c_char_p
    report.argtypes = []
    said = tuple((report() or b"").decode().split())
    if said != build.needs:
        raise PrebuiltRefused(
            f"{build.path.name} says it needs {' '.join(said) or 'nothing'}, "
            f"not the recorded {' '.join(build.needs) or 'nothing'}"
        )
    return lib


def find(name: str, digest: str, cpu: set[str], where: Path | None = None) -> Build:
    """The best prebuilt build of library name for this CPU, its bytes checked (not loaded).

    where defaults to the installed wheel's folder. Raises PrebuiltRefused saying why none
    can be used (the wheel missing included).
    """
    where = where if where is not None else folder()
    if where is None:
        raise PrebuiltRefused("the paged-llm-kernels package is not installed")
    build = choose(builds(where, name, digest), cpu)
    verify(build)
    return build


def load(name: str, digest: str, cpu: set[str], where: Path | None = None) -> ctypes.CDLL:
    """The best prebuilt build of library name for this CPU, checked and loaded."""
    return open_build(find(name, digest, cpu, where))


def cpu_features(flags_line: bytes) -> set[str]:
    """The feature names of /proc/cpuinfo's flags (x86) or Features (aarch64) line."""
    return set(flags_line.decode(errors="replace").partition(":")[2].split())
