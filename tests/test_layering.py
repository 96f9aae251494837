"""The dependency rule, enforced: each layer imports in a process where the ones above it,
or torch, cannot be imported."""

from __future__ import annotations

import ast
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
    packages = [
        "paged_llm.protocol",
        "paged_llm.client",
        "paged_llm.kernels",
        "paged_llm.engine",
        "paged_llm.server",
    ]
    assert _import_all(packages, ["homeassistant", "custom_components"]) > 40


def test_kernels_import_nothing_from_the_engine() -> None:
    assert _import_all(["paged_llm.kernels"], ["paged_llm.engine"]) > 3


def test_client_and_protocol_need_no_torch_and_no_engine() -> None:
    blocked = ["torch", "transformers", "numpy", "paged_llm.engine", "paged_llm.kernels"]
    assert _import_all(["paged_llm", "paged_llm.protocol", "paged_llm.client"], blocked) >= 9


@pytest.mark.timeout(300)
def test_integration_loads_without_torch_or_the_engine() -> None:
    # What Home Assistant OS runs: every module of the integration imports, and nothing
    # of the engine or torch comes with it until the embedded backend is chosen.
    blocked = ["torch", "transformers", "paged_llm.engine", "paged_llm.kernels"]
    assert _import_all(["custom_components.paged_llm"], blocked) >= 15


# What a host (the server, the integration, the client) may import from the engine: its
# public module, which re-exports the facade (AsyncEngine, the shared front end) and the
# values that cross it.
FACADE = {"api"}
HOSTS = ["server", "client", "protocol", "custom_components/paged_llm"]
# Neither the hosts nor the benchmarks and developer commands reach past AsyncEngine.
OUTSIDE = [*HOSTS, "benchmarks", "scripts"]


def _sources(folders: list[str]) -> list[Path]:
    """The Python files under ``folders``."""
    return [p for folder in folders for p in sorted((ROOT / folder).rglob("*.py"))]


def _reach_throughs(path: Path) -> list[str]:
    """Where ``path`` reads the engine inside AsyncEngine (``x.engine.engine``, ``x._llm``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Attribute):
            continue
        inner = node.value
        receiver = getattr(inner, "attr", None) or getattr(inner, "id", "")
        if node.attr == "_llm" or (node.attr == "engine" and receiver.endswith("engine")):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def _engine_imports(path: Path) -> list[str]:
    """The engine modules ``path`` imports that are not part of the facade."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        for name in names:
            parts = name.split(".")
            if parts[:2] == ["paged_llm", "engine"] and len(parts) > 2 and parts[2] not in FACADE:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}")
    return found


def test_nothing_outside_the_engine_reaches_past_async_engine() -> None:
    sources = _sources(OUTSIDE)
    assert len(sources) > 50
    assert [hit for path in sources for hit in _reach_throughs(path)] == []


def test_hosts_import_only_the_engine_facade() -> None:
    assert [hit for path in _sources(HOSTS) for hit in _engine_imports(path)] == []


def test_the_reach_through_check_finds_one() -> None:
    probe = ROOT / "tests" / "_layering_probe.py"
    try:
        probe.write_text("host.engine.engine.scheduler\nengine.engine.trace\nengine._llm.x\n")
        assert len(_reach_throughs(probe)) == 3
        probe.write_text("from paged_llm.engine.core.scheduler import Scheduler\n")
        assert _engine_imports(probe) == [
            "tests/_layering_probe.py:1 paged_llm.engine.core.scheduler"
        ]
    finally:
        probe.unlink(missing_ok=True)
