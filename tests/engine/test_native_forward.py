"""The engine's own C forward against transformers' forward over the same kernels and pool.

Each tiny model's matrices are made GGUF F32 matrices read in place (the kernels multiply
float32 by float32, no activation rounding), so the two forwards must agree to float32
rounding: same norms, rotary embedding, K/V stored into the pool, paged causal attention
(sliding windows included), MLP and head, over prefill chunks, decodes and several
sequences at once. Quantized formats run through the same code; their greedy tokens are
checked against the dense model in test_gguf_model.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import torch

from paged_llm.engine.llm_engine import LLMEngine
from paged_llm.engine.model.native_forward import NativeForward
from paged_llm.kernels.cpu import forward as cpu_forward
from paged_llm.kernels.cpu import gguf_matmul as gguf_kernels
from tests.helpers.support import greedy_together, in_place_f32, make_loaded, recorded_logits

pytestmark = pytest.mark.skipif(
    cpu_forward.unavailable() is not None, reason=f"no C forward: {cpu_forward.unavailable()}"
)

PROMPTS = [list(range(3, 90)), [5, 17, 300, 41], [9] * 40]
F32 = gguf_kernels.TYPES["F32"]


def random_norms(model: Any) -> None:
    """Give every norm its own weights (a new model's are all alike), so a mix-up shows."""
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if "norm" in name:
                weight += 0.3 * torch.randn(weight.shape, generator=gen)


def _run(loaded: Any, config: Any, native: bool) -> tuple[list[list[int]], list[torch.Tensor]]:
    """Greedy tokens of PROMPTS run together, and the logits of every step."""
    engine = LLMEngine(loaded, config)
    assert (engine.runner.native is not None) is True
    if not native:
        engine.runner.native = None
    with recorded_logits() as seen:
        tokens = greedy_together(engine, PROMPTS, 10)
    return tokens, seen


# The bound, relative to the logits' spread: float32 rounding alone with a float32 pool; a
# 16-bit pool adds its own rounding, which the C forward's prompt rows read back (as later
# decodes do) where transformers' prefill attends over the step's unrounded keys.
BOUNDS = {"float32": 1e-5, "float16": 1e-4, "bfloat16": 1e-3}


@pytest.mark.parametrize("kv", list(BOUNDS))
@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "mistral_window", "gemma2", "gemma3"])
def test_the_c_forward_gives_transformers_logits(arch: str, kv: str) -> None:
    """Prefill chunks and decodes of three sequences: float32 rounding apart, same logits.

    Gemma 2 adds soft-capped scores and logits, Gemma 3 q/k norms and a second rotary table
    for its sliding layers; both have sliding windows, sandwich norms, GELU and a scaled
    embedding.
    """
    # A small token budget: the long prompt is cut into chunks that share steps with decodes.
    loaded, config = make_loaded(arch, kv_cache_dtype=kv, max_num_batched_tokens=32)
    random_norms(loaded.model)
    in_place_f32(loaded.model)
    got, ours = _run(loaded, config, native=True)
    want, theirs = _run(loaded, config, native=False)
    assert got == want
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs, strict=True):
        assert (a - b).abs().max() <= BOUNDS[kv] * (b.max() - b.min())


def test_models_it_cannot_run_stay_on_transformers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Dense weights (the exact path) and other architectures keep transformers' forward."""
    loaded, config = make_loaded("llama")
    # Such a model is refused before the library is asked for (asking compiles it).
    with monkeypatch.context() as patch:
        patch.setattr(cpu_forward, "unavailable", lambda: pytest.fail("built for nothing"))
        assert LLMEngine(loaded, config).runner.native is None  # dense nn.Linear layers
    phi3, config = make_loaded("phi3_window")
    in_place_f32(phi3.model)
    assert LLMEngine(phi3, config).runner.native is None


def test_bad_ids_and_tables_are_refused_and_change_nothing() -> None:
    """An id outside the vocabulary or a table outside the pool: IndexError, pool untouched."""
    loaded, config = make_loaded("llama")
    in_place_f32(loaded.model)
    engine = LLMEngine(loaded, config)
    native = engine.runner.native
    assert isinstance(native, NativeForward)
    pool = engine.runner.kv_caches[0][0]
    before = pool.clone()
    row = torch.tensor([0])
    with pytest.raises(IndexError, match="vocabulary"):
        native.forward(torch.tensor([512]), row, row, row, torch.zeros(1, 1), row)
    with pytest.raises(IndexError, match="outside the KV pool"):
        native.forward(torch.tensor([5]), row, row, row, torch.tensor([[10**6]]), row)
    with pytest.raises(IndexError, match="outside the KV pool"):
        native.forward(torch.tensor([5]), row, row, torch.tensor([10**9]), torch.zeros(1, 1), row)
    with pytest.raises(IndexError, match="kept row"):
        native.forward(torch.tensor([5]), row, row, row, torch.zeros(1, 1), torch.tensor([1]))
    assert torch.equal(pool, before)
    logits = native.forward(torch.tensor([5]), row, row, row, torch.zeros(1, 1), row)
    assert logits.shape == (1, 512)
    assert torch.isfinite(logits).all()


@dataclass(slots=True)
class Fixed:
    """A thread tuner that always picks the same count."""

    threads: int

    def pick(self, shape: int | None) -> int:
        """The fixed count."""
        return self.threads

    def record(self, shape: int | None, threads: int, seconds: float) -> None:
        """Nothing to learn."""


@pytest.mark.parametrize("kv", ["float32", "float16"])
def test_the_thread_count_changes_no_bit(kv: str) -> None:
    """One thread or all of them: the same logits bit for bit (the tuner may switch any step)."""
    loaded, config = make_loaded("qwen2", kv_cache_dtype=kv, max_num_batched_tokens=32)
    in_place_f32(loaded.model)
    runs = []
    for threads in (1, max(2, NativeForward.max_threads())):
        engine = LLMEngine(loaded, config)
        native = engine.runner.native
        assert isinstance(native, NativeForward)
        engine.runner.tuner = Fixed(threads)  # type: ignore[assignment]
        given: list[int] = []
        forward = native.forward

        def spy(*args: Any, forward: Any = forward, given: list[int] = given) -> torch.Tensor:
            """Note the thread count each step asks for."""
            given.append(args[-1])
            return forward(*args)

        native.forward = spy  # type: ignore[method-assign]
        with recorded_logits() as seen:
            tokens = greedy_together(engine, PROMPTS, 10)
        assert set(given) == {threads}
        runs.append((tokens, seen))
    (tokens_one, logits_one), (tokens_all, logits_all) = runs
    assert tokens_one == tokens_all
    assert len(logits_one) == len(logits_all)
    assert all(torch.equal(a, b) for a, b in zip(logits_one, logits_all, strict=True))
