"""The model option: the bundled model, a file or folder on the box, a Hub GGUF file or id."""

from __future__ import annotations

import fnmatch
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType

from paged_llm.defaults import BUNDLED_MODELS, BUNDLED_PREFIX, DEFAULT_MODEL, bundled_gguf
from paged_llm.download import DownloadError
from paged_llm.hub import Source, parse_source

from .options import AddonError, human

BUNDLED = "bundled"
# owner/name, as the Hub spells repository ids.
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
# What the engine reads of a transformers model; not other formats' copies of the weights.
HUB_FILES = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "*.tiktoken"]
# Weights on disk, counted against the memory a KV budget may take.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf")
# How often a download says how far it got.
PROGRESS_EVERY_S = 10.0

Say = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class Model:
    """The model as `paged-llm serve` gets it."""

    source: str  # what serve loads: bundled:NAME, a .gguf file or a model folder
    name: str  # what clients ask for (--served-model-name)
    size: int = 0  # bytes of its weights on disk, where known
    hub_id: str | None = None  # a Hugging Face id still to download
    gguf: Source | None = None  # a GGUF file still to download (owner/repo:QUANT, a URL...)


def locate_model(text: str, models: Path) -> Model:
    """The model the option names; a file that is not there is an AddonError saying where."""
    text = text.strip()
    if text in ("", BUNDLED):
        text = DEFAULT_MODEL
    if text.startswith(BUNDLED_PREFIX):
        name = text.removeprefix(BUNDLED_PREFIX)
        try:
            return Model(text, name, bundled_gguf(name).stat().st_size)
        except LookupError as err:
            if name not in BUNDLED_MODELS:
                raise AddonError(str(err)) from None
        # The image installs its package; without it serve fetches the file on its first start.
        return Model(text, name, BUNDLED_MODELS[name].file_size)
    path = Path(text) if text.startswith("/") else models / text
    if not text.startswith("/") and not path.exists():
        try:
            source = parse_source(text)
        except DownloadError as err:
            raise AddonError(str(err)) from None
        if source is not None:  # fetched into the models folder before serve starts
            return Model(text, text, gguf=source)
    if text.startswith("/") or text.endswith(".gguf") or path.exists():
        return local_model(path, models)
    if HUB_ID.match(text):
        return Model(text, text, hub_id=text)
    raise AddonError(
        f"model {text!r} is not 'bundled', a .gguf file or model folder (in {models} or "
        "/media), a Hugging Face GGUF file (owner/repo:Q4_K_M, owner/repo/file.gguf or an "
        "https URL), or a Hugging Face id such as Qwen/Qwen2.5-0.5B-Instruct"
    )


def local_model(path: Path, models: Path) -> Model:
    """A .gguf file or a model folder on the box, checked to be one."""
    if not path.exists():
        raise AddonError(f"model {path} does not exist (put .gguf files in {models} or /media)")
    if path.is_file():
        if path.suffix != ".gguf":
            raise AddonError(f"model {path} is not a .gguf file")
        return Model(str(path), path.stem, path.stat().st_size)
    if not (path / "config.json").is_file():
        raise AddonError(f"model folder {path} has no config.json: it is not a model folder")
    size = sum(item.stat().st_size for item in path.iterdir() if item.suffix in WEIGHT_SUFFIXES)
    return Model(str(path), path.name, size)


def download(model: Model, cache: Path, say: Say) -> Model:
    """Fetch a Hugging Face model into ``cache``, saying how far it got.

    A copy fetched before serves when the Hub cannot be reached.
    """
    # Bars redrawn with \r make no sense in a log: DownloadProgress writes lines instead.
    # Set before the import, which reads it.
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    from huggingface_hub import HfApi, snapshot_download

    assert model.hub_id is not None
    hub_id = model.hub_id
    try:
        info = HfApi().model_info(hub_id, files_metadata=True)
        files = [f for f in info.siblings or [] if wanted(f.rfilename)]
        total = sum(file.size or 0 for file in files)
        say(f"downloading {hub_id} from Hugging Face: {len(files)} files, {human(total)}")
        with DownloadProgress(hub_id, hub_folder(cache, hub_id), total, say):
            folder = snapshot_download(hub_id, cache_dir=cache, allow_patterns=HUB_FILES)
    except Exception as err:  # offline, unknown or gated model, disk full: try a copy
        try:
            folder = snapshot_download(
                hub_id, cache_dir=cache, allow_patterns=HUB_FILES, local_files_only=True
            )
        except Exception:
            raise AddonError(
                f"model {hub_id} could not be downloaded from Hugging Face: {first_line(err)}"
            ) from err
        say(f"Hugging Face cannot be reached ({first_line(err)}): using the copy fetched before")
    return replace(local_model(Path(folder), cache), name=hub_id)


def wanted(filename: str) -> bool:
    """Whether snapshot_download fetches this file of a repository (HUB_FILES)."""
    return any(fnmatch.fnmatch(filename, pattern) for pattern in HUB_FILES)


def hub_folder(cache: Path, hub_id: str) -> Path:
    """Where huggingface_hub keeps a model's files in ``cache``."""
    return cache / f"models--{hub_id.replace('/', '--')}"


def first_line(err: BaseException) -> str:
    """An error's first line: Hub errors add request ids and links below it."""
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


class DownloadProgress:
    """Says every few seconds how many bytes of a download are on disk."""

    def __init__(
        self, what: str, folder: Path, total: int, say: Say, every: float = PROGRESS_EVERY_S
    ) -> None:
        """Watch ``folder`` fill up to ``total`` bytes while the block runs."""
        self._what, self._folder, self._total, self._say = what, folder, total, say
        self._every = every
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="download-progress", daemon=True)

    def __enter__(self) -> DownloadProgress:
        """Start watching."""
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        """Stop watching; a finished download says so once."""
        self._done.set()
        self._thread.join()
        if kind is None:
            self._say(f"downloaded {self._what}: {human(self.on_disk())}")

    def on_disk(self) -> int:
        """Bytes under the folder now, finished files and partial ones."""
        files = self._folder.rglob("*") if self._folder.is_dir() else []
        return sum(
            path.stat().st_size for path in files if path.is_file() and not path.is_symlink()
        )

    def _watch(self) -> None:
        """Say the bytes so far every few seconds, when they moved."""
        said = -1
        started = time.monotonic()
        while not self._done.wait(self._every):
            now = self.on_disk()
            if now != said:
                said = now
                share = f" ({100 * now / self._total:.0f}%)" if self._total else ""
                rate = now / max(time.monotonic() - started, 1e-9)
                self._say(
                    f"downloading {self._what}: {human(now)} of {human(self._total)}{share}, "
                    f"{human(rate)}/s"
                )
