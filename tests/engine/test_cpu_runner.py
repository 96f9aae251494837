"""The numpy runner (no torch) against the torch path's C forward, and how a runner is chosen.

The numpy runner hands the C forward the same matrices, norms, row orders and rotary tables
(rope.py's, which NativeForward takes too) as the torch path, so greedy tokens must be the
same on the bundled file and on tiny files of every architecture the writer makes, in
several formats, across prefill chunks, decodes and several sequences at once.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import pytest

from paged_llm.defaults import DEFAULT_MODEL
from paged_llm.engine.config import EngineConfig
from paged_llm.engine.core.sequence import SamplingParams
from paged_llm.engine.errors import ModelLoadError
from paged_llm.engine.llm_engine import LLMEngine
from paged_llm.engine.model import selector
from paged_llm.engine.model.cpu_model import read_weights
from paged_llm.engine.model.cpu_runner import CpuRunner
from paged_llm.engine.model.gguf_config import config_of
from paged_llm.engine.model.gguf_metadata import MetadataReader
from paged_llm.engine.model.loaded import NUMPY
from paged_llm.engine.model.runner import ModelRunner
from paged_llm.engine.model.selector import load_model, runner_for
from paged_llm.kernels.cpu import forward as cpu_forward
from tests.helpers.gguf_files import QK, write_gguf
from tests.helpers.support import CACHE, greedy_together

pytestmark = pytest.mark.skipif(
    cpu_forward.unavailable() is not None, reason=f"no C forward: {cpu_forward.unavailable()}"
)
PROMPTS = [list(range(3, 90)), [5, 17, 300, 41], [9] * 40]


def engine(model: str, runner: str, cache: Path, **settings: object) -> LLMEngine:
    """An engine on ``runner`` for ``model`` on the CPU."""
    config = EngineConfig(
        model=model,
        device="cpu",
        runner=runner,
        cache_dir=cache,
        kv_budget=16 * 2**20,
        max_model_len=512,
        max_num_batched_tokens=64,
        **settings,  # type: ignore[arg-type]
    )
    return LLMEngine.from_config(config)


def metadata(hf: Any) -> dict[str, Any]:
    """The GGUF metadata llama.cpp would write for a tiny model's transformers config.

    write_gguf writes tensors only (the torch path reads the config from the cache folder).
    """
    arch = {"gemma3_text": "gemma3"}.get(hf.model_type, hf.model_type)
    values: dict[str, Any] = {
        "block_count": hf.num_hidden_layers,
        "embedding_length": hf.hidden_size,
        "feed_forward_length": hf.intermediate_size,
        "attention.head_count": hf.num_attention_heads,
        "attention.head_count_kv": hf.num_key_value_heads,
        "attention.layer_norm_rms_epsilon": hf.rms_norm_eps,
        "context_length": hf.max_position_embeddings,
        "vocab_size": hf.vocab_size,
    }
    rope = getattr(hf, "rope_parameters", None) or {}
    if "full_attention" in rope:
        rope = rope["full_attention"]
    values["rope.freq_base"] = rope.get("rope_theta", getattr(hf, "rope_theta", 10000.0))
    if arch == "llama":
        values["rope.dimension_count"] = hf.head_dim
    if arch.startswith("gemma"):
        values["attention.key_length"] = hf.head_dim
        values["attention.sliding_window"] = hf.sliding_window
    return {"general.architecture": arch, **{f"{arch}.{k}": v for k, v in values.items()}}


def numpy_engine(path: Path, theirs: LLMEngine) -> LLMEngine:
    """The numpy runner over a tiny file, with the torch path's tokenizer.

    write_gguf's files hold no vocabulary (the torch path takes the bundled tokenizer from
    the cache folder), so the numpy loader would refuse them; the weights, config and
    runner are the numpy path's own.
    """
    reader = MetadataReader(path)
    config = config_of(metadata(theirs.loaded.model.config), [t.name for t in reader.tensors])
    loaded = dataclasses.replace(
        theirs.loaded,
        model=read_weights(path, config),
        device="cpu",
        dtype="float32",
        runner=NUMPY,
    )
    return LLMEngine(loaded, theirs.config)


def both(model: str, cache: Path, max_tokens: int = 12) -> tuple[list[list[int]], list[list[int]]]:
    """Greedy tokens of PROMPTS together on the numpy runner and on the torch path."""
    theirs = engine(model, "torch", cache)
    if model.endswith(".gguf"):
        ours = numpy_engine(Path(model), theirs)
    else:
        ours = engine(model, "numpy", cache)
    assert isinstance(ours.runner, CpuRunner)
    assert isinstance(theirs.runner, ModelRunner)
    assert theirs.runner.native is not None  # the torch path's C forward
    got = greedy_together(ours, PROMPTS, max_tokens)
    want = greedy_together(theirs, PROMPTS, max_tokens)
    assert ours.info.block_bytes == theirs.info.block_bytes
    assert ours.info.num_kv_blocks == theirs.info.num_kv_blocks
    return got, want


def test_the_bundled_model_gives_the_torch_paths_tokens() -> None:
    got, want = both(DEFAULT_MODEL, CACHE / "inplace", max_tokens=16)
    assert got == want


# gemma3 is left out for now: with metadata() standing in for a real file's, its tokens differ
# from the first one (layer pattern or rotary bases of the tiny config, or the runner: open).
@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma2"])
@pytest.mark.parametrize("kind", [QK.Q8_0, QK.Q4_0, QK.Q4_K], ids=lambda k: k.name)
def test_every_architecture_and_format_gives_the_torch_paths_tokens(
    tmp_path: Path, arch: str, kind: QK
) -> None:
    path = write_gguf(tmp_path / "m", arch, {"*": kind}, tmp_path / "cache", tied=arch == "gemma2")
    got, want = both(str(path), tmp_path / "cache")
    assert got == want


def test_seeded_sampling_is_reproducible_run_to_run() -> None:
    """The same seed gives the same tokens on a fresh engine, whatever shares the step."""
    params = SamplingParams(temperature=0.9, top_p=0.95, seed=1234, max_tokens=16)

    def run(extra: bool) -> list[int]:
        llm = engine(DEFAULT_MODEL, "numpy", CACHE / "inplace")
        ids = llm.tokenize([{"role": "user", "content": "Tell me about the sea."}])
        llm.add_request(ids, params, request_id="seeded")
        if extra:
            llm.add_request([1, 2, 3, 4], SamplingParams(temperature=1.0, max_tokens=16))
        tokens: list[int] = []
        while llm.has_unfinished():
            for out in llm.step():
                if out.request_id == "seeded":
                    tokens.extend(out.token_ids)
        return tokens

    first = run(False)
    assert len(first) > 1
    assert run(False) == first
    assert run(True) == first


def test_chat_templates_give_the_torch_paths_ids() -> None:
    """tokenize() through ChatTemplate equals transformers' apply_chat_template's ids."""
    ours = engine(DEFAULT_MODEL, "numpy", CACHE / "inplace")
    theirs = engine(DEFAULT_MODEL, "torch", CACHE / "inplace")
    tools = [
        {
            "type": "function",
            "function": {
                "name": "light_on",
                "description": "Turn a light on",
                "parameters": {"type": "object", "properties": {"area": {"type": "string"}}},
            },
        }
    ]
    chats = [
        [{"role": "user", "content": "Hallo, wie geht's? 日本語 😀  spaces\tand 12345"}],
        [
            {"role": "system", "content": "You are a home assistant."},
            {"role": "user", "content": "Turn on the kitchen light"},
        ],
    ]
    for chat in chats:
        assert ours.tokenize(chat) == theirs.tokenize(chat)
        assert ours.tokenize(chat, tools) == theirs.tokenize(chat, tools)
        kwargs = {"enable_thinking": False}
        assert ours.tokenize(chat, None, kwargs) == theirs.tokenize(chat, None, kwargs)
    assert ours.tokenize("plain <|im_end|> text") == theirs.tokenize("plain <|im_end|> text")


def test_auto_takes_the_numpy_runner_for_a_gguf_file_on_a_cpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # device=auto: the numpy runner unless torch and a GPU driver are both here.
    monkeypatch.setattr(selector, "torch_installed", lambda: True)
    monkeypatch.setattr(selector, "gpu_driver_present", lambda: True)
    assert runner_for(EngineConfig(device="auto")) == "torch"
    assert runner_for(EngineConfig(device="cpu")) == "numpy"
    monkeypatch.setattr(selector, "gpu_driver_present", lambda: False)
    assert runner_for(EngineConfig(device="auto")) == "numpy"
    monkeypatch.setattr(selector, "torch_installed", lambda: False)
    monkeypatch.setattr(selector, "gpu_driver_present", lambda: True)
    assert runner_for(EngineConfig(device="auto")) == "numpy"
    assert runner_for(EngineConfig(device="cpu")) == "numpy"
    assert runner_for(EngineConfig(device="cpu", runner="torch")) == "torch"
    assert runner_for(EngineConfig(device="cpu", weights="float")) == "torch"
    assert runner_for(EngineConfig(device="cpu", dtype="bfloat16")) == "torch"
    assert runner_for(EngineConfig(device="cpu", attention_backend="triton")) == "torch"
    assert runner_for(EngineConfig(device="cuda")) == "torch"
    assert runner_for(EngineConfig(model="HuggingFaceTB/SmolLM2-135M", device="cpu")) == "torch"
    assert runner_for(EngineConfig(model="/models/x.gguf", device="cpu")) == "numpy"
    with pytest.raises(ValueError, match="runner must be one of auto, torch, numpy"):
        EngineConfig(runner="onnx")


def test_no_gpu_driver_is_seen_when_cuda_devices_are_hidden(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """CUDA_VISIBLE_DEVICES empty or -1 hides every GPU: the CPU's runner, whatever the driver."""
    for hidden in ("", "-1"):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", hidden)
        assert not selector.gpu_driver_present()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setattr(selector, "_GPU_DRIVER_FILES", (str(Path(__file__)),))
    assert selector.gpu_driver_present() == (sys.platform == "linux")


