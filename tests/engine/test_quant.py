"""Quantized weights: GGUF Q4/Q8 unpacking, the packed kernels' bound, greedy equality, loading.

The bound: in float32 a quantized layer computes ``x @ dequantize(W).T`` up to summation
order (relative error ~1e-6), so the engine's greedy tokens equal transformers' own
generate running the dequantized weights. Tiny models are quantized first and their
reference weights set to the dequantized values, which the 4-bit/8-bit formats then hold
exactly.
"""

from __future__ import annotations

import copy

import gguf
import numpy as np
import pytest
import torch

from paged_llm.engine.config import DEFAULT_MODEL, EngineConfig
from paged_llm.engine.errors import ModelLoadError
from paged_llm.engine.llm_engine import LLMEngine
from paged_llm.engine.loader import (
    apply_weights,
    bundled_gguf_path,
    cached_gguf_weights,
    load_model,
)
from paged_llm.engine.quant import (
    Q4Float32Linear,
    Q4Linear,
    Q4Weight,
    Q8Float32Embedding,
    Q8Float32Linear,
    Q8Linear,
    Q8Weight,
    WeightFormat,
    linear_modules,
    q4_linear,
    quantize_model,
    quantize_q4,
    quantize_q8,
    set_module,
    unpack_gguf_q4,
    unpack_gguf_q8,
)
from paged_llm.engine.sequence import SamplingParams
from paged_llm.kernels import cpu_quant

from support import CACHE, make_loaded

CPU = torch.device("cpu")


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1"])
def test_gguf_q4_blocks_unpack_to_exactly_ggufs_own_dequantization(kind: str) -> None:
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((48, 128)).astype(np.float32)
    qtype = gguf.GGMLQuantizationType[kind]
    raw = gguf.quants.quantize(weight, qtype)
    expected = gguf.quants.dequantize(raw, qtype)
    got = unpack_gguf_q4(raw, kind).dequantize().numpy()
    np.testing.assert_array_equal(got, expected)


def test_gguf_q8_blocks_unpack_to_exactly_ggufs_own_dequantization() -> None:
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((48, 128)).astype(np.float32)
    raw = gguf.quants.quantize(weight, gguf.GGMLQuantizationType.Q8_0)
    expected = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q8_0)
    q = unpack_gguf_q8(raw)
    assert q.codes.dtype == torch.int8
    assert q.scale.shape == (48, 4)
    np.testing.assert_array_equal(q.dequantize().numpy(), expected)


def _rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    """Largest error relative to the largest reference value."""
    return float((got.float() - ref).abs().max() / ref.abs().max())


@pytest.mark.parametrize("rows", [1, 7, 33])
def test_q4_linear_is_the_dequantized_matmul_within_the_stated_bound(rows: int) -> None:
    torch.manual_seed(0)
    weight, bias, x = torch.randn(96, 160), torch.randn(96), torch.randn(2, rows, 160)
    q = quantize_q4(weight)
    ref = x @ q.dequantize().T + bias
    with torch.inference_mode():
        exact = Q4Linear(q, bias, torch.float32)(x)
        assert exact.shape == (2, rows, 96)
        assert _rel_err(exact, ref) < 1e-5  # float32: summation order only
        # bf16: activations, scales and zeros are rounded to bf16 (8 significant bits).
        assert _rel_err(Q4Linear(q, bias, torch.bfloat16)(x.bfloat16()), ref) < 3e-2
    # The 4-bit rounding itself is the quantization's, bounded by half a step per value.
    step = (weight.reshape(96, -1, 32).amax(-1) - weight.reshape(96, -1, 32).amin(-1)) / 15
    assert (q.dequantize() - weight).abs().max() <= step.max() / 2 + 1e-6


def test_q8_linear_is_the_dequantized_matmul_within_the_stated_bound() -> None:
    torch.manual_seed(0)
    weight, x = torch.randn(64, 96), torch.randn(5, 96)
    codes, scale = quantize_q8(weight)
    ref = x @ (codes.float() * scale[:, None]).T
    with torch.inference_mode():
        assert _rel_err(Q8Linear(codes, scale, None, torch.float32)(x), ref) < 1e-5
    assert (codes.float() * scale[:, None] - weight).abs().max() <= scale.max() / 2 + 1e-6


