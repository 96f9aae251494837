"""GGUF files read in place: every format kept where it lies, checked against the dense load.

The dense load of a file (``weights: float``) equals transformers' own GGUF loading bit
for bit; the in-place model of the same file multiplies with activations rounded to 8 bits
per block, so its layers are checked against the dense ones within that rounding's bound
and its greedy tokens against the dense model's (see ``_agrees``).
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from paged_llm.engine.config import DEFAULT_MODEL, EngineConfig
from paged_llm.engine.core.sequence import SamplingParams
from paged_llm.engine.errors import ModelLoadError
from paged_llm.engine.llm_engine import LLMEngine
from paged_llm.engine.model.cache_folder import cache_folder
from paged_llm.engine.model.gguf_layers import GGUFEmbedding, GGUFLinear
from paged_llm.engine.model.gguf_transformers import config_and_tokenizer
from paged_llm.engine.model.loader import bundled_gguf_path, load_model
from paged_llm.kernels.cpu import gguf_matmul as gguf_kernels
from tests.helpers.gguf_files import QK, write_gguf
from tests.helpers.support import CACHE, recorded_logits

pytestmark = pytest.mark.skipif(
    gguf_kernels.unavailable() is not None, reason=f"no GGUF kernels: {gguf_kernels.unavailable()}"
)

FORMATS = [QK.Q4_0, QK.Q4_1, QK.Q5_0, QK.Q5_1, QK.Q8_0, QK.Q4_K, QK.Q5_K, QK.Q6_K, QK.F16, QK.BF16]
PROMPTS = [[5, 17, 300, 41], [9] * 40, list(range(3, 90))]
# Both engines keep a float32 KV cache: the weights' path alone is compared here (the
# 16-bit cache that auto gives in place has its own bound, test_kv_cache_dtype.py).
LIKE_FOR_LIKE = EngineConfig(device="cpu", kv_cache_dtype="float32")


def _load(path: Path, cache: Path, weights: str) -> object:
    """load_model on a GGUF file, float32 on the CPU."""
    config = EngineConfig(model=str(path), device="cpu", weights=weights, cache_dir=cache)
    return load_model(config)


def _greedy(engine: LLMEngine, prompt: list[int], n: int) -> list[int]:
    """Greedy tokens of one prompt through the engine."""
    engine.add_request(
        prompt, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True), request_id="p"
    )
    tokens: list[int] = []
    while engine.has_unfinished():
        for out in engine.step():
            tokens.extend(out.token_ids)
    return tokens


def _next_logits(loaded: Any, prefix: list[int]) -> torch.Tensor:
    """The engine's logits for the token after ``prefix`` (its own forward, C or not)."""
    with recorded_logits() as seen:
        _greedy(LLMEngine(loaded, LIKE_FOR_LIKE), prefix, 1)
    return seen[0][0]


# The in-place path's bound against the dense model. Its rotary tables are rope.py's
# (correctly rounded; torch's vector pow and cos round some entries an ulp the other way),
# shared with the numpy runner; on the bundled Q4_1 file that moved the first token's logit
# error from just under 5% of the spread to 5.05% (1.72 of 34.1), so 6%.
BOUND = 0.06


def _agrees(fast: Any, dense: Any, prompt: list[int], got: list[int], want: list[int]) -> None:
    """The in-place model's greedy tokens against the dense model's, by a stated rule.

    At the first difference (or after the last token when there is none) the in-place
    engine's next-token logits differ from the dense model's (transformers' own forward)
    by at most BOUND of the dense logits' spread; and a difference is allowed only where
    the dense model's top-2 margin is within twice that logit error (a near-tie the 8-bit
    activations can tip).
    """
    first = next((i for i, (a, b) in enumerate(zip(got, want, strict=True)) if a != b), None)
    prefix = prompt + want[: len(want) if first is None else first]
    dense.model.set_attn_implementation("sdpa")  # outside the engine: transformers' attention
    with torch.inference_mode():
        theirs = dense.model(torch.tensor([prefix])).logits[0, -1]
    ours = _next_logits(fast, prefix)
    error = float((ours - theirs).abs().max())
    spread = float(theirs.max() - theirs.min())
    assert error <= BOUND * spread, f"logits off by {error:.4f} of a spread of {spread:.2f}"
    if first is not None:
        top = theirs.topk(2).values
        margin = float(top[0] - top[1])
        assert margin <= 2 * error, f"diverged at token {first}: margin {margin:.4f}, {error=:.4f}"


