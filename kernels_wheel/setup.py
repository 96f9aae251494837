"""Build the paged-llm-kernels wheel: each C library compiled once per instruction-set level."""

from __future__ import annotations

import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

sys.path.insert(0, str(Path(__file__).resolve().parent))  # build_libraries.py, beside this

import build_libraries


class BuildKernels(build_py):
    """build_py that also compiles the libraries into the package."""

    def run(self) -> None:
        """Copy the package, then build the libraries and the manifest beside it."""
        super().run()
        try:
            build_libraries.write_libraries(Path(self.build_lib) / "paged_llm_kernels")
        except build_libraries.BuildError as err:
            sys.exit(f"paged-llm-kernels: {err}")


class PlatformWheel(bdist_wheel):
    """A platform wheel for any Python 3: the libraries are loaded with ctypes, not imported."""

    def get_tag(self) -> tuple[str, str, str]:
        """py3-none-<platform>: the platform the libraries were compiled for.

        A cross compiler's ($CC=aarch64-linux-gnu-gcc on x86-64) libraries are tagged for
        its machine, not this one, so pip installs them only where they run.
        """
        platform_tag = super().get_tag()[2]
        here = build_libraries.machine()
        target = build_libraries.machine(build_libraries.compiler_module().find_compiler())
        if target != here and platform_tag.endswith(f"_{here}"):
            platform_tag = platform_tag.removesuffix(here) + target
        return "py3", "none", platform_tag


class BinaryDistribution(Distribution):
    """A distribution with native code, so the wheel is not tagged pure Python."""

    def has_ext_modules(self) -> bool:
        """Always: the libraries are native code."""
        return True


setup(
    cmdclass={"build_py": BuildKernels, "bdist_wheel": PlatformWheel},
    distclass=BinaryDistribution,
)