def test_what_the_numpy_runner_cannot_run_is_refused_by_name(tmp_path: Path) -> None:
    """A file it cannot run: a ModelLoadError naming it and the torch path, at load."""
    path = write_gguf(tmp_path / "m", "llama", {"ffn_up": QK.Q2_K, "*": QK.Q8_0}, tmp_path / "c")
    config = EngineConfig(model=str(path), device="cpu", runner="numpy", cache_dir=tmp_path / "c")
    with pytest.raises(ModelLoadError, match=r"Q2_K.*paged-llm\[engine\]"):
        load_model(config)
    cuda = EngineConfig(model=str(path), device="cuda", runner="numpy", cache_dir=tmp_path / "c")
    with pytest.raises(ModelLoadError, match=r"not cuda.*paged-llm\[engine\]"):
        load_model(cuda)


def test_gemma3_is_refused_until_it_gives_the_torch_paths_tokens(tmp_path: Path) -> None:
    """Gemma 3 is mapped but not yet shown exact here: refused by name, the torch path named."""
    from tests.engine.test_gguf_config import _GEMMA3, write_metadata_gguf

    path = write_metadata_gguf(tmp_path / "gemma3.gguf", "gemma3", _GEMMA3)
    config = EngineConfig(model=str(path), device="cpu", runner="numpy", cache_dir=tmp_path / "c")
    with pytest.raises(ModelLoadError, match=r"Gemma 3.*paged-llm\[engine\]"):
        load_model(config)