@pytest.mark.parametrize("kind", FORMATS, ids=lambda k: k.name)
def test_every_format_loads_in_place_and_answers_as_the_dense_model(
    tmp_path: Path, kind: QK
) -> None:
    path = write_gguf(tmp_path / "m", "llama", {"*": kind}, tmp_path / "cache")
    fast = _load(path, tmp_path / "cache", "auto")
    dense = _load(path, tmp_path / "cache", "float")
    assert fast.weights.startswith("gguf in place"), fast.weights
    assert dense.weights == "float"
    layers = dict(fast.model.named_modules())
    for name, module in dense.model.named_modules():
        if isinstance(module, torch.nn.Linear):
            kept = layers[name]
            assert isinstance(kept, GGUFLinear), name
            x = torch.randn(3, module.in_features)
            with torch.inference_mode():
                want, got = module(x), kept(x)
            # 8-bit activations: a relative error of a few parts in a thousand.
            assert (got - want).abs().max() <= 0.02 * want.abs().max() + 1e-6, name
    assert isinstance(fast.model.get_input_embeddings(), GGUFEmbedding)
    ids = torch.tensor([[0, 7, 511, 7]])
    assert torch.equal(
        fast.model.get_input_embeddings()(ids), dense.model.get_input_embeddings()(ids)
    )
    for prompt in PROMPTS:
        got = _greedy(LLMEngine(fast, LIKE_FOR_LIKE), prompt, 12)
        want = _greedy(LLMEngine(dense, LIKE_FOR_LIKE), prompt, 12)
        _agrees(fast, dense, prompt, got, want)


def test_a_q4_k_m_style_mix_with_an_untied_head_and_biases(tmp_path: Path) -> None:
    """Qwen2 (q/k/v biases, untied head): Q4_K matrices, Q6_K value/down/head, F32 rest."""
    kinds = {"attn_v": QK.Q6_K, "ffn_down": QK.Q6_K, "output": QK.Q6_K, "*": QK.Q4_K}
    path = write_gguf(tmp_path / "m", "qwen2", kinds, tmp_path / "cache")
    fast = _load(path, tmp_path / "cache", "auto")
    dense = _load(path, tmp_path / "cache", "float")
    assert "Q4_K" in fast.weights
    assert "Q6_K" in fast.weights
    head, embed = fast.model.lm_head, fast.model.get_input_embeddings()
    assert isinstance(head, GGUFLinear)
    assert isinstance(embed, GGUFEmbedding)
    assert head.matrix is not embed.matrix  # untied: two matrices
    # int32 ids, as transformers' continuous batching passes them, read the same rows.
    ids = torch.tensor([[3, 0, 7], [5, 5, 1]])
    assert torch.equal(embed(ids.to(torch.int32)), embed(ids))
    assert embed(ids).shape == (2, 3, embed.embedding_dim)
    q = fast.model.model.layers[0].self_attn.q_proj
    assert q.bias is not None
    assert gguf_kernels.type_name(q.matrix.type_id) == "Q4_K"
    for prompt in PROMPTS:
        got = _greedy(LLMEngine(fast, LIKE_FOR_LIKE), prompt, 12)
        want = _greedy(LLMEngine(dense, LIKE_FOR_LIKE), prompt, 12)
        _agrees(fast, dense, prompt, got, want)


