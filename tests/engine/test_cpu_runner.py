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

import numpy as np
import pytest

from paged_llm.defaults import DEFAULT_MODEL
from paged_llm.engine.config import EngineConfig
from paged_llm.engine.core.sequence import SamplingParams
from paged_llm.engine.errors import ModelLoadError
from paged_llm.engine.llm_engine import LLMEngine
from paged_llm.engine.model import gguf_rope, selector
from paged_llm.engine.model.cpu_model import read_weights
from paged_llm.engine.model.cpu_runner import CpuRunner
from paged_llm.engine.model.gguf_config import config_of, rope_factors
from paged_llm.engine.model.gguf_metadata import MetadataReader
from paged_llm.engine.model.loaded import NUMPY
from paged_llm.engine.model.runner import ModelRunner
from paged_llm.engine.model.selector import load_model, runner_for
from paged_llm.engine.sample.numpy_sampler import NumpySampler
from paged_llm.engine.sample.sampler import Sampler
from paged_llm.kernels.cpu import forward as cpu_forward
from tests.helpers.gguf_files import QK, write_gguf
from tests.helpers.support import CACHE, greedy_together

pytestmark = pytest.mark.skipif(
    cpu_forward.unavailable() is not None, reason=f"no C forward: {cpu_forward.unavailable()}"
)
PROMPTS = [list(range(3, 90)), [5, 17, 300, 41], [9] * 40]


def engine(model: str, runner: str, cache: Path, **settings: object) -> LLMEngine:
    """An engine on ``runner`` for ``model`` on the CPU."""
    return LLMEngine.from_config(engine_config(model, runner, cache, **settings))


def engine_config(model: str, runner: str, cache: Path, **settings: object) -> EngineConfig:
    """The settings of :func:`engine`."""
    return EngineConfig(
        model=model,
        device="cpu",
        runner=runner,
        cache_dir=cache,
        kv_budget=16 * 2**20,
        max_model_len=512,
        max_num_batched_tokens=64,
        **settings,  # type: ignore[arg-type]
    )


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
    if rope.get("rope_type") == "linear":  # llama3's is the file's rope_freqs tensor
        values["rope.scaling.type"] = "linear"
        values["rope.scaling.factor"] = rope["factor"]
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
    names = [t.name for t in reader.tensors]
    config = config_of(metadata(theirs.loaded.model.config), names, rope_factors(path, reader))
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


# Gemma 3 untied: a tied tiny Gemma 3 only repeats each prompt's last token (its embedding
# dwarfs the random layers' output), which would show little; the tied head is checked below.
@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma2", "gemma3"])
@pytest.mark.parametrize("kind", [QK.Q8_0, QK.Q4_0, QK.Q4_K], ids=lambda k: k.name)
def test_every_architecture_and_format_gives_the_torch_paths_tokens(
    tmp_path: Path, arch: str, kind: QK
) -> None:
    path = write_gguf(tmp_path / "m", arch, {"*": kind}, tmp_path / "cache", tied=arch == "gemma2")
    got, want = both(str(path), tmp_path / "cache")
    assert got == want


def record_logits(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[np.ndarray]]:
    """From now on, a float32 copy of every step's logits, by runner ("numpy", "torch")."""
    seen: dict[str, list[np.ndarray]] = {"numpy": [], "torch": []}
    for name, cls in (("numpy", NumpySampler), ("torch", Sampler)):
        sample = cls.sample

        def record(self: Any, logits: Any, seqs: Any, _s: Any = sample, _n: str = name) -> Any:
            """Keep a float32 copy of the step's logits, then sample as ever."""
            copy = logits.float().numpy() if _n == "torch" else logits
            seen[_n].append(np.array(copy, np.float32))
            return _s(self, logits, seqs)

        monkeypatch.setattr(cls, "sample", record)
    return seen


def farthest(ours: list[np.ndarray], theirs: list[np.ndarray]) -> float:
    """The largest step-wise logit gap, relative to that step's range of logits."""
    assert len(ours) == len(theirs) > 1
    return max(
        float(np.abs(a - b).max() / (b.max() - b.min())) for a, b in zip(ours, theirs, strict=True)
    )


