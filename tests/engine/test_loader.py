"""Model loading: the bundled GGUF offline and cached, local folders, clear failures."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from paged_llm.engine.config import DEFAULT_MODEL, EngineConfig
from paged_llm.engine.core.sequence import SamplingParams
from paged_llm.engine.errors import ModelLoadError
from paged_llm.engine.llm_engine import LLMEngine
from paged_llm.engine.model.cache_folder import publish_folder
from paged_llm.engine.model.loader import (
    cpu_supports_bf16,
    end_of_turn_ids,
    load_model,
    resolve_dtype,
)
from paged_llm.engine.model.memory import RUNTIME_BYTES, weight_bytes
from paged_llm.kernels.cpu import attention as cpu_attention
from tests.helpers.support import CACHE, tokenizer_dir


def test_end_of_turn_tokens_stop_as_llama_cpp_stops_on_the_same_file() -> None:
    """Gemma 3's file names <eos> while its turns end at <end_of_turn>: that one counts too.

    Texts the vocabulary lacks (<|eot_id|>, <|end|>) add nothing, not the unknown token.
    """
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir())
    assert end_of_turn_ids(tokenizer) == {0, 2}  # <|endoftext|>, <|im_end|>
    tokenizer.add_special_tokens({"additional_special_tokens": ["<end_of_turn>"]})
    turn = tokenizer.convert_tokens_to_ids("<end_of_turn>")
    assert end_of_turn_ids(tokenizer) == {0, 2, turn}


def test_bundled_default_loads_offline_fast_once_its_tokenizer_is_kept_and_answers() -> None:
    config = EngineConfig(model=DEFAULT_MODEL, device="cpu", cache_dir=CACHE / "inplace")
    load_model(config)  # keeps the config and tokenizer on the first run on this machine
    started = time.perf_counter()
    loaded = load_model(config)
    assert time.perf_counter() - started < 5, "a kept tokenizer should load in seconds"
    assert loaded.max_model_len == 8192
    # <|im_end|>, the file's eos, and <|endoftext|>, where llama.cpp stops too
    assert loaded.eos_token_ids == (0, 2)
    engine = LLMEngine(loaded, config)
    # In place, 8-bit activations: "France" gets llama.cpp's answer on this file, not Paris.
    question = "What is the capital city of Germany?"
    ids = engine.tokenize([{"role": "user", "content": question}])
    engine.add_request(ids, SamplingParams(temperature=0, max_tokens=12), request_id="q")
    text = ""
    while engine.has_unfinished():
        text += "".join(out.text for out in engine.step())
    assert "Berlin" in text


def test_local_folder_loads(tiny_model_dir: Path) -> None:
    loaded = load_model(EngineConfig(model=str(tiny_model_dir), device="cpu", dtype="float32"))
    assert loaded.dtype == torch.float32
    assert loaded.model.config.num_hidden_layers == 2


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ("/nonexistent/folder", "does not exist|holds no model"),
        ("/nonexistent/model.gguf", "GGUF file /nonexistent/model.gguf does not exist"),
        ("bundled:NoSuchModel", "unknown bundled model 'NoSuchModel'"),
        ("no-such-org/no-such-model", "could not load model 'no-such-org/no-such-model'"),
    ],
)
def test_failures_name_the_model_and_cause(model: str, message: str) -> None:
    with pytest.raises(ModelLoadError, match=message):
        load_model(EngineConfig(model=model, device="cpu"))


def test_a_conversion_finished_elsewhere_first_is_kept(tmp_path: Path) -> None:
    """Home Assistant and a server sharing a cache may convert the same file at once."""
    theirs, ours = tmp_path / "model", tmp_path / "model.partial-1"
    for folder, text in ((theirs, "theirs"), (ours, "ours")):
        folder.mkdir()
        (folder / "config.json").write_text(text)
    publish_folder(ours, theirs)
    assert (theirs / "config.json").read_text() == "theirs"
    assert not ours.exists()
    fresh = tmp_path / "fresh.partial-2"
    fresh.mkdir()
    publish_folder(fresh, tmp_path / "fresh")
    assert (tmp_path / "fresh").is_dir()
    assert not fresh.exists()


def test_folder_without_a_model_is_named(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match=r"config\.json is missing"):
        load_model(EngineConfig(model=str(tmp_path), device="cpu"))


def test_auto_dtype_is_float32_on_a_cpu_unless_the_weights_are_quantized() -> None:
    cpu = torch.device("cpu")
    assert resolve_dtype("auto", cpu) == torch.float32
    assert resolve_dtype("auto", cpu, "float") == torch.float32
    # 4-bit answers differ anyway; torch's int4 kernel is fast only with bf16 activations.
    expected = torch.bfloat16 if cpu_supports_bf16() else torch.float32
    assert resolve_dtype("auto", cpu, "q4") == expected
    assert resolve_dtype("bfloat16", cpu, "q4") == torch.bfloat16
    assert resolve_dtype("float16", cpu) == torch.float16


def test_cuda_requested_without_a_gpu_is_a_clear_error() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(ModelLoadError, match="no CUDA GPU"):
        load_model(EngineConfig(model=DEFAULT_MODEL, device="cuda"))


def test_bundled_model_first_32_greedy_tokens_equal_generate() -> None:
    """The engine's exact path (weights float) against transformers' generate on the same
    dense load; the in-place path is held to the float path in test_gguf_model.py."""
    config = EngineConfig(
        model=DEFAULT_MODEL,
        device="cpu",
        dtype="float32",
        weights="float",
        cache_dir=CACHE / "inplace",
        max_model_len=2048,
    )
    loaded = load_model(config)
    assert loaded.weights == "float"
    reason = cpu_attention.unavailable()
    assert loaded.attention == (
        "C kernel in place (float32 decodes), torch SDPA for prefill"
        if reason is None
        else f"torch ({reason})"
    )
    engine = LLMEngine(loaded, config)
    questions = [
        "What is the capital of France?",
        "Turn on the kitchen lights.",
        "Write a haiku about a thermostat.",
        "How many minutes are in a day?",
    ]
    prompts = [engine.tokenize([{"role": "user", "content": q}]) for q in questions]
    # Both stop at the end-of-turn token, and both include it in the output.
    params = SamplingParams(temperature=0, max_tokens=32)
    for i, prompt in enumerate(prompts):
        engine.add_request(prompt, params, request_id=str(i))
    got: dict[str, list[int]] = {str(i): [] for i in range(4)}
    while engine.has_unfinished():
        for out in engine.step():
            got[out.request_id].extend(out.token_ids)
    # The engine's model is that dense load (attention set back to transformers' own).
    model = loaded.model
    model.set_attn_implementation("sdpa")
    for i, prompt in enumerate(prompts):
        ref = model.generate(torch.tensor([prompt]), max_new_tokens=32, do_sample=False)[
            0, len(prompt) :
        ].tolist()
        assert got[str(i)] == ref, questions[i]


def test_weight_bytes_are_counted_without_loading_the_weights(tiny_model_dir: Path) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    count = sum(p.numel() for p in model.parameters())
    assert weight_bytes(config, torch.float32) == 4 * count
    assert weight_bytes(config, torch.bfloat16) == 2 * count


def free_memory_for(monkeypatch: pytest.MonkeyPatch, folder: Path, share: float) -> None:
    """Pretend the free memory holds ``share`` of the float32 weights beside the runtime."""
    from transformers import AutoConfig

    need = weight_bytes(AutoConfig.from_pretrained(folder), torch.float32)
    free = RUNTIME_BYTES + int(need * share)
    monkeypatch.setattr("paged_llm.engine.model.memory.available_memory", lambda device: free)


def test_auto_halves_float32_weights_that_memory_cannot_hold(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    free_memory_for(monkeypatch, tiny_model_dir, 0.75)
    config = EngineConfig(model=str(tiny_model_dir), device="cpu")
    halved = load_model(config)
    assert halved.dtype == torch.bfloat16
    assert halved.attention == "torch (bfloat16)"  # the C decode kernel is float32 only
    assert "loading them in bfloat16" in caplog.text
    # Asked for float32 outright, the load is refused with the sizes before a weight is read.
    with pytest.raises(ModelLoadError, match=r"need .* in float32 .* or dtype bfloat16"):
        load_model(EngineConfig(model=str(tiny_model_dir), device="cpu", dtype="float32"))
    free_memory_for(monkeypatch, tiny_model_dir, 0.25)
    with pytest.raises(ModelLoadError, match=r"choose a smaller model$"):
        load_model(EngineConfig(model=str(tiny_model_dir), device="cpu", dtype="bfloat16"))
