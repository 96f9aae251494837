"""paged-llm as the benchmarks start it: the checkout's venv, or installed as a user installs it.

A user runs ``pip install 'paged-llm[cpu]'``: a wheel with bytecode, in a venv that holds its
dependencies and no more. The checkout's venv (``.venv``) is a developer's: an editable
install (its import finder runs at every start) beside Home Assistant's, transformers' and
test packages, some of which aiohttp picks up when present (aiodns and pycares: ~30 ms of
each start). ``user`` builds the checkout's wheel and installs it with the cpu extra's
requirements into ``.cache/bench-venv`` (the prebuilt kernels' wheel aside: the benchmarks
link kernels built once per run into every cache folder); ``checkout`` is ``.venv`` itself.
"""

from __future__ import annotations

import subprocess
import tomllib
from pathlib import Path

from . import ROOT

CHECKOUT = ROOT / ".venv" / "bin" / "paged-llm"
USER_VENV = ROOT / ".cache" / "bench-venv"
INSTALLS = ("user", "checkout")
# Installed by the kernels' own step (the benchmarks' prebuilt folder), not from an index.
_KERNELS_PACKAGE = "paged-llm-kernels"


def requirements() -> list[str]:
    """The library's requirements with the cpu extra's, as pyproject.toml lists them."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = [*project["dependencies"], *project["optional-dependencies"]["cpu"]]
    return [line for line in wanted if not line.startswith(_KERNELS_PACKAGE)]


def user_install() -> Path:
    """The checkout's wheel with the cpu extra's requirements in USER_VENV; its program.

    Rebuilt at every call (seconds, from uv's cache), so it is the checkout as it is now.
    """
    dist = USER_VENV / "dist"
    for old in dist.glob("*.whl"):
        old.unlink()
    subprocess.run(["uv", "build", "--wheel", "-q", "-o", str(dist), str(ROOT)], check=True)
    (wheel,) = dist.glob("paged_llm-*.whl")
    venv = USER_VENV / "venv"
    base = ROOT / ".venv" / "bin" / "python"
    subprocess.run(["uv", "venv", "-q", "--clear", "--python", str(base), str(venv)], check=True)
    python = ["--python", str(venv / "bin" / "python")]
    # uv compiles no bytecode unless told; pip does, and a wheel's start depends on it.
    install = ["uv", "pip", "install", "-q", "--compile-bytecode", *python]
    subprocess.run([*install, *requirements()], check=True)
    subprocess.run([*install, "--no-deps", str(wheel)], check=True)
    return venv / "bin" / "paged-llm"


def program(install: str) -> Path:
    """The ``paged-llm`` program of an install kind (INSTALLS)."""
    if install == "checkout":
        return CHECKOUT
    if install == "user":
        return user_install()
    raise ValueError(f"install must be one of {', '.join(INSTALLS)}, not {install!r}")
