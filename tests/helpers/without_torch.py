"""Code run in a fresh Python where torch and its kin cannot be imported.

A finder put first on ``sys.meta_path`` refuses them, so the modules under test import as
they would in a process that never had torch, and the script fails if any came in anyway.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# What the CPU path must never import.
BLOCKED = ("torch", "transformers", "triton", "xgrammar", "accelerate")

_PRELUDE = """\
import importlib.abc, sys

BLOCKED = {blocked!r}


class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{{name}} is blocked in this test")
        return None


sys.meta_path.insert(0, Block())
"""
_LEAK_CHECK = """
leaked = sorted(n for n in sys.modules if n.split(".")[0] in BLOCKED)
assert not leaked, f"imported: {leaked}"
"""


def run_without_torch(
    code: str, blocked: tuple[str, ...] = BLOCKED, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` with ``blocked`` unimportable; it fails if any of them came in anyway."""
    prelude = _PRELUDE.format(blocked=blocked)
    script = prelude + textwrap.dedent(code) + _LEAK_CHECK
    return subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


_REPORT = """
import atexit, json


@atexit.register
def _report():
    leaked = sorted(n for n in sys.modules if n.split(".")[0] in BLOCKED)
    with open({report!r}, "w") as out:
        json.dump(leaked, out)


"""


def blocking_entry_point(
    script: Path, report: Path, main: str, blocked: tuple[str, ...] = BLOCKED
) -> Path:
    """An executable ``script`` running ``main`` (code ending in its call) with ``blocked``
    unimportable, which writes at exit the names of them in ``sys.modules`` to ``report``
    (JSON): for processes the tests start and talk to, such as a server or Home Assistant.
    """
    text = f"#!{sys.executable}\n" + _PRELUDE.format(blocked=blocked)
    script.write_text(text + _REPORT.format(report=str(report)) + textwrap.dedent(main))
    script.chmod(0o755)
    return script
