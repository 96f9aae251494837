"""The numpy runner: a GGUF file's packed steps on the C forward, sampling on numpy, no torch.

The same interface ModelRunner offers LLMEngine (``execute``, ``release``, ``kv_caches``,
the texts EngineInfo shows, ``last_forward_s``, ``tuner``), over a CpuModel
(engine/model/cpu_model.py). The KV pool is one pair of numpy arrays per layer in the torch
pool's layout ``[blocks, block_size, kv_heads, head_dim]`` (bfloat16 as its uint16 bits),
zeroed by calloc so its pages fill as requests come. A step is packed as the torch runner
packs it (step_inputs.pack_step), its rotary cos and sin come from rope.py's tables, and
the kept rows' logits go through numpy penalties, the grammars' numpy masks and
NumpySampler.
"""

from __future__ import annotations

import time

import numpy as np
import numpy.typing as npt

from paged_llm.engine.core.scheduler import SchedulerOutput
from paged_llm.engine.core.sequence import Sequence
from paged_llm.engine.model import rope
from paged_llm.engine.model.cpu_model import CpuModel
from paged_llm.engine.model.loaded import LoadedModel, dtype_name, kv_geometry
from paged_llm.engine.model.step_inputs import pack_step
from paged_llm.engine.model.thread_tuner import ThreadTuner
from paged_llm.engine.sample import logprobs as lp
from paged_llm.engine.sample.isolated import sample_isolated
from paged_llm.engine.sample.numpy_penalties import apply_penalties
from paged_llm.engine.sample.numpy_sampler import NumpySampler
from paged_llm.engine.structured.output import StructuredOutput, mask_isolated
from paged_llm.kernels.cpu import forward as cpu_forward

Floats = npt.NDArray[np.float32]
# numpy's dtype for what each KV dtype's pool holds (bfloat16: its bits).
_POOL_DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16}


class CpuRunner:
    """Owns the mapped model and the numpy KV pool; turns a scheduler output into tokens."""

    def __init__(
        self,
        loaded: LoadedModel,
        num_blocks: int,
        block_size: int,
        kv_dtype: str = "float32",
        structured: StructuredOutput | None = None,
    ) -> None:
        """Allocate the pool and bind the C forward to it; ValueError if it cannot run."""
        model = loaded.model
        if not isinstance(model, CpuModel):
            raise TypeError(f"the numpy runner runs a CpuModel, got {type(model).__name__}")
        self.loaded = loaded
        self.model = model
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.kv_dtype = kv_dtype
        self.kv_cache_text = f"{kv_dtype} KV cache"
        if kv_dtype != dtype_name(loaded.dtype):
            self.kv_cache_text += f", read as {dtype_name(loaded.dtype)}"
        layers, kv_heads, head_dim = kv_geometry(model.config)
        shape = (num_blocks, block_size, kv_heads, head_dim)
        pool_dtype = _POOL_DTYPES[kv_dtype]
        # np.zeros takes calloc'd memory: pages are zeroed by the OS on first touch
        self.kv_caches = [
            (np.zeros(shape, dtype=pool_dtype), np.zeros(shape, dtype=pool_dtype))
            for _ in range(layers)
        ]
        self.decoder = model.decoder(self.kv_caches, kv_dtype)
        config = model.config
        self._rotary = rope.RotaryTables(config.rope)
        self._local = (
            rope.RotaryTables(config.local_rope) if config.local_rope is not None else None
        )
        self.forward_text = "the engine's C forward (numpy runner, no torch)"
        self.attention_text = loaded.attention
        self.tuner = ThreadTuner(cpu_forward.max_threads())
        self.sampler = NumpySampler()
        self.structured = structured
        # Seconds the last step spent in the model's forward pass (benchmarks read it).
        self.last_forward_s = 0.0
        # The last step's log probabilities, for the requests that asked (the engine reads them).
        self.logprobs = lp.StepLogprobs()

    def execute(
        self, output: SchedulerOutput, block_tables: list[list[int]]
    ) -> dict[str, int | Exception]:
        """Run the step's chunks in one forward pass; return a token per sampling sequence.

        ``block_tables`` holds each chunk's block table, in chunk order. A forward-pass
        failure raises; a request whose sampling fails gets its exception instead of a token.
        """
        chunks = output.chunks
        self.logprobs = lp.StepLogprobs()
        if not chunks:
            return {}
        step = pack_step(output, block_tables, self.block_size)
        threads = self.tuner.pick(step.decode_shape)
        started = time.perf_counter()
        cos, sin = self._rotary.lookup(step.positions)
        local = self._local.lookup(step.positions) if self._local is not None else None
        logits = self.decoder.forward(
            step.ids,
            step.positions,
            step.seq_of_token,
            step.slots,
            step.tables.astype(np.int32),
            cos,
            sin,
            step.keep,
            threads,
            local,
        )
        self.last_forward_s = time.perf_counter() - started
        self.tuner.record(step.decode_shape, threads, self.last_forward_s)
        if step.scored:
            every = [chunk.seq for chunk in chunks]
            offset = step.num_sample_keep
            self.logprobs.prompt = lp.prompt_logprobs(logits, offset, step.scored, every)
            logits = logits[: step.num_sample_keep]
        if not step.sample_rows:
            return {}
        seqs = [chunks[i].seq for i in step.sample_rows]
        # Raw log probabilities: before penalties and masks change the logits in place.
        wanted = lp.wanted_rows(seqs)
        rows = lp.log_softmax(logits[wanted]) if wanted else None
        apply_penalties(logits, seqs)
        failed = self._apply_grammars(logits, seqs)
        tokens = sample_isolated(self.sampler, logits, seqs, failed)
        if rows is not None:
            self.logprobs.sampled = lp.sampled_logprobs(rows, wanted, seqs, tokens)
        return tokens

    def _apply_grammars(self, logits: Floats, seqs: list[Sequence]) -> dict[int, Exception]:
        """Mask the constrained rows; return the rows whose grammar failed, with the error."""
        if self.structured is None:
            return {}
        return mask_isolated(self.structured.apply, logits, seqs)

    def release(self, request_id: str) -> None:
        """Forget per-request sampler state (its seeded generator)."""
        self.sampler.release(request_id)
