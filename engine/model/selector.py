"""Which runner serves a configuration, and loading through it, without importing torch.

The numpy runner (engine/model/cpu_model.py, cpu_runner.py: the C forward over the mapped
GGUF file, no torch or transformers) or the torch path (engine/model/loader.py, runner.py).
``EngineConfig.runner`` forces either. With ``auto`` a GGUF file (bundled or a path) goes to
the numpy runner where torch is not installed (the light CPU install), when the device is
``cpu`` or ``auto`` and ``weights`` and ``dtype`` are left at what the C forward runs
(``auto``; float32) with the torch attention backend; everything else, and every
configuration where torch is installed, takes the torch path as before. (Making the numpy
runner ``auto``'s choice on every CPU is the next step of issue 57, once the whole suite
has run against it.) A file the numpy path cannot run (its architecture, tokenizer or
template, or no C kernels) gets a ModelLoadError saying what is missing and that
``paged-llm[engine]`` runs it; with ``auto`` and torch installed it loads on the torch path.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Callable

from paged_llm.defaults import BUNDLED_PREFIX, DEFAULT_MODEL
from paged_llm.engine.config import EngineConfig
from paged_llm.engine.errors import ModelLoadError
from paged_llm.engine.model.loaded import NUMPY, TORCH, LoadedModel

_LOGGER = logging.getLogger(__name__)


def torch_installed() -> bool:
    """Whether torch can be found (looked up, not imported: importing takes seconds)."""
    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):  # ValueError: sys.modules["torch"] = None
        return False


def is_gguf_source(model: str) -> bool:
    """Whether a model setting names a GGUF file: a bundled model or a path ending .gguf."""
    source = model.strip() or DEFAULT_MODEL
    return source.startswith(BUNDLED_PREFIX) or source.endswith(".gguf")


def runner_for(config: EngineConfig) -> str:
    """TORCH or NUMPY: which runner ``config`` asks for (cheap: nothing is imported or built)."""
    if config.runner != "auto":
        return config.runner
    if not is_gguf_source(config.model):
        return TORCH
    # What the C forward runs as the torch path's in-place GGUF does: float32 activations,
    # the file's own blocks, the torch attention backend (triton on a CPU is the interpreter).
    if config.weights != "auto" or config.dtype not in ("auto", "float32"):
        return TORCH
    if config.attention_backend == "triton":
        return TORCH
    if config.device in ("cpu", "auto") and not torch_installed():
        return NUMPY
    return TORCH


Progress = Callable[[float], None]


def load_model(
    config: EngineConfig, progress: Progress | None = None, *, native_model: bool = True
) -> LoadedModel:
    """Load the configured model through the runner :func:`runner_for` picks.

    ``native_model`` is the torch loader's (engine/model/loader.py). Every failure is a
    ModelLoadError naming it.
    """
    if runner_for(config) == NUMPY:
        from paged_llm.engine.model.cpu_model import load_cpu_model

        try:
            return load_cpu_model(config, progress)
        except ModelLoadError as err:
            if config.runner != "auto" or not torch_installed():
                raise
            _LOGGER.warning("%s; loading it on the torch path instead", err)
    from paged_llm.engine.model import loader

    return loader.load_model(config, progress, native_model=native_model)
