"""A model named as a Hub GGUF file (owner/repo:QUANT, owner/repo/file.gguf, an https URL).

Fetched once into the cache's models folder before the engine starts, as llama.cpp's ``-hf``
does; the engine then loads the file like any other path.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import TYPE_CHECKING

from paged_llm.download import default_models_dir
from paged_llm.hub import fetch, parse_source, resolve

if TYPE_CHECKING:
    from paged_llm.engine.api import EngineConfig

_LOGGER = logging.getLogger(__name__)
# How often a download says how far it got.
PROGRESS_EVERY_S = 10.0


def fetch_hub_model(config: EngineConfig) -> EngineConfig:
    """``config`` with a Hub GGUF model fetched and named by its path; else ``config`` itself.

    DownloadError says why the file cannot be had (nothing partial under its name).
    """
    source = parse_source(config.model)
    if source is None:
        return config
    remote = resolve(source)
    folder = default_models_dir(config.cache_dir)
    size = f"{remote.size / 1e9:.2f} GB" if remote.size is not None else "unknown size"
    _LOGGER.info("Fetching %s (%s) into %s, once", remote.filename, size, folder)
    said = [time.monotonic()]

    def progress(fraction: float) -> None:
        """Log how far the download got, every few seconds."""
        if time.monotonic() - said[0] >= PROGRESS_EVERY_S:
            said[0] = time.monotonic()
            _LOGGER.info("Fetching %s: %.0f%%", remote.filename, 100 * fraction)

    path = fetch(remote, folder, progress)
    return dataclasses.replace(config, model=str(path))
