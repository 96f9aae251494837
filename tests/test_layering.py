"""The dependency rule, enforced: each layer imports in a process where the ones above it,
or torch, cannot be imported."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Imports every module of the named packages with some top-level names made unimportable.
PROBE = textwrap.dedent(
    """
    import importlib, importlib.abc, pkgutil, sys

    BLOCKED = {blocked!r}

    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if any(name == b or name.startswith(b + ".") for b in BLOCKED):
                raise ImportError(f"{{name}} is blocked in this test")
            return None

    sys.meta_path.insert(0, Block())
    done = []
    for package in {packages!r}:
        module = importlib.import_module(package)
        done.append(package)
        for info in pkgutil.walk_packages(module.__path__, package + "."):
            if info.name.endswith("__main__"):
                continue
            importlib.import_module(info.name)
            done.append(info.name)
    leaked = sorted(n for n in sys.modules if any(n == b or n.startswith(b + ".") for b in BLOCKED))
    assert not leaked, leaked
    print(len(done))
    """
)


def _import_all(packages: list[str], blocked: list[str]) -> int:
    """Import every module of ``packages`` with ``blocked`` unimportable; count them."""
    result = subprocess.run(
        [sys.executable, "-c", PROBE.format(packages=packages, blocked=blocked)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return int(result.stdout.strip())


def test_library_imports_nothing_from_home_assistant() -> None:
    packages = ["paged_llm.protocol", "paged_llm.client", "paged_llm.kernels", "paged_llm.engine"]
    assert _import_all(packages, ["homeassistant", "custom_components"]) > 30


def test_kernels_import_nothing_from_the_engine() -> None:
    assert _import_all(["paged_llm.kernels"], ["paged_llm.engine"]) > 3


def test_client_and_protocol_need_no_torch_and_no_engine() -> None:
    blocked = ["torch", "transformers", "numpy", "paged_llm.engine", "paged_llm.kernels"]
    assert _import_all(["paged_llm.protocol", "paged_llm.client"], blocked) >= 6


@pytest.mark.timeout(300)
def test_integration_loads_without_torch_or_the_engine() -> None:
    # What Home Assistant OS runs: every module of the integration imports, and nothing
    # of the engine or torch comes with it until the embedded backend is chosen.
    blocked = ["torch", "transformers", "paged_llm.engine", "paged_llm.kernels"]
    assert _import_all(["custom_components.paged_llm"], blocked) >= 15
