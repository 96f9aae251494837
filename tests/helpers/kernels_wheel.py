"""A paged-llm-kernels wheel for this machine, built by kernels_wheel/ as a release builds it.

Only the best build this CPU runs (a release holds one per instruction-set level and takes
minutes): for tests that install the library with its extras from a folder of wheels, as
Home Assistant does, where the extras' pin must be found. Kept in the test cache per sources.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

from paged_llm.kernels.cpu import compiler, prebuilt
from tests.helpers.support import CACHE, ROOT

PROJECT = ROOT / "kernels_wheel"
SOURCES = ROOT / "kernels" / "cpu" / "src"


def best_variant() -> str | None:
    """The most capable prebuilt build this CPU runs, or None (no compiler, other machine)."""
    cc = compiler.find_compiler()
    machine = {"amd64": "x86_64", "arm64": "aarch64"}.get(platform.machine().lower())
    variants = compiler.VARIANTS.get(machine or platform.machine().lower(), ())
    if cc is None:
        return None
    cpu = prebuilt.cpu_features(compiler.cpu_flags())
    for name, target in variants:
        if set(compiler.cpu_needs(cc, target, SOURCES).split()) <= cpu:
            return name
    return None


def _key(variant: str) -> str:
    """What the wheel is built from: the kernels' sources, the build's files, the build."""
    digest = hashlib.sha256(variant.encode())
    for source in ("cpu_forward.c", "cpu_quant.c"):
        digest.update(compiler.source_digest(SOURCES / source).encode())
    for path in [*sorted(PROJECT.rglob("*.py")), PROJECT / "pyproject.toml"]:
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def kernels_wheel() -> Path | None:
    """The kernels wheel for this CPU (built once per sources), or None where none can be."""
    variant = best_variant()
    if variant is None:
        return None
    folder = CACHE.parent / "wheels" / f"paged-llm-kernels-{_key(variant)}"
    found = sorted(folder.glob("paged_llm_kernels-*.whl"))
    if found:
        return found[0]
    uv = shutil.which("uv")
    assert uv is not None, "uv is needed (scripts/setup installs it)"
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "PAGED_LLM_KERNELS_VARIANTS": variant}
        subprocess.run(
            [uv, "build", "--quiet", "--wheel", "--out-dir", tmp, str(PROJECT)],
            check=True,
            env=env,
            capture_output=True,
        )
        (built,) = Path(tmp).glob("paged_llm_kernels-*.whl")
        folder.mkdir(parents=True, exist_ok=True)
        partial = folder / (built.name + ".part")
        shutil.copyfile(built, partial)
        partial.rename(folder / built.name)
    return folder / built.name
