"""`paged-llm serve owner/repo:QUANT`: the Hub GGUF file is fetched once, then served by path."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from paged_llm.engine.api import EngineConfig
from paged_llm.server.cli import build_parser, engine_config, main
from paged_llm.server.hub_model import fetch_hub_model
from tests.helpers.package_index import Index, hub_stand_in

REPO = "someone/Tiny-GGUF"
FILE = b"GGUF" + b"\x05" * 100_000


@pytest.fixture
def stand_in(monkeypatch: pytest.MonkeyPatch, socket_enabled: None) -> Iterator[Index]:
    """A stand-in Hub; HF_ENDPOINT points at it."""
    with hub_stand_in(monkeypatch, {REPO: {"Tiny-Q4_K_M.gguf": FILE}}) as served:
        yield served


def _config(tmp_path: Path, model: str) -> EngineConfig:
    """The engine settings serve builds for ``model``."""
    args = build_parser().parse_args(["serve", model, "--cache-dir", str(tmp_path)])
    return engine_config(args)


def test_a_hub_file_is_fetched_into_the_models_folder(stand_in: Index, tmp_path: Path) -> None:
    config = fetch_hub_model(_config(tmp_path, f"{REPO}:Q4_K_M"))
    path = tmp_path / "models" / "Tiny-Q4_K_M.gguf"
    assert config.model == str(path)
    assert path.read_bytes() == FILE
    # Once: a second start finds it (the Hub's tree is asked again, the file is not).
    fetch_hub_model(_config(tmp_path, f"{REPO}:Q4_K_M"))
    assert [p for p, _ in stand_in.requests if p.endswith("Tiny-Q4_K_M.gguf")] == [
        f"/{REPO}/resolve/main/Tiny-Q4_K_M.gguf"
    ]


def test_other_models_are_left_as_they_are(tmp_path: Path) -> None:
    config = _config(tmp_path, "Qwen/Qwen2.5-1.5B-Instruct")
    assert fetch_hub_model(config) is config


def test_a_failed_fetch_is_one_line_and_status_1(
    stand_in: Index, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["serve", f"{REPO}:Q2_K", "--cache-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("paged-llm: the repository someone/Tiny-GGUF has no Q2_K file")
