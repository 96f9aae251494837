"""Compile the paged-llm-kernels libraries once per instruction-set level and write the manifest.

The compile is the library's own (kernels/cpu/compiler.py, loaded by its path: it needs only
the standard library), with a portable target per build instead of -march=native. The
manifest.json written beside the libraries names, per library, the digest of the sources it
was built from, and per build its file, sha256 and the CPU features it needs. setup.py runs
it inside the wheel's build; tests run it for a few builds.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import platform
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).resolve().parent
# The library's kernels (this folder sits beside them in the repository).
KERNELS = Path(os.environ.get("PAGED_LLM_KERNELS_SOURCE", HERE.parent / "kernels" / "cpu"))
# The libraries the engine loads: forward (with the GGUF and attention kernels) and quant.
LIBRARIES = {"cpu_forward": "src/cpu_forward.c", "cpu_quant": "src/cpu_quant.c"}
MANIFEST_FORMAT = 1
# Names of the builds to make (space-separated), where not all of this machine's are wanted.
VARIANTS_ENV = "PAGED_LLM_KERNELS_VARIANTS"


class BuildError(Exception):
    """The libraries cannot be built here (no compiler, an unknown machine)."""


def compiler_module() -> ModuleType:
    """kernels/cpu/compiler.py, loaded by its path (the library need not be installed)."""
    spec = importlib.util.spec_from_file_location("paged_llm_compiler", KERNELS / "compiler.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def machine(compiler: str | None = None) -> str:
    """The machine compiler builds for (this one without it), as compiler.VARIANTS keys it.

    Asked of the compiler (``-dumpmachine``), so a cross compiler given as $CC (the add-on's
    aarch64 image, built on an x86-64 machine) makes its own machine's builds.
    """
    name = platform.machine()
    if compiler is not None:
        try:
            done = subprocess.run(
                [compiler, "-dumpmachine"], capture_output=True, text=True, timeout=30
            )
        except (OSError, subprocess.SubprocessError):
            done = None
        if done is not None and done.returncode == 0 and done.stdout.strip():
            name = done.stdout.strip().split("-")[0]
    name = name.lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(name, name)


def write_libraries(
    out: Path,
    libraries: dict[str, str] = LIBRARIES,
    variants: tuple[tuple[str, tuple[str, ...]], ...] | None = None,
) -> dict:
    """Compile libraries for every build into out and write the manifest.

    The builds default to those of the machine the compiler builds for. Returns the
    manifest. Raises BuildError without a compiler or builds for that machine.
    """
    compiler_py = compiler_module()
    compiler = compiler_py.find_compiler()
    if compiler is None:
        raise BuildError("no C compiler ($CC, cc, gcc or clang) on PATH")
    target = machine(compiler)
    if variants is None:
        variants = compiler_py.VARIANTS.get(target)
        if variants is None:
            raise BuildError(f"no builds are defined for {target}")
        # A wheel for one machine only (tests that install it): the builds named, best first.
        if only := os.environ.get(VARIANTS_ENV, "").split():
            variants = tuple(v for v in variants if v[0] in only)
            if not variants:
                raise BuildError(f"{VARIANTS_ENV}={' '.join(only)} names no build of {target}")
    out.mkdir(parents=True, exist_ok=True)

    def build(job: tuple[str, str, tuple[str, ...]]) -> None:
        """Compile one library for one build."""
        lib, variant, target = job
        output = out / f"{lib}-{variant}.so"
        compiler_py.compile_library(compiler, KERNELS / libraries[lib], output, target)
        print(f"paged-llm-kernels: built {output.name}", flush=True)

    jobs = [(lib, variant, target) for lib in libraries for variant, target in variants]
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        list(pool.map(build, jobs))
    manifest = {
        "format": MANIFEST_FORMAT,
        "machine": target,
        "libraries": {
            lib: {
                "sources": compiler_py.source_digest(KERNELS / source),
                "builds": [
                    {
                        "variant": variant,
                        "file": f"{lib}-{variant}.so",
                        "sha256": sha256(out / f"{lib}-{variant}.so"),
                        "needs": compiler_py.cpu_needs(compiler, target, KERNELS / "src"),
                    }
                    for variant, target in variants
                ],
            }
            for lib, source in libraries.items()
        },
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def sha256(path: Path) -> str:
    """The hex sha256 of a file's bytes."""
    return hashlib.sha256(path.read_bytes()).hexdigest()