def _greedy(engine: LLMEngine, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """Run all prompts together through the engine; greedy tokens per prompt."""
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        engine.add_request(prompt, params, request_id=str(i))
    got: list[list[int]] = [[] for _ in prompts]
    while engine.has_unfinished():
        for out in engine.step():
            got[int(out.request_id)].extend(out.token_ids)
    return got


@pytest.mark.parametrize("fmt", ["q4", "q4-int4", "q8", "q8-groups"])
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_greedy_tokens_equal_transformers_running_the_dequantized_weights(
    arch: str, fmt: str
) -> None:
    loaded, config = make_loaded(arch)
    reference = loaded.model
    quantized = copy.deepcopy(reference)
    for name, linear in list(linear_modules(quantized)):
        ref_linear = reference.get_submodule(name)
        if fmt.startswith("q4"):
            q = quantize_q4(linear.weight)
            # q4: the engine's float32 kernel where it builds; q4-int4: torch's int4 kernel.
            new: torch.nn.Module = (
                q4_linear(q, linear.bias, torch.float32)
                if fmt == "q4"
                else Q4Linear(q, linear.bias, torch.float32)
            )
            dense = q.dequantize()
        elif fmt == "q8-groups":
            # GGUF's Q8_0 on the engine's float32 kernel (the bundled file's output projection).
            if cpu_quant.unavailable() is not None:
                pytest.skip(f"no quantized CPU kernels: {cpu_quant.unavailable()}")
            raw = gguf.quants.quantize(
                linear.weight.detach().numpy(), gguf.GGMLQuantizationType.Q8_0
            )
            q8 = unpack_gguf_q8(raw)
            new = Q8Float32Linear(q8, linear.bias)
            dense = q8.dequantize()
        else:
            codes, scale = quantize_q8(linear.weight)
            new = Q8Linear(codes, scale, linear.bias, torch.float32)
            dense = codes.float() * scale[:, None]
        # Untie first so lm_head's quantized copy does not overwrite the embedding.
        ref_linear.weight = torch.nn.Parameter(dense)
        set_module(quantized, name, new)
    loaded.model = quantized
    prompts = [[5, 17, 300, 41], [9] * 40, list(range(3, 90))]
    got = _greedy(LLMEngine(loaded, config), prompts, 24)
    reference.set_attn_implementation("sdpa")
    for prompt, tokens in zip(prompts, got, strict=True):
        ids = reference.generate(
            torch.tensor([prompt]), max_new_tokens=24, do_sample=False, eos_token_id=None
        )
        assert tokens == ids[0, len(prompt) :].tolist()


def test_weights_setting_is_validated_and_named() -> None:
    with pytest.raises(ValueError, match="weights must be one of auto, float, q4, q8"):
        EngineConfig(weights="q5")


def test_auto_keeps_float32_models_dense_and_q4_off_cpu_is_a_clear_error() -> None:
    loaded, _ = make_loaded("llama")
    model = loaded.model
    assert apply_weights(model, WeightFormat.AUTO, torch.float32, CPU, None) == "float"
    assert apply_weights(model, WeightFormat.AUTO, torch.bfloat16, CPU, None) == "float"
    assert not any(isinstance(m, Q4Linear) for m in model.modules())
    with pytest.raises(ModelLoadError, match="weights 'q4' uses torch's CPU kernels"):
        apply_weights(model, WeightFormat.Q4, torch.float32, torch.device("cuda"), None)
    assert apply_weights(model, WeightFormat.AUTO, torch.bfloat16, torch.device("cuda"), None)


def test_q4_of_a_float_model_swaps_every_linear_layer() -> None:
    loaded, _ = make_loaded("llama")
    swapped = quantize_model(loaded.model, WeightFormat.Q4, torch.float32)
    assert swapped == ["q4"] * (2 * 7 + 1)  # q, k, v, o, gate, up, down per layer, lm_head
    assert not list(linear_modules(loaded.model))


def test_bundled_gguf_layers_load_as_the_files_own_weights() -> None:
    """Names, Q/K row order and scales map exactly: dequantized equals transformers' load."""
    cache = CACHE / "converted"
    config = EngineConfig(device="cpu", dtype="float32", weights="float", cache_dir=cache)
    dense = load_model(config)
    given = cached_gguf_weights(bundled_gguf_path(DEFAULT_MODEL.split(":")[1]), dense.model, cache)
    linears = dict(linear_modules(dense.model))
    # 210 Q4_1 matrices, and the Q8_0 embedding the output projection is tied to.
    assert sum(isinstance(q, Q4Weight) for q in given.values()) == 210
    assert {n for n, q in given.items() if isinstance(q, Q8Weight)} == {"model.embed_tokens.weight"}
    assert set(given) == {f"{n}.weight" for n in linears if n != "lm_head"} | {
        "model.embed_tokens.weight"
    }
    params = dict(dense.model.named_parameters())
    for name, q in given.items():
        torch.testing.assert_close(q.dequantize(), params[name], rtol=0, atol=0)
    # The loader swaps them in: every decoder linear layer runs a 4-bit kernel, the float32
    # one where it builds; bf16 stays dense (torch's int4 kernel would round the scales).
    assert apply_weights(dense.model, WeightFormat.AUTO, torch.bfloat16, CPU, None) == "float"
    q_proj = linears["model.layers.3.self_attn.q_proj"]
    x = torch.randn(3, q_proj.in_features)
    ref = x @ q_proj.weight.T
    head_ref = x @ dense.model.lm_head.weight.T
    ids = torch.tensor([[0, 5, 49151, 5]])
    embed_ref = dense.model.model.embed_tokens(ids)
    quantize_model(dense.model, WeightFormat.AUTO, torch.float32, given)
    module = dense.model.get_submodule("model.layers.3.self_attn.q_proj")
    kind = Q4Float32Linear if cpu_quant.unavailable() is None else Q4Linear
    assert isinstance(module, kind)
    with torch.inference_mode():
        assert _rel_err(module(x), ref) < 1e-5
        if cpu_quant.unavailable() is None:
            # The tied matrix is held once, in 8 bits, by the head and the embedding.
            head, embed = dense.model.lm_head, dense.model.model.embed_tokens
            assert isinstance(head, Q8Float32Linear)
            assert isinstance(embed, Q8Float32Embedding)
            assert embed.codes.data_ptr() == head.codes.data_ptr()
            assert _rel_err(head(x), head_ref) < 1e-5
            assert torch.equal(embed(ids), embed_ref)
    assert sum(isinstance(m, kind) for m in dense.model.modules()) == 210


def test_auto_stays_dense_and_says_why_when_the_float32_kernels_cannot_build(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    loaded, _ = make_loaded("llama")
    monkeypatch.setattr(cpu_quant, "unavailable", lambda build_dir=None: "no C compiler here")
    gguf = bundled_gguf_path(DEFAULT_MODEL.split(":")[1])
    with caplog.at_level("INFO"):
        assert apply_weights(loaded.model, WeightFormat.AUTO, torch.float32, CPU, gguf) == "float"
    assert "the quantized CPU kernels are unavailable (no C compiler here)" in caplog.text
    quantized = (Q4Linear, Q4Float32Linear, Q8Float32Linear, Q8Float32Embedding)
    assert not any(isinstance(m, quantized) for m in loaded.model.modules())


@pytest.mark.skipif(cpu_quant.unavailable() is not None, reason="no quantized CPU kernels here")
def test_an_untied_gguf_q8_head_and_embedding_stay_separate() -> None:
    """Without tying, the head and the embedding each keep their own codes."""
    loaded, _ = make_loaded("qwen2")  # untied
    model = loaded.model
    head_q = unpack_gguf_q8(
        gguf.quants.quantize(model.lm_head.weight.detach().numpy(), gguf.GGMLQuantizationType.Q8_0)
    )
    embed_w = model.model.embed_tokens.weight.detach().numpy()
    embed_q = unpack_gguf_q8(gguf.quants.quantize(embed_w, gguf.GGMLQuantizationType.Q8_0))
    given = {"lm_head.weight": head_q, "model.embed_tokens.weight": embed_q}
    assert quantize_model(model, WeightFormat.AUTO, torch.float32, given) == ["q8", "embedding"]
    x, ids = torch.randn(2, head_q.codes.shape[1]), torch.tensor([[3, 1, 4]])
    with torch.inference_mode():
        assert _rel_err(model.lm_head(x), x @ head_q.dequantize().T) < 1e-5
        assert torch.equal(model.model.embed_tokens(ids), embed_q.dequantize()[ids])
    assert model.model.embed_tokens.codes.data_ptr() != model.lm_head.codes.data_ptr()
