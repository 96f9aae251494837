"""Every benchmark module imports in a plain Python, as ``scripts/bench`` runs it.

Inside pytest, tests/homeassistant_first.py has already bridged the test harness to this
Home Assistant release; a benchmark that needs the bridge and lacks it passes its tests
here and fails at ``scripts/bench``. Each import runs in a fresh interpreter instead.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODULES = sorted(
    path.stem for path in (ROOT / "benchmarks").glob("*.py") if not path.stem.startswith("_")
)


@pytest.mark.parametrize("module", MODULES)
def test_the_benchmark_imports_outside_pytest(module: str) -> None:
    """``import benchmarks.<module>`` in a fresh interpreter from the checkout."""
    done = subprocess.run(
        [sys.executable, "-c", f"import benchmarks.{module}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