def transformers_tokens(path: Path, cache: Path) -> list[list[int]]:
    """Greedy tokens of PROMPTS from transformers' model of the file, its own forward."""
    settings = engine_config(str(path), "torch", cache)
    oracle = LLMEngine(load_model(settings, native_model=False), settings)
    assert isinstance(oracle.runner, ModelRunner)
    oracle.runner.native = None  # as tests/engine/test_native_forward.py sets it
    return greedy_together(oracle, PROMPTS, 12)


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_gemma3_gives_the_torch_paths_logits_and_transformers_tokens(
    tmp_path: Path, tied: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Gemma 3: five sliding layers on their own rotary base, then a full one; q/k norms,
    norms stored as 1 + w, a scaled embedding. The numpy runner's logits are the torch
    path's at every step (bit for bit when measured), its tokens transformers' own model's.

    The numpy runner reads the file's metadata, which cannot say Gemma 3's layer pattern or
    query scalar; the tiny model is given those a file implies (gguf_files.gguf_config).
    """
    seen = record_logits(monkeypatch)
    path = write_gguf(tmp_path / "m", "gemma3", {"*": QK.Q8_0}, tmp_path / "cache", tied=tied)
    got, want = both(str(path), tmp_path / "cache")
    assert got == want
    assert len({tuple(tokens) for tokens in got}) == len(PROMPTS)
    assert farthest(seen["numpy"], seen["torch"]) <= 1e-5
    assert transformers_tokens(path, tmp_path / "cache") == want


# Llama 3.2's scaling on the tiny llama's base (whose bands then cover a third of the
# dimensions), and Gemma 3 4B's linear factor on the tiny Gemma 3's full layer.
_LLAMA3 = {
    "rope_type": "llama3",
    "rope_theta": 10000.0,
    "factor": 32.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
_LINEAR = {"rope_type": "linear", "rope_theta": 1000000.0, "factor": 8.0}


@pytest.mark.parametrize(("arch", "rope"), [("llama", _LLAMA3), ("gemma3", _LINEAR)])
def test_a_files_rope_scaling_gives_transformers_tokens(
    tmp_path: Path, arch: str, rope: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file's rope scaling (llama.cpp's rope_freqs table, or its linear keys) is run on
    both paths as the model's own config states it: the numpy runner's logits are the torch
    path's, its tokens transformers' own model's on that config. Run unscaled, as
    transformers' GGUF loader would, the logits depart far beyond that bound.
    """
    seen = record_logits(monkeypatch)
    cache = tmp_path / "cache"
    path = write_gguf(tmp_path / "m", arch, {"*": QK.Q8_0}, cache, tied=False, rope=rope)
    got, want = both(str(path), cache)
    assert got == want
    assert farthest(seen["numpy"], seen["torch"]) <= 1e-5
    assert transformers_tokens(path, cache) == want
    scaled = seen["numpy"][:]
    seen["numpy"].clear()
    monkeypatch.setattr(gguf_rope, "scaling", lambda *args: None)
    unscaled = numpy_engine(path, engine(str(path), "torch", cache))
    greedy_together(unscaled, PROMPTS, 12)
    assert farthest(seen["numpy"], scaled) > 1e-3


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


def _gemma3_sentencepiece(writer: Any, hf: Any) -> None:
    """The config keys and a 512-token SentencePiece vocabulary without merges, as Gemma's."""
    from tests.engine.test_gguf_tokenizer import big_sentencepiece_vocab

    for key, value in metadata(hf).items():
        if key == "general.architecture":
            continue  # the writer's own
        if isinstance(value, float):
            writer.add_float32(key, value)
        else:
            writer.add_uint32(key, int(value))
    vocab = big_sentencepiece_vocab(hf.vocab_size)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.types)
    writer.add_token_scores(vocab.scores)
    writer.add_uint32("tokenizer.ggml.bos_token_id", 1)
    writer.add_uint32("tokenizer.ggml.eos_token_id", 2)
    writer.add_uint32("tokenizer.ggml.unknown_token_id", 0)
    writer.add_chat_template(
        [
            {"name": "default", "template": "{{ messages[0].content }}"},
            {"name": "tool_use", "template": "{{ tools[0].function.name }}"},
        ]
    )


def test_a_files_derived_merges_are_kept_in_the_cache_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loader keeps derived merges under cache_dir/tokenizers; the next load reads them."""
    from paged_llm.engine.tokenizer import gguf_tokenizer

    cache = tmp_path / "cache"
    path = write_gguf(
        tmp_path / "m", "gemma3", {"*": QK.Q8_0}, cache, metadata=_gemma3_sentencepiece
    )
    first = engine(str(path), "numpy", cache)
    (entry,) = (cache / "tokenizers").iterdir()
    assert entry.suffix == ".json"

    def refuse(*args: Any) -> Any:
        raise AssertionError("derived again instead of read back")

    monkeypatch.setattr(gguf_tokenizer, "generate_merges", refuse)
    again = engine(str(path), "numpy", cache)
    assert isinstance(again.runner, CpuRunner)
    text = "the rain in Köln 12 times"
    assert again.tokenize(text) == first.tokenize(text)
    assert greedy_together(again, PROMPTS[1:], 4) == greedy_together(first, PROMPTS[1:], 4)
    # the file's named templates: tool_use when tools are given, the default otherwise
    chat = [{"role": "user", "content": text}]
    tool = {"type": "function", "function": {"name": "light_on", "parameters": {}}}
    assert again.tokenize(chat) == again.tokenizer.encode(text, add_special_tokens=False)
    assert again.tokenize(chat, [tool]) == again.tokenizer.encode("light_on", False)
    monkeypatch.undo()
    # without a cache folder nothing is kept, and the merges are derived again
    calls: list[int] = []
    derive = gguf_tokenizer.generate_merges
    monkeypatch.setattr(gguf_tokenizer, "generate_merges", lambda *a: calls.append(1) or derive(*a))
    config = dataclasses.replace(engine_config(str(path), "numpy", cache), cache_dir=None)
    assert LLMEngine.from_config(config).tokenize(text) == first.tokenize(text)
    assert calls == [1]
