"""The allow-list: models the engine cannot run exactly are refused at load, naming why."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from transformers import (
    BloomConfig,
    Gemma3TextConfig,
    GPT2Config,
    MambaConfig,
    T5Config,
)

from paged_llm.engine.architectures import check_supported, unsupported_feature
from paged_llm.engine.config import EngineConfig
from paged_llm.engine.errors import ModelLoadError, UnsupportedModelError
from paged_llm.engine.loader import load_model

from support import tiny_config

REFUSED = [
    (BloomConfig(n_layer=1, hidden_size=32, n_head=2), "ALiBi"),
    (T5Config(num_layers=1, d_model=32, d_ff=64, num_heads=2), "encoder-decoder"),
    (MambaConfig(num_hidden_layers=1, hidden_size=32), "state-space layers"),
    (GPT2Config(n_layer=1, n_embd=32, n_head=2), "the 'gpt2' architecture: no test shows"),
    (Gemma3TextConfig(use_bidirectional_attention=True), "non-causal"),
    (Gemma3TextConfig(layer_types=["chunked_attention"], num_hidden_layers=1), "chunked"),
]


@pytest.mark.parametrize(
    ("config", "feature"), REFUSED, ids=[f"{type(c).__name__}-{f}" for c, f in REFUSED]
)
def test_refused_models_name_the_feature(config: Any, feature: str, tmp_path: Path) -> None:
    # Only config.json: the refusal comes before the loader reads a tokenizer or weights.
    config.save_pretrained(tmp_path)
    with pytest.raises(UnsupportedModelError, match=feature) as caught:
        load_model(EngineConfig(model=str(tmp_path), device="cpu"))
    assert isinstance(caught.value, ModelLoadError)
    assert caught.value.code == "unsupported_model"
    assert feature in caught.value.feature


@pytest.mark.parametrize(
    "arch",
    [
        "llama",
        "llama_mha",
        "qwen2",
        "qwen3",
        "mistral",
        "mistral_window",
        "phi3_window",
        "gemma2",
        "gemma3",
    ],
)
def test_every_tested_architecture_is_accepted(arch: str) -> None:
    config = tiny_config(arch, 512)
    assert unsupported_feature(config) is None
    check_supported(config)
