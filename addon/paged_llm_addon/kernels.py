"""The prebuilt kernels the image carries: every build whole, this CPU's build loaded.

The image has no C compiler (nor has Home Assistant OS): the engine's C kernels come from
the paged-llm-kernels wheel, one build per instruction-set level, and where none of them
can be used the add-on stops with the reason instead of building one. The image's build
runs this (``python3 -m paged_llm_addon.kernels``), so no image is made whose prebuilt
kernels are missing, damaged, or built from other sources than its library's.
"""

from __future__ import annotations

import sys
from pathlib import Path

from paged_llm.kernels.cpu import compiler, native_build, prebuilt

# The libraries the engine loads, by their manifest names, and the sources they must match.
LIBRARIES = {
    "cpu_forward": native_build.FORWARD_SOURCE,
    "cpu_quant": native_build.FORWARD_SOURCE.with_name("cpu_quant.c"),
}


class KernelsError(Exception):
    """The prebuilt kernels cannot serve here; the message says which and why."""


def check(where: Path | None = None, cpu: set[str] | None = None) -> list[str]:
    """Check every build of each library and load the one this CPU gets; their file names.

    where defaults to the installed wheel's folder, cpu to this machine's features. Every
    build is checked, not only this CPU's: the image runs on other CPUs than the one it is
    built on. Raises KernelsError naming the library and the reason.
    """
    where = where if where is not None else prebuilt.folder()
    if where is None:
        raise KernelsError("the paged-llm-kernels package is not installed")
    cpu = cpu if cpu is not None else prebuilt.cpu_features(compiler.cpu_flags())
    loaded = []
    for name, source in LIBRARIES.items():
        try:
            builds = prebuilt.builds(where, name, compiler.source_digest(source))
            for build in builds:
                prebuilt.verify(build)
            lib = prebuilt.open_build(prebuilt.choose(builds, cpu))
        except prebuilt.PrebuiltRefused as err:
            raise KernelsError(f"the prebuilt {name} kernels cannot be used: {err}") from err
        loaded.append(Path(lib._name).name)
    return loaded


def main() -> int:
    """Say which builds this CPU loads, or why the prebuilt kernels cannot serve (status 1)."""
    try:
        loaded = check()
    except KernelsError as err:
        print(f"paged-llm-addon: error: {err}", file=sys.stderr)
        return 1
    print(f"paged-llm-addon: prebuilt kernels whole; this CPU loads {', '.join(loaded)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