def test_the_bundled_model_is_read_in_place_and_nothing_large_is_written(tmp_path: Path) -> None:
    gguf = bundled_gguf_path(DEFAULT_MODEL.split(":")[1])
    config = EngineConfig(model=DEFAULT_MODEL, device="cpu", cache_dir=tmp_path)
    loaded = load_model(config)
    assert loaded.weights.startswith("gguf in place (210 Q4_1, 1 Q8_0 tensors"), loaded.weights
    model = loaded.model
    # The tied head reads the embedding's matrix: held once, in the file's mapping.
    assert model.lm_head.matrix is model.get_input_embeddings().matrix
    assert sum(isinstance(m, GGUFLinear) for m in model.modules()) == 211
    written = sum(f.stat().st_size for f in tmp_path.rglob("*") if f.is_file())
    assert written < 10 * 2**20, f"{written} bytes written beside a {gguf.stat().st_size} file"
    kept = {p.name for p in tmp_path.iterdir()} - {"kernels"}  # kernels: built once per process
    assert kept == {cache_folder(gguf, tmp_path).name}
    # Its answers are held to the dense load's by the rule (llama.cpp's own answers on
    # this file, 8-bit activations too, were seen to match it token for token).
    dense = load_model(EngineConfig(model=DEFAULT_MODEL, device="cpu", weights="float"))
    fast = LLMEngine(loaded, LIKE_FOR_LIKE)
    prompt = fast.tokenize([{"role": "user", "content": "What is the capital of France?"}])
    got = _greedy(fast, prompt, 12)
    want = _greedy(LLMEngine(dense, LIKE_FOR_LIKE), prompt, 12)
    _agrees(loaded, dense, prompt, got, want)


def test_a_type_without_a_kernel_is_refused_by_name_and_loads_dense_when_asked(
    tmp_path: Path,
) -> None:
    path = write_gguf(tmp_path / "m", "llama", {"ffn_up": QK.Q2_K, "*": QK.Q8_0}, tmp_path / "c")
    with pytest.raises(
        ModelLoadError, match=r"blk\.0\.ffn_up\.weight as Q2_K.*keeps F32, F16, Q4_0"
    ):
        _load(path, tmp_path / "c", "auto")
    assert _load(path, tmp_path / "c", "float").weights == "float"


def test_damaged_files_are_named_with_the_cause(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "m", "llama", {"*": QK.Q8_0}, tmp_path / "c")
    data = path.read_bytes()
    truncated = tmp_path / "m" / "truncated.gguf"
    truncated.write_bytes(data[: len(data) - 1000])
    with pytest.raises(ModelLoadError, match=r"truncated\.gguf cannot be read: tensor .* ends"):
        _load(truncated, tmp_path / "c", "auto")
    other = tmp_path / "m" / "other.gguf"
    other.write_bytes(b"not a model at all" * 10)
    with pytest.raises(ModelLoadError, match=r"other\.gguf cannot be read: not a GGUF file"):
        _load(other, tmp_path / "c", "auto")
    # Cut inside the tensor table: the header walk runs out of bytes.
    cut = tmp_path / "m" / "cut.gguf"
    cut.write_bytes(data[: data.index(b"blk.1.") + 3])
    with pytest.raises(ModelLoadError, match=r"cut\.gguf cannot be read: "):
        _load(cut, tmp_path / "c", "auto")
    empty = tmp_path / "m" / "empty.gguf"
    empty.write_bytes(b"")
    with pytest.raises(ModelLoadError, match=r"empty\.gguf cannot be read: "):
        _load(empty, tmp_path / "c", "auto")
    assert not any(tmp_path.glob("c/truncated*")), "nothing is kept for a refused file"
    assert not any(tmp_path.glob("c/cut*"))


def test_without_kernels_a_file_loads_dense_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    path = write_gguf(tmp_path / "m", "llama", {"*": QK.Q4_0}, tmp_path / "c")
    monkeypatch.setattr(gguf_kernels, "unavailable", lambda build_dir=None: "no C compiler here")
    with caplog.at_level(logging.WARNING):
        loaded = _load(path, tmp_path / "c", "auto")
    assert loaded.weights == "float"
    assert "loads dense: the GGUF CPU kernels are unavailable (no C compiler here)" in caplog.text


def _tasks() -> int:
    """Threads of this process now."""
    return len(list(Path("/proc/self/task").iterdir()))


