"""The GGUF benchmark's model shapes, its random-model configs, and its ratio table."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.gguf import METRICS, Prompts, best_of, ratio, ratios, table
from benchmarks.gguf_models import SHAPES, gguf_path, parse_list, save_tokenizer, shape_of

# (hidden, intermediate, layers, heads, kv heads, vocab, rope theta, positions, kind)
STATED = {
    "360m": (960, 2560, 32, 15, 5, 49152, 100000.0, 8192, "llama"),
    "1.7b": (2048, 8192, 24, 32, 32, 49152, 130000.0, 8192, "llama"),
    "qwen1.5b": (1536, 8960, 28, 12, 2, 151936, 1e6, 32768, "qwen2"),
    "gemma3-1b": (1152, 6912, 26, 4, 1, 262144, 1e6, 32768, "gemma3_text"),
    "qwen2.5-3b": (2048, 11008, 36, 16, 2, 151936, 1e6, 32768, "qwen2"),
    "qwen3-1.7b": (2048, 6144, 28, 16, 8, 151936, 1e6, 40960, "qwen3"),
    "qwen3-4b": (2560, 9728, 36, 32, 8, 151936, 1e6, 40960, "qwen3"),
    "llama3.2-3b": (3072, 8192, 28, 24, 8, 128256, 500000.0, 131072, "llama"),
    "gemma3-4b": (2560, 10240, 34, 8, 4, 262144, 1e6, 131072, "gemma3_text"),
}


@pytest.mark.parametrize("key", sorted(STATED))
def test_shape_table_matches_the_stated_numbers(key: str) -> None:
    s = SHAPES[key]
    got = (
        s.hidden,
        s.intermediate,
        s.layers,
        s.heads,
        s.kv_heads,
        s.vocab,
        s.rope_theta,
        s.max_positions,
        s.model_type,
    )
    assert got == STATED[key]
    assert s.tied
    assert s.hidden % s.heads == 0


def test_kv_bytes_per_token_from_the_shape() -> None:
    # 2 (K and V) x 32 layers x 5 KV heads x 64 wide x 2 bytes
    assert SHAPES["360m"].kv_bytes_per_token(2) == 2 * 32 * 5 * 64 * 2
    assert SHAPES["qwen1.5b"].kv_bytes_per_token(4) == 2 * 28 * 2 * 128 * 4
    assert SHAPES["gemma3-1b"].kv_bytes_per_token(2) == 2 * 26 * 1 * 256 * 2  # heads of 256


@pytest.mark.parametrize("key", sorted(STATED))
def test_full_config_has_the_shape(key: str) -> None:
    shape = SHAPES[key]
    config = shape.config()
    assert config.model_type == shape.model_type
    assert config.hidden_size == shape.hidden
    assert config.intermediate_size == shape.intermediate
    assert config.num_hidden_layers == shape.layers
    assert config.num_attention_heads == shape.heads
    assert config.num_key_value_heads == shape.kv_heads
    assert config.vocab_size == shape.vocab
    assert config.tie_word_embeddings
    assert config.max_position_embeddings == shape.max_positions
    rope = config.rope_parameters
    assert rope.get("full_attention", rope)["rope_theta"] == shape.rope_theta
    assert config.initializer_range == 0.02
    assert getattr(config, "head_dim", None) in (None, shape.head_dim)
    if shape.model_type == "gemma3_text":  # gemma-3-1b-it's and 4b-it's layout beyond the shape
        assert config.head_dim == config.query_pre_attn_scalar == 256
        assert config.layer_types[:6] == ["sliding_attention"] * 5 + ["full_attention"]
        assert config.sliding_window == {"gemma3-1b": 512, "gemma3-4b": 1024}[key]
        assert rope["sliding_attention"]["rope_theta"] == 10000.0
        assert rope["sliding_attention"]["rope_type"] == "default"
        assert config.hidden_activation == "gelu_pytorch_tanh"
    if key == "gemma3-4b":  # its full layers' positions are scaled, its sliding ones' not
        assert rope["full_attention"]["rope_type"] == "linear"
        assert rope["full_attention"]["factor"] == 8.0
    if key == "llama3.2-3b":
        assert rope["rope_type"] == "llama3"
        assert (rope["factor"], rope["original_max_position_embeddings"]) == (32.0, 8192)
    if shape.model_type == "qwen3":
        assert config.head_dim == 128
        assert not config.attention_bias


@pytest.mark.parametrize("key", ["360m", "qwen1.5b", "gemma3-1b", "qwen3-4b", "llama3.2-3b"])
def test_tiny_random_model_keeps_the_kind(key: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    shape = SHAPES[key]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(shape.config(tiny=True), dtype=torch.bfloat16)
    attn = model.model.layers[0].self_attn
    head_dim = shape.head_dim // 4 if shape.head_size else shape.hidden // 16 // shape.heads
    assert attn.q_proj.weight.shape == (shape.heads * head_dim, shape.hidden // 16)
    assert attn.k_proj.weight.shape == (shape.kv_heads * head_dim, shape.hidden // 16)
    assert (attn.q_proj.bias is not None) == (shape.model_type == "qwen2")
    # Qwen3's kind: an RMS norm over each head's queries and keys
    assert hasattr(attn, "q_norm") == (shape.model_type in ("qwen3", "gemma3_text"))
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert model.dtype == torch.bfloat16
    std = model.model.embed_tokens.weight.float().std().item()
    assert 0.015 < std < 0.025


def test_a_tokenizer_filled_to_a_vocabulary_size_still_tokenizes_as_before(tmp_path: Path) -> None:
    """Gemma's shape needs 262144 tokens of SmolLM2's 49152: unused ones fill the rest."""
    from transformers import AutoTokenizer

    save_tokenizer(tmp_path / "plain")
    save_tokenizer(tmp_path / "filled", 50000)
    plain = AutoTokenizer.from_pretrained(tmp_path / "plain")
    filled = AutoTokenizer.from_pretrained(tmp_path / "filled")
    assert len(filled) == 50000 > len(plain)
    assert filled.convert_ids_to_tokens(49999) == "<unused49999>"
    text = "Turn on the kitchen lights, please!"
    assert filled.encode(text) == plain.encode(text)


def test_file_names_round_trip_and_lists_are_checked() -> None:
    for shape in SHAPES.values():
        assert shape_of(gguf_path(shape, "Q4_K_M")) == (shape, "Q4_K_M")
    assert parse_list("360m, qwen1.5b", SHAPES, "shapes") == ["360m", "qwen1.5b"]
    with pytest.raises(SystemExit):
        parse_list("7b", SHAPES, "shapes")


def test_prompts_are_fresh_and_repeatable() -> None:
    a, b = Prompts(3), Prompts(3)
    first = [a.fresh(60) for _ in range(4)]
    assert first == [b.fresh(60) for _ in range(4)]
    assert len({p[0] for p in first}) == 4
    assert all(len(p) == 60 for p in first)


ENTRY = {
    "shape": "360m",
    "shape_name": "SmolLM2-360M",
    "format": "Q4_0",
    "file": "x.gguf",
    "file_bytes": 200 * 2**20,
    "kv_tokens": 8192,
    "systems": {
        "llama.cpp": {
            "decode1_tps": 40.0,
            "decode32_tps": 100.0,
            "ttft60_s": 0.5,
            "ttft1500_s": 10.0,
            "peak_rss_bytes": 500 * 2**20,
            "load_s": 0.5,
            "disk_bytes": 0,
            "kv": {"tokens": 8192, "dtype": "f16", "bytes": 320 * 2**20},
        },
        "paged-llm": {
            "decode1_tps": 20.0,
            "decode32_tps": 150.0,
            "ttft60_s": 1.0,
            "ttft1500_s": 5.0,
            "peak_rss_bytes": 1000 * 2**20,
            "load_s": 2.0,
            "disk_bytes": 10 * 2**20,
            "kv": {"tokens": 8192, "dtype": "float16", "bytes": 320 * 2**20},
        },
    },
}


def test_ratios_are_ours_over_llama_cpp() -> None:
    got = ratios(ENTRY)
    assert got == {
        "decode1_tps": 0.5,
        "decode32_tps": 1.5,
        "ttft60_s": 2.0,
        "ttft1500_s": 0.5,
        "peak_rss_bytes": 2.0,
        "load_s": 4.0,
        "disk_bytes": None,  # llama.cpp writes nothing: no ratio
    }
    assert ratio(None, 1.0) is None
    failed = {**ENTRY, "systems": {"llama.cpp": ENTRY["systems"]["llama.cpp"], "paged-llm": {}}}
    assert set(ratios(failed).values()) == {None}


def test_table_shows_values_ratios_and_direction() -> None:
    text = table(ENTRY)
    rows = {line.split(" | ")[0].lstrip("| "): line for line in text.splitlines()}
    assert rows["decode tok/s, 32 at once"].endswith("| 100.0 | 150.0 | 1.50 | higher |")
    assert rows["peak RSS (MiB)"].endswith("| 500 | 1,000 | 2.00 | lower |")
    assert rows["bytes written during load (MiB)"].endswith("| 0 | 10 | - | lower |")
    assert len([line for line in text.splitlines() if line.startswith("| ")]) == len(METRICS) + 2
    assert "8192 tokens" in text


def test_rounds_keep_each_systems_best_and_show_each_rounds_ratios() -> None:
    """Turns: each metric at its system's best; a failed round ignored; every round's ratio."""
    slow = {"decode1_tps": 10.0, "decode32_tps": 60.0, "ttft60_s": 2.0, "peak_rss_bytes": 900}
    fast = {"decode1_tps": 12.0, "decode32_tps": 90.0, "ttft60_s": 1.0, "peak_rss_bytes": 950}
    best = best_of([slow, fast])
    assert (best["decode32_tps"], best["ttft60_s"], best["peak_rss_bytes"]) == (90.0, 1.0, 900)
    assert best["rounds"] == [slow, fast]
    assert best_of([slow]) is slow  # one round: as measured, no rounds kept
    failed = {"error": "RuntimeError: gone", "decode32_tps": 500.0}
    assert best_of([failed, slow])["decode32_tps"] == 60.0  # a failed round's figures do not count
    assert "error" in best_of([failed, failed])
    theirs = {"decode1_tps": 10.0, "decode32_tps": 50.0, "ttft60_s": 1.0, "peak_rss_bytes": 1000}
    entry = {
        **ENTRY,
        "systems": {"llama.cpp": best_of([theirs, theirs]), "paged-llm": best_of([slow, fast])},
    }
    text = table(entry)
    assert "best of 2 rounds" in text
    assert "- decode tok/s, 32 at once: 1.20, 1.80" in text
    assert "- TTFT, 60-token prompt (s): 2.00, 1.00" in text
    assert "rounds" not in table(ENTRY)
