"""A GGUF file from the Hugging Face Hub or a URL, fetched into the models folder (/share)."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from paged_llm.download import DownloadError
from paged_llm.hub import fetch, resolve

from .model import PROGRESS_EVERY_S, Model, Say, local_model
from .options import AddonError, human


def download_gguf(model: Model, models: Path, say: Say, every: float = PROGRESS_EVERY_S) -> Model:
    """Fetch ``model``'s file into ``models`` once (size and sha256 checked), saying how far."""
    assert model.gguf is not None
    said = [time.monotonic()]
    try:
        remote = resolve(model.gguf)
        size = human(remote.size) if remote.size is not None else "unknown size"
        say(f"downloading {remote.filename} ({size}) into {models}")

        def progress(fraction: float) -> None:
            """Say how far the download got, every few seconds."""
            if time.monotonic() - said[0] >= every:
                said[0] = time.monotonic()
                say(f"downloading {remote.filename}: {100 * fraction:.0f}%")

        path = fetch(remote, models, progress)
    except DownloadError as err:
        raise AddonError(f"model {model.source} could not be downloaded: {err}") from err
    say(f"downloaded {path.name}, size and checksum verified")
    return replace(local_model(path, models), name=model.name)
