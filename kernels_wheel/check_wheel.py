"""Check an installed paged-llm-kernels wheel: every library loads from it, no compiler allowed.

Run (with python -P, so this folder's own paged_llm_kernels/ does not shadow the installed
one) by cibuildwheel in a clean environment with the wheel and paged-llm (no dependencies)
installed; exits non-zero naming the library that did not come from the wheel.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from paged_llm.kernels.cpu import native_build, prebuilt

LIBRARIES = {
    "cpu_forward": native_build.FORWARD_SOURCE,
    "cpu_quant": native_build.FORWARD_SOURCE.with_name("cpu_quant.c"),
}


def main() -> int:
    """Load each library as the engine does, with local builds made impossible."""
    native_build.find_compiler = lambda: None  # a local build must not hide a broken wheel
    where = prebuilt.folder()
    if where is None:
        print("check_wheel: paged_llm_kernels is not installed")
        return 1
    failed = 0
    with tempfile.TemporaryDirectory() as build_dir:
        for name, source in LIBRARIES.items():
            lib, why = native_build.load(Path(build_dir), source, name)
            if lib is None or Path(lib._name).parent != where:
                print(f"check_wheel: {name} did not load from the wheel: {why}")
                failed += 1
                continue
            print(f"check_wheel: {name}: {Path(lib._name).name}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
