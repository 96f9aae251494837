"""Compile the engine's C kernels: the one compile used at run time and by the prebuilt wheel.

Standard library only, so the paged-llm-kernels wheel's build (kernels_wheel/setup.py) loads
this file by its path and compiles exactly as native_build.py does on a user's machine:
the same flags, only the target differs (``-march=native`` there, one instruction-set
level per library in the wheel).
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

# Where a build is only for the CPU it is made on.
NATIVE = ("-march=native",)

# The prebuilt wheel's builds per machine, best first: one per vector path the C code has
# (it picks its path when compiled), each loaded only on a CPU with every feature it needs.
VARIANTS: dict[str, tuple[tuple[str, tuple[str, ...]], ...]] = {
    "x86_64": (
        ("avx512-vnni", ("-march=x86-64-v4", "-mavx512vnni", "-mtune=generic")),
        ("x86-64-v4", ("-march=x86-64-v4", "-mtune=generic")),  # AVX-512 without VNNI
        ("avx-vnni", ("-march=x86-64-v3", "-mavxvnni", "-mtune=generic")),
        ("x86-64-v3", ("-march=x86-64-v3", "-mtune=generic")),  # AVX2, FMA, F16C
        ("x86-64", ("-march=x86-64", "-mtune=generic")),  # portable C, any x86-64
    ),
    "aarch64": (
        ("armv8.2-a-dotprod", ("-march=armv8.2-a+dotprod",)),  # Raspberry Pi 5, Green
        ("armv8-a", ("-march=armv8-a",)),  # NEON alone: Raspberry Pi 4
    ),
}


def find_compiler() -> str | None:
    """The C compiler to use: $CC, else the first of cc, gcc and clang on PATH."""
    names = [os.environ["CC"]] if os.environ.get("CC") else ["cc", "gcc", "clang"]
    return next((path for name in names if (path := shutil.which(name))), None)


def compile_library(compiler: str, source: Path, output: Path, target: Sequence[str]) -> None:
    """Compile source into the shared library output for target (e.g. ``-march=x86-64-v3``).

    Written beside output and renamed, so no reader ever finds half a library. Raises
    SubprocessError with the compiler's message when the build fails.
    """
    # -ffp-contract=off: each product is rounded as torch rounds it (clang would fuse it).
    base = [compiler, "-O3", *target, "-ffp-contract=off", "-shared", "-fPIC",
            "-std=c11", str(source), "-lm"]  # fmt: skip
    tmp = output.with_name(f"{output.name}.{os.getpid()}.partial")
    # OpenMP shares torch's runtime (the same libgomp); without it one core does the work.
    # Only a compiler without OpenMP builds without it: trying the plain build after any
    # failure once hid an OpenMP-only error in the code behind a one-thread library.
    extra = ["-fopenmp"] if has_openmp(compiler) else []
    try:
        done = subprocess.run(
            [*base, *extra, "-o", str(tmp)], capture_output=True, text=True, timeout=300
        )
        if done.returncode != 0:
            raise subprocess.SubprocessError(
                done.stderr.strip()[-500:] or f"exit {done.returncode}"
            )
        os.replace(tmp, output)
    except BaseException:
        # A build cut short (a full disk, a timeout) leaves no half-written library behind.
        tmp.unlink(missing_ok=True)
        raise


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


def cpu_needs(compiler: str, target: Sequence[str], source_dir: Path) -> str:
    """The CPU features a build for target needs, as src/cpu_needs.h names them.

    Read from the preprocessor, so it is what the library's own paged_llm_cpu_needs()
    returns once built with the same compiler and target.
    """
    probe = '#include "cpu_needs.h"\nPAGED_LLM_CPU_NEEDS\n'
    done = subprocess.run(
        [compiler, *target, "-E", "-P", "-x", "c", f"-I{source_dir}", "-"],
        input=probe, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    last = done.stdout.strip().splitlines()[-1]
    return "".join(re.findall(r'"([^"]*)"', last)).strip()


def source_digest(source: Path) -> str:
    """A sha256 of source and every file it includes: which code a library was built from."""
    digest = hashlib.sha256()
    for part in sources(source):
        digest.update(part)
    return digest.hexdigest()


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
