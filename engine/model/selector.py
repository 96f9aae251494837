"""Which runner serves a configuration, and loading through it, without importing torch.

The numpy runner (engine/model/cpu_model.py, cpu_runner.py: the C forward over the mapped
GGUF file, no torch or transformers) or the torch path (engine/model/loader.py, runner.py).
``EngineConfig.runner`` forces either. With ``auto`` a GGUF file (bundled or a path) goes to
the numpy runner on a CPU: ``device`` ``cpu``, or ``auto`` where torch is not installed or
no GPU driver is present, with ``weights`` and ``dtype`` left at what the C forward runs
(``auto``; float32) and the torch attention backend. Everything else (a Hugging Face model,
a GPU, float or bf16 weights, the Triton backend) takes the torch path. A file the numpy
path cannot run (its architecture, tokenizer or template, or no C kernels) gets a
ModelLoadError saying what is missing and that ``paged-llm[engine]`` runs it; with ``auto``
and torch installed it loads on the torch path instead, with a warning.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import sys
from pathlib import Path

from paged_llm.defaults import BUNDLED_PREFIX, DEFAULT_MODEL
from paged_llm.engine.config import EngineConfig
from paged_llm.engine.errors import ModelLoadError
from paged_llm.engine.model.bundled import bundled_file, fetched_yet
from paged_llm.engine.model.loaded import NUMPY, TORCH, LoadedModel
from paged_llm.engine.model.progress import Progress, part
from paged_llm.kernels.cpu.native_build import retry_failed_builds

_LOGGER = logging.getLogger(__name__)


def torch_installed() -> bool:
    """Whether torch can be found (looked up, not imported: importing takes seconds)."""
    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):  # ValueError: sys.modules["torch"] = None
        return False


# Files a GPU driver creates: NVIDIA's, and AMD's (ROCm builds of torch answer as CUDA).
_GPU_DRIVER_FILES = ("/proc/driver/nvidia/version", "/dev/nvidiactl", "/dev/kfd")


def gpu_driver_present() -> bool:
    """Whether a GPU torch could use may be here, judged without importing torch.

    ``device=auto`` on the torch path asks ``torch.cuda.is_available()``, which costs torch's
    import (seconds); without a GPU driver that answer is no, so the CPU's runner is known
    without it. A driver with no usable GPU still goes to the torch path, which decides.
    """
    if os.environ.get("CUDA_VISIBLE_DEVICES") in ("", "-1"):
        return False
    if sys.platform == "linux":
        return any(Path(name).exists() for name in _GPU_DRIVER_FILES)
    return shutil.which("nvidia-smi") is not None


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
    if config.device == "cpu":
        return NUMPY
    if config.device == "auto" and (not torch_installed() or not gpu_driver_present()):
        return NUMPY
    return TORCH


# The part of a load's progress a first start spends fetching the bundled model (about
# 100 MB); loading it takes the rest.
FETCH_SHARE = 0.5


def _fetch_first(config: EngineConfig, progress: Progress | None) -> Progress | None:
    """Fetch a bundled model not here yet, as the load's first part; the rest's progress."""
    source = config.model.strip() or DEFAULT_MODEL
    if not source.startswith(BUNDLED_PREFIX):
        return progress
    name = source.removeprefix(BUNDLED_PREFIX)
    if fetched_yet(name, config.cache_dir):
        return progress
    # Not installed and not fetched yet (or unknown: bundled_file says which).
    bundled_file(name, config.cache_dir, part(progress, 0.0, FETCH_SHARE))
    return part(progress, FETCH_SHARE)


def load_model(
    config: EngineConfig, progress: Progress | None = None, *, native_model: bool = True
) -> LoadedModel:
    """Load the configured model through the runner :func:`runner_for` picks.

    ``native_model`` is the torch loader's (engine/model/loader.py). Every failure is a
    ModelLoadError naming it. A bundled model whose package is not installed is fetched
    first (once), its download reported as the first part of ``progress``.
    """
    progress = _fetch_first(config, progress)
    # A kernel build that failed at an earlier load (a full or unwritable cache) gets
    # another try: reloading the entry after freeing space is enough.
    retry_failed_builds()
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
