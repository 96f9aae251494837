"""The dependency rule, enforced: each layer imports in a process where the ones above it,
or torch, cannot be imported."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers.without_torch import run_without_torch

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


# Where each import name's modules live in the checkout.
PACKAGE_DIRS = {
    "paged_llm": ROOT / "package",
    "paged_llm.client": ROOT / "client",
    "paged_llm.engine": ROOT / "engine",
    "paged_llm.kernels": ROOT / "kernels",
    "paged_llm.protocol": ROOT / "protocol",
    "paged_llm.server": ROOT / "server",
    "custom_components.paged_llm": ROOT / "custom_components" / "paged_llm",
}


def _modules() -> dict[str, Path]:
    """Every module of the library and the integration by its import name."""
    found: dict[str, Path] = {}
    for name, folder in PACKAGE_DIRS.items():
        for path in sorted(folder.rglob("*.py")):
            if name == "paged_llm" and path.parent != folder:
                continue  # package/ holds the root's own modules only
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([name, *parts])] = path
    return found


def _type_checking_only(tree: ast.Module) -> set[int]:
    """Line numbers of imports under ``if TYPE_CHECKING:``, which never run."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for inner in node.body:
                for sub in ast.walk(inner):
                    lines.add(getattr(sub, "lineno", 0))
    return lines


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules ``name`` imports at run time, at module level or inside a function."""
    tree = ast.parse(path.read_text(), str(path))
    skip = _type_checking_only(tree)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    edges: set[str] = set()
    for node in ast.walk(tree):
        if getattr(node, "lineno", 0) in skip:
            continue
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, *([base] if base else [])])
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        for target in targets:
            # The module itself, or the nearest package above it that is one of ours.
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                edges.add(target)
    return edges


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _import_graph() -> dict[str, set[str]]:
    """Module -> the modules it imports, packages' __init__ edges left out.

    A package's ``__init__`` runs before any of its modules, so ``a.b`` importing ``a``
    is no cycle; only module-to-module edges count.
    """
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    return {
        name: {t for t in targets if not name.startswith(t + ".")}
        for name, targets in graph.items()
    }


def test_no_import_cycles() -> None:
    graph = _import_graph()
    assert len(graph) > 120
    assert _cycles(graph) == []


def test_the_cycle_check_finds_one() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_the_torch_guard_fails_on_torch() -> None:
    # The guard the CPU path's tests run under: a blocked import is an error, not a pass.
    assert run_without_torch("import torch").returncode != 0
    assert run_without_torch("import json").returncode == 0
