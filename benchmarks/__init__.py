"""The project's benchmarks, each a module run as ``python -m benchmarks NAME [options]``.

``scripts/bench [NAME] [options]`` runs the same with the checkout's .venv and no Hub access.
The package is not in the ``paged-llm`` wheel: it runs from a checkout, whose root
``python -m`` puts on the path (and pytest's ``pythonpath`` does for the tests).
"""

from __future__ import annotations

import argparse
from pathlib import Path

# The checkout: .cache/, bench_results/ and docs/img/ are found from here.
ROOT = Path(__file__).resolve().parents[1]


def argument_parser(name: str, description: str | None) -> argparse.ArgumentParser:
    """A benchmark's parser, whose usage line names the command that runs it.

    Under ``python -m`` argparse would name the program ``__main__.py`` (or leave out the
    benchmark's name), which tells a reader nothing.
    """
    prog = "scripts/bench [home]" if name == "home" else f"scripts/bench {name}"
    return argparse.ArgumentParser(prog=prog, description=description)
