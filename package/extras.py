"""The engine extra: what it installs, and the error that says so when it is missing."""

from __future__ import annotations

import importlib
import importlib.util

ENGINE_EXTRA = "paged-llm[engine]"
# Import names of the engine extra's packages. torch is imported (a broken install fails
# only then); the others are only looked up, so the check stays cheap.
ENGINE_MODULES = ("torch", "transformers", "gguf", "accelerate")


class EngineExtraMissing(ImportError):
    """A module of the engine extra cannot be imported here."""


def _missing(module: str) -> str | None:
    """Why ``module`` cannot be used, or None when it can."""
    try:
        if module == "torch":
            importlib.import_module(module)
        elif importlib.util.find_spec(module) is None:
            return "not installed"
    except (ImportError, OSError, ValueError) as err:
        # ValueError: find_spec of a module a test blocked with sys.modules[name] = None.
        return str(err) or type(err).__name__
    return None


def require_engine_extra(package: str, modules: tuple[str, ...] = ENGINE_MODULES) -> None:
    """Raise EngineExtraMissing naming what to install when the engine extra is absent."""
    for module in modules:
        if (reason := _missing(module)) is not None:
            raise EngineExtraMissing(
                f"{package} needs {module!r} ({reason}); install the engine extra: "
                f"pip install '{ENGINE_EXTRA}'",
                name=module,
            )
