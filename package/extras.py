"""The engine's two extras: what each installs, and the error that names the one missing.

``paged-llm[cpu]`` is the numpy runner's (a GGUF file on the CPU, no torch);
``paged-llm[engine]`` is the torch path's (CUDA, models that are not GGUF files) and holds
everything ``cpu`` holds (pyproject.toml lists both).
"""

from __future__ import annotations

import importlib
import importlib.util

CPU = "cpu"
ENGINE = "engine"
CPU_EXTRA = "paged-llm[cpu]"
ENGINE_EXTRA = "paged-llm[engine]"
# Import names of the cpu extra's packages: what the numpy runner imports.
CPU_MODULES = ("numpy", "tokenizers", "jinja2", "gguf", "llguidance")
# Import names the torch path checks for. torch is imported (a broken install fails only
# then); the others are only looked up, so the check stays cheap.
ENGINE_MODULES = ("torch", "transformers", "gguf", "accelerate")
# The machines paged-llm-kernels (the prebuilt C kernels) and the cpu extra's packages with
# native code (numpy, tokenizers, llguidance) publish Linux wheels for, glibc and musl.
PREBUILT_MACHINES = ("x86_64", "aarch64")
# Every import name of each extra, looked up by name (the integration's installer's view).
EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    CPU: CPU_MODULES,
    ENGINE: tuple(dict.fromkeys(ENGINE_MODULES + CPU_MODULES)),
}


def extra_spec(extra: str) -> str:
    """What to install for ``extra``: ``paged-llm[cpu]`` or ``paged-llm[engine]``."""
    return f"paged-llm[{extra}]"


class EngineExtraMissing(ImportError):
    """A module of one of the engine's extras cannot be imported here."""


def _missing(module: str, import_torch: bool = True) -> str | None:
    """Why ``module`` cannot be used, or None when it can."""
    try:
        if module == "torch" and import_torch:
            importlib.import_module(module)
        elif importlib.util.find_spec(module) is None:
            return "not installed"
    except (ImportError, OSError, ValueError) as err:
        # ValueError: find_spec of a module a test blocked with sys.modules[name] = None.
        return str(err) or type(err).__name__
    return None


def missing_modules(modules: tuple[str, ...]) -> dict[str, str]:
    """Which of ``modules`` cannot be found, and why (looked up, none imported: cheap)."""
    reasons = {module: _missing(module, import_torch=False) for module in modules}
    return {module: reason for module, reason in reasons.items() if reason is not None}


def require_extra(package: str, extra: str, modules: tuple[str, ...]) -> None:
    """Raise EngineExtraMissing naming ``extra`` when one of its ``modules`` is absent."""
    for module in modules:
        if (reason := _missing(module)) is not None:
            raise EngineExtraMissing(
                f"{package} needs {module!r} ({reason}); install the {extra} extra: "
                f"pip install '{extra_spec(extra)}'",
                name=module,
            )


def require_engine_extra(package: str, modules: tuple[str, ...] = ENGINE_MODULES) -> None:
    """Raise EngineExtraMissing naming ``paged-llm[engine]`` when the torch path cannot run."""
    require_extra(package, ENGINE, modules)


def require_cpu_extra(package: str, modules: tuple[str, ...] = CPU_MODULES) -> None:
    """Raise EngineExtraMissing naming ``paged-llm[cpu]`` when the numpy runner cannot run."""
    require_extra(package, CPU, modules)
