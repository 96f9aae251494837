"""Weights quantized at load (q4, q8): the kernels' bound, greedy equality, the settings.

The bound: in float32 a quantized layer computes ``x @ dequantize(W).T`` up to summation
order (relative error ~1e-6), so the engine's greedy tokens equal transformers' own
generate running the dequantized weights. Tiny models are quantized first and their
reference weights set to the dequantized values, which the 4-bit/8-bit formats then hold
exactly.
"""

from __future__ import annotations

import copy

import pytest
import torch

from paged_llm.engine.config import EngineConfig
from paged_llm.engine.core.sequence import SamplingParams
from paged_llm.engine.errors import ModelLoadError
from paged_llm.engine.llm_engine import LLMEngine
from paged_llm.engine.model.loader import apply_weights
from paged_llm.engine.model.quant import (
    Q4Linear,
    Q8Linear,
    WeightFormat,
    linear_modules,
    q4_linear,
    quantize_model,
    quantize_q4,
    quantize_q8,
    set_module,
)
from tests.helpers.support import make_loaded

CPU = torch.device("cpu")


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


@pytest.mark.parametrize("fmt", ["q4", "q4-int4", "q8"])
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
