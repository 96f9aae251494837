"""The allow-list: models the engine cannot run exactly are refused at load, naming why."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import (
    BloomConfig,
    Gemma3TextConfig,
    GPT2Config,
    MambaConfig,
    T5Config,
)

from paged_llm.engine.config import EngineConfig
from paged_llm.engine.core.sequence import SamplingParams
from paged_llm.engine.errors import KVBudgetError, ModelLoadError, UnsupportedModelError
from paged_llm.engine.model.architectures import (
    check_supported,
    exact_context,
    unsupported_feature,
    unsupported_generation_setting,
)
from paged_llm.engine.model.loader import load_model
from tests.helpers.support import make_engine, tiny_config

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
        "phi3_longrope",
        "gemma2",
        "gemma3",
    ],
)
def test_every_tested_architecture_is_accepted(arch: str) -> None:
    config = tiny_config(arch, 512)
    assert unsupported_feature(config) is None
    check_supported(config)


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_a_model_runs_exactly_to_the_end_of_its_context(arch: str) -> None:
    assert exact_context(tiny_config(arch, 512)) == (4096, "the model's context of 4096 tokens")


def test_longrope_runs_only_within_its_original_context_and_there_exactly() -> None:
    # Past 64 tokens transformers switches every position's frequencies to the long factors
    # when any sequence in the forward pass is that long: a 20-token prompt sharing a step
    # with a 100-token one then got other tokens than alone.
    limit, why = exact_context(tiny_config("phi3_longrope", 512))
    assert limit == 64
    assert "longrope" in why
    with pytest.raises(KVBudgetError, match=r"beyond 64 tokens, past which .* longrope"):
        make_engine("phi3_longrope", max_model_len=100)
    engine = make_engine("phi3_longrope", max_model_len=None, max_num_batched_tokens=32)
    assert engine.max_model_len == 64
    prompts = [[(7 * i + 11 * n) % 500 + 3 for i in range(n)] for n in (40, 20, 9)]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        engine.add_request(prompt, params, request_id=str(i))
    got: dict[str, list[int]] = {str(i): [] for i in range(len(prompts))}
    while engine.has_unfinished():
        for out in engine.step():
            got[out.request_id].extend(out.token_ids)
    model = engine.loaded.model
    model.set_attn_implementation("sdpa")
    for i, prompt in enumerate(prompts):
        ref = model.generate(
            torch.tensor([prompt]), max_new_tokens=24, do_sample=False, eos_token_id=None
        )
        assert got[str(i)] == ref[0, len(prompt) :].tolist()


def test_generation_settings_that_change_greedy_tokens_are_refused() -> None:
    from transformers import GenerationConfig

    # What transformers' generate applies with do_sample=False; the engine has none of it.
    config = tiny_config("llama", 512)
    for setting in ({"no_repeat_ngram_size": 3}, {"num_beams": 4}, {"suppress_tokens": [5]}):
        with pytest.raises(UnsupportedModelError, match=next(iter(setting))) as caught:
            check_supported(config, GenerationConfig(**setting))
        assert "generation_config" in caught.value.feature
    # Explicitly off, sampling-only settings and the repetition penalty are fine.
    neutral = GenerationConfig(
        no_repeat_ngram_size=0, num_beams=1, min_length=0, temperature=0.7, top_p=0.8,
        repetition_penalty=1.1,
    )  # fmt: skip
    assert unsupported_generation_setting(neutral) is None
    check_supported(config, neutral)
