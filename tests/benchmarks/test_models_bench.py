"""The recommended files' benchmark: the catalogue's shapes, run here on the bundled model."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from benchmarks import ROOT
from benchmarks.gguf_models import SHAPES
from benchmarks.install import requirements
from benchmarks.models import (
    CATALOGUE_SHAPES,
    KV_BUDGET_MIB,
    Plan,
    assist_tokens,
    computed,
    main,
    table,
)
from paged_llm.catalogue import BY_KEY, RECOMMENDED


@pytest.mark.parametrize("key", sorted(CATALOGUE_SHAPES))
def test_each_recommended_file_has_a_random_shape_with_its_kv_shape(key: str) -> None:
    shape, stated = SHAPES[CATALOGUE_SHAPES[key]], BY_KEY[key].shape
    assert (shape.layers, shape.kv_heads, shape.head_dim, shape.max_positions) == (
        stated.layers,
        stated.kv_heads,
        stated.head_dim,
        stated.context,
    )
    assert shape.kv_bytes_per_token(4) == stated.kv_bytes_per_token(4)


def test_every_recommended_file_is_benchmarked() -> None:
    assert set(CATALOGUE_SHAPES) == {model.key for model in RECOMMENDED}


def test_the_docs_kv_per_token_is_the_shapes() -> None:
    """docs/models.md's "KV per token" column is what the random shapes hold.

    At 2 bytes a value: the CPU path's automatic KV dtype for a quantized file is float16.
    """
    text = (ROOT / "docs" / "models.md").read_text()
    for key, shape_key in CATALOGUE_SHAPES.items():
        row = re.search(rf"^\| {re.escape(BY_KEY[key].name)} \| (\d+) KiB \|", text, re.M)
        assert row is not None, key
        shape = SHAPES[shape_key]
        assert int(row[1]) * 1024 == shape.kv_bytes_per_token(2)


def test_the_kv_budget_is_the_integrations_automatic_floor() -> None:
    """512 MiB: what the automatic budget gives every recommended file but the two 4Bs."""
    from paged_llm.catalogue import AUTO_KV_FLOOR

    assert KV_BUDGET_MIB * 2**20 == AUTO_KV_FLOOR


def test_assist_prompt_lengths_follow_the_docs_rule() -> None:
    assert assist_tokens(3) == 1350
    assert assist_tokens(25) == 1658  # docs/models.md: "25 entities ~ 1,700 tokens"
    assert Plan().assist_tokens == 1658
    assert Plan(prompt_tokens=200).assist_tokens == 200


def test_waits_are_computed_from_the_measured_rates() -> None:
    entry = {
        "name": "m",
        "file_bytes": 2**30,
        "result": {"prompt_tps": 100.0, "decode1_tps": 10.0, "ttft_cached_s": 1.0},
    }
    waits = computed(entry)
    assert waits["cold_25_s"] == pytest.approx((1658 + 30) / 100)
    assert waits["voice_cached_s"] == pytest.approx(1.0 + 45 / 10 + 50 / 100)
    assert computed({"result": {"error": "x"}})["voice_cached_s"] is None
    text = table([entry, {"name": "f", "file_bytes": 0, "result": {"error": "gone"}}], Plan())
    assert "f failed: gone" in text
    assert "| m | 14.8 | 16.9 | 20.4 | 27.4 | 6.0 |" in text


@pytest.mark.usefixtures("socket_enabled")  # it talks to paged-llm serve over loopback
def test_the_benchmark_measures_the_bundled_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    main(
        [
            "--bundled",
            "--tokens", "8",
            "--prompt-tokens", "200",
            "--question-tokens", "10",
            "--kv-budget-mib", "64",
            "--out", str(tmp_path),
            "--install", "checkout",  # no wheel build and venv in the suite
        ]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert "SmolLM2-135M-Instruct" in out
    (written,) = tmp_path.glob("models-*.json")
    (entry,) = json.loads(written.read_text())["files"]
    result = entry["result"]
    assert "error" not in result, result.get("error")
    assert result["load_s"] > 0
    assert result["peak_rss_bytes"] > entry["file_bytes"] / 2
    assert result["decode1_tokens"] == 8
    assert result["decode1_tps"] > 0
    assert result["prompt_tokens"] == 210
    assert result["ttft_cold_s"] > 0
    assert result["ttft_cached_s"] > 0
    # the prefix cache served the shared prompt's full blocks (12 of 16 tokens) every time
    assert all(hits >= 192 for hits in result["cached_prompt_tokens"]), result
    assert result["kv"]["tokens"] > 0
    assert result["kv"]["dtype"] in ("float16", "float32")
    assert entry["computed"]["voice_cached_s"] > 0


def test_a_user_install_takes_the_cpu_extras_requirements_but_the_prebuilt_kernels() -> None:
    """What ``--install user`` puts beside the wheel: pyproject's lists, the kernels aside."""
    wanted = requirements()
    names = {re.split(r"[<>=;\[ ]", line, maxsplit=1)[0] for line in wanted}
    assert {"aiohttp", "prometheus-client", "numpy", "tokenizers", "jinja2", "gguf"} <= names
    assert "llguidance" in names
    assert not any(name.startswith("paged-llm") for name in names)
    assert not {"torch", "transformers"} & names