def test_loading_leaves_no_torch_thread_pool_behind_on_the_calling_thread() -> None:
    """The loading trap: the caller's thread must not keep an OpenMP pool of its own.

    load_model runs torch's parallel ops; libgomp keeps a worker pool for each thread that
    ran them for as long as that thread lives, which halved the engine's decode speed.
    A fresh thread calls load_model and counts the process's threads before and after.
    weights q4 quantizes at load with torch's parallel ops (an in-place load runs none; a
    fresh thread left one pool worker behind on 2 cores before load_model got its own).
    """
    counts: list[int] = []

    def caller() -> None:
        counts.append(_tasks())
        load_model(
            EngineConfig(model=DEFAULT_MODEL, device="cpu", weights="q4", cache_dir=CACHE / "q4")
        )
        counts.append(_tasks())

    thread = threading.Thread(target=caller)
    thread.start()
    thread.join()
    assert counts[1] <= counts[0], f"{counts[1] - counts[0]} threads left behind by loading"


def test_a_first_start_parses_the_metadata_once_into_transformers_own_config_and_tokenizer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The config and tokenizer are exactly transformers' own, from one metadata parse.

    That parse is the engine's MetadataReader, not gguf's reader nor transformers' own; the
    fields it gives must build the same config and tokenizer as transformers alone.
    """
    import gguf
    from transformers import AutoConfig, AutoTokenizer
    from transformers.integrations import gguf as transformers_gguf
    from transformers.integrations.gguf import reader as transformers_reader

    from paged_llm.engine.model import gguf_transformers

    gguf_path = bundled_gguf_path(DEFAULT_MODEL.split(":")[1])
    parses: list[object] = []

    class Counted(gguf_transformers.MetadataReader):
        """The engine's reader, counted."""

        def __init__(self, path: Any) -> None:
            """Count the parse, then parse."""
            parses.append(path)
            super().__init__(path)

    def refused(*args: Any, **kwargs: Any) -> None:
        """gguf's reader, which a first start no longer needs."""
        raise AssertionError("gguf's GGUFReader parsed the file")

    reader, own_parse = gguf.GGUFReader, transformers_reader._read_metadata
    monkeypatch.setattr(gguf_transformers, "MetadataReader", Counted)
    monkeypatch.setattr(gguf, "GGUFReader", refused)
    monkeypatch.setattr(transformers_reader, "_read_metadata", refused)
    config, tokenizer = config_and_tokenizer(gguf_path, None)
    assert len(parses) == 1
    assert gguf.GGUFReader is refused  # the engine's reader was for that parse only
    monkeypatch.setattr(gguf, "GGUFReader", reader)
    monkeypatch.setattr(transformers_reader, "_read_metadata", own_parse)
    alone = AutoConfig.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    alone_tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    assert config.to_dict() == alone.to_dict()
    assert type(tokenizer) is type(alone_tokenizer)
    assert tokenizer.backend_tokenizer.to_str() == alone_tokenizer.backend_tokenizer.to_str()
    assert tokenizer.special_tokens_map == alone_tokenizer.special_tokens_map
    assert tokenizer.chat_template == alone_tokenizer.chat_template
    texts = ["What is the capital of France?", "Turn on the kitchen light ✨ at 7:30", " a\n\tb"]
    for text in texts:
        ids = tokenizer(text)["input_ids"]
        assert ids == alone_tokenizer(text)["input_ids"]
        assert tokenizer.decode(ids) == alone_tokenizer.decode(ids)
    # The patch is gone afterwards: transformers' own function again.
    from transformers import modeling_gguf_pytorch_utils

    assert modeling_gguf_pytorch_utils.load_gguf_checkpoint.__name__ == "load_gguf_checkpoint"
    assert modeling_gguf_pytorch_utils._gguf_parse_value.__name__ == "_gguf_parse_value"
    assert transformers_reader.read_gguf_metadata.__module__ == transformers_reader.__name__
    assert transformers_gguf.read_gguf_metadata is transformers_reader.read_gguf_metadata
