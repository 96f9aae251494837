"""``python -m benchmarks [NAME] [options]``: a benchmark by name, the home workload by default."""

from __future__ import annotations

import ast
import importlib
import sys
from collections.abc import Sequence
from pathlib import Path

# The modules with a command line; the others (workload, runners, experiments, machine,
# report, server) are parts of the home benchmark and the GGUF comparison.
COMMANDS = (
    "home",
    "block_map",
    "cpu_attention",
    "cpu_quant",
    "evaluate",
    "gguf",
    "gguf_kernels",
    "gguf_models",
    "home_commands",
    "kernels",
    "llama_cpp",
    "models",
    "profile_step",
    "scheduler",
    "soak",
    "structured",
    "two_engines",
    "weights",
)
# What runs with no name, or with options first: ``scripts/bench --quick`` as it always did.
DEFAULT = "home"


def summary(name: str) -> str:
    """The first line of a benchmark's docstring, read, not imported (torch takes seconds)."""
    source = (Path(__file__).parent / f"{name}.py").read_text()
    doc = ast.get_docstring(ast.parse(source)) or ""
    return doc.splitlines()[0] if doc else ""


def overview() -> str:
    """The list of benchmarks, for ``--help`` without a name."""
    width = max(map(len, COMMANDS))
    lines = [
        "usage: scripts/bench [NAME] [options]  (or: python -m benchmarks [NAME] [options])",
        "",
        "benchmarks:",
        *(f"  {name:<{width}}  {summary(name)}" for name in COMMANDS),
        "",
        f"Without NAME (or with options first) it runs {DEFAULT}; "
        "`scripts/bench NAME --help` shows a benchmark's options.",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the named benchmark's ``main`` with the remaining arguments; its exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    name, rest = (args[0], args[1:]) if args and not args[0].startswith("-") else (DEFAULT, args)
    if name not in COMMANDS:
        print(
            f"benchmarks: there is no benchmark {name!r}; the names are: {', '.join(COMMANDS)}",
            file=sys.stderr,
        )
        return 2
    if args[:1] in (["-h"], ["--help"]):
        # No name given: say what else there is before the default benchmark's options.
        print(overview() + f"\n\nThe {DEFAULT} benchmark's options:\n", flush=True)
    module = importlib.import_module(f"{__package__}.{name}")
    status: int | None = module.main(rest)
    return status or 0


if __name__ == "__main__":
    sys.exit(main())
