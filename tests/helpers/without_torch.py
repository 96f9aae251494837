"""Code run in a fresh Python where torch and its kin cannot be imported.

``paged_llm.engine``'s own ``__init__`` still checks for the torch extra, so the engine's
packages are stood in for by bare package objects (their ``__path__`` only): what
importing them would give without that check. The modules under test then import as
they would in a process that never had torch.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# What the CPU path must never import.
BLOCKED = ("torch", "transformers", "triton", "xgrammar", "accelerate")
# The engine's packages whose __init__ would import torch: stood in for.
STUBS = ("engine", "engine/model")

_PRELUDE = """\
import importlib.abc, sys, types

BLOCKED = {blocked!r}


class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{{name}} is blocked in this test")
        return None


sys.meta_path.insert(0, Block())
for folder in {stubs!r}:
    package = types.ModuleType("paged_llm." + folder.replace("/", "."))
    package.__path__ = [{root!r} + "/" + folder]
    sys.modules[package.__name__] = package
"""
_LEAK_CHECK = """
leaked = sorted(n for n in sys.modules if n.split(".")[0] in BLOCKED)
assert not leaked, f"imported: {leaked}"
"""


def run_without_torch(
    code: str, blocked: tuple[str, ...] = BLOCKED, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` with ``blocked`` unimportable; it fails if any of them came in anyway."""
    prelude = _PRELUDE.format(blocked=blocked, stubs=STUBS, root=str(ROOT))
    script = prelude + textwrap.dedent(code) + _LEAK_CHECK
    return subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
