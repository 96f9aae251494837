"""The add-on's model option names a Hub GGUF file: it is fetched into /share before serve."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from paged_llm.hub import Source, SourceKind
from paged_llm_addon.gguf_download import download_gguf
from paged_llm_addon.model import locate_model
from paged_llm_addon.options import AddonError
from tests.helpers.package_index import Index, hub_stand_in

REPO = "someone/Tiny-GGUF"
FILE = b"GGUF" + b"\x07" * 200_000


@pytest.fixture
def stand_in(monkeypatch: pytest.MonkeyPatch, socket_enabled: None) -> Iterator[Index]:
    """A stand-in Hub; HF_ENDPOINT points at it."""
    with hub_stand_in(monkeypatch, {REPO: {"Tiny-Q4_K_M.gguf": FILE}}) as served:
        yield served


def test_the_option_names_a_hub_file_a_quantization_or_a_url(tmp_path: Path) -> None:
    model = locate_model(f"{REPO}:Q4_K_M", tmp_path)
    assert model.gguf == Source(SourceKind.HUB, repo=REPO, quant="Q4_K_M")
    assert model.hub_id is None
    assert locate_model(f"{REPO}/Tiny-Q4_K_M.gguf", tmp_path).gguf is not None
    # A dense model id stays a snapshot download; a file in the models folder stays local.
    assert locate_model("Qwen/Qwen3-0.6B", tmp_path).gguf is None
    with pytest.raises(AddonError, match="not an https URL"):
        locate_model("http://example.org/x.gguf", tmp_path)


def test_the_file_is_fetched_once_checked_into_the_models_folder(
    stand_in: Index, tmp_path: Path
) -> None:
    said: list[str] = []
    model = download_gguf(locate_model(f"{REPO}:Q4_K_M", tmp_path), tmp_path, said.append)
    path = tmp_path / "Tiny-Q4_K_M.gguf"
    assert model.source == str(path)
    assert model.name == f"{REPO}:Q4_K_M"
    assert model.size == len(FILE)
    assert hashlib.sha256(path.read_bytes()).digest() == hashlib.sha256(FILE).digest()
    assert said[-1] == "downloaded Tiny-Q4_K_M.gguf, size and checksum verified"
    # Named again at the next start, the file in the folder serves.
    assert locate_model("Tiny-Q4_K_M.gguf", tmp_path).source == str(path)


def test_a_failed_download_is_one_add_on_error(stand_in: Index, tmp_path: Path) -> None:
    stand_in.listed_sha256["Tiny-Q4_K_M.gguf"] = "0" * 64
    with pytest.raises(AddonError, match=r"could not be downloaded: .*refused"):
        download_gguf(locate_model(f"{REPO}:Q4_K_M", tmp_path), tmp_path, print)
    assert not (tmp_path / "Tiny-Q4_K_M.gguf").exists()
