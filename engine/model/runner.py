"""Runs one packed forward pass per step over the paged KV pool, then samples."""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

try:
    import torch
except ImportError:  # the torch path's entry: say what to install
    from paged_llm.extras import require_engine_extra

    require_engine_extra(__name__)
    raise

from paged_llm.engine.config import EngineConfig
from paged_llm.engine.core.scheduler import SchedulerOutput
from paged_llm.engine.core.sequence import Sequence
from paged_llm.engine.model.loaded import (
    LoadedModel,
    kv_dtype_name,
    kv_geometry,
)
from paged_llm.engine.model.loaded import (
    kv_bytes_per_block as kv_bytes_per_block,  # re-exported: the torch path's callers
)
from paged_llm.engine.model.native_forward import NativeForward
from paged_llm.engine.model.native_model import NativeModel
from paged_llm.engine.model.step_inputs import pack_step
from paged_llm.engine.model.thread_tuner import ThreadTuner
from paged_llm.engine.sample import logprobs as lp
from paged_llm.engine.sample.isolated import sample_isolated
from paged_llm.engine.sample.penalties import apply_penalties
from paged_llm.engine.sample.sampler import Sampler
from paged_llm.engine.structured.output import StructuredOutput, mask_isolated
from paged_llm.kernels import (
    AttentionCall,
    PagedAttentionInputs,
    paged_attention,
    resolve_backend,
    store_kv,
)

ATTENTION_NAME = "paged_llm"
_METADATA_KWARG = "paged_llm_metadata"


@dataclass(slots=True, frozen=True)
class AttentionMetadata:
    """What every attention layer needs for one packed step: the kernels' inputs and the pool.

    ``inputs`` (block tables, lengths, the step's plan cache) goes, the same object, into
    each layer's AttentionCall; the slot mapping (only store_kv reads it), the pool and the
    backend are the runner's.
    """

    kv_caches: list[tuple[torch.Tensor, torch.Tensor]]
    slot_mapping: torch.Tensor
    inputs: PagedAttentionInputs
    backend: str | None


def paged_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention for transformers' models: store this step's K/V, then attend through pages.

    transformers hands ``[1, heads, tokens, head_dim]`` tensors (RoPE already applied) for
    the packed batch; the layer's K/V pool and the step's metadata come in through kwargs.
    """
    meta: AttentionMetadata = kwargs[_METADATA_KWARG]
    key_cache, value_cache = meta.kv_caches[module.layer_idx]  # type: ignore[index]
    inputs = meta.inputs
    q = query[0].transpose(0, 1)
    k = key[0].transpose(0, 1)
    v = value[0].transpose(0, 1)
    store_kv(
        k,
        v,
        key_cache,
        value_cache,
        meta.slot_mapping,
        backend=meta.backend,
        plan_cache=inputs.plan_cache,
    )
    scale = float(scaling) if scaling is not None else q.shape[-1] ** -0.5
    # transformers passes a layer's window (None on full-attention layers, from
    # config.layer_types) and Gemma 2's attn_logit_softcapping as these kwargs.
    window = kwargs.get("sliding_window")
    softcap = kwargs.get("softcap")
    # One small object per layer (under a microsecond to build): the step's one inputs
    # with this layer's tensors and options.
    call = AttentionCall(
        q,
        key_cache,
        value_cache,
        inputs,
        scale,
        sliding_window=int(window) if window is not None else None,
        softcap=float(softcap) if softcap is not None else None,
    )
    out = paged_attention(call, backend=meta.backend)
    return out.unsqueeze(0), None


@functools.cache
def _register_attention() -> None:
    """Make paged attention known to transformers by ATTENTION_NAME (once).

    Imported here, not at the top: a model the C forward runs never needs transformers'
    modeling stack, whose import takes seconds of a start.
    """
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, paged_attention_forward)


_KV_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def resolve_kv_dtype(
    setting: str, device: torch.device, model_dtype: torch.dtype, weights: str
) -> torch.dtype:
    """The torch dtype the KV pool holds for a ``kv_cache_dtype`` setting (loaded.kv_dtype_name).

    ``auto`` is float16 on a CPU engine whose float32 model runs quantized weights in place,
    else the model's dtype; an explicit dtype the pool cannot hold is a ValueError.
    """
    return _KV_DTYPES[kv_dtype_name(setting, device.type, _name(model_dtype), weights)]


def zeroed(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A tensor of zeros; on the CPU from calloc, whose pages the OS zeroes on first touch.

    torch.zeros writes every byte, a noticeable part of a start for a large pool, and all
    of it resident from the start where a pool's blocks fill as requests come.
    """
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    # numpy has no bfloat16; zero bits are 0.0 in every float type
    words = np.zeros(shape, dtype=np.dtype(f"u{dtype.itemsize}"))
    return torch.from_numpy(words).view(dtype)


def _name(dtype: torch.dtype) -> str:
    """A dtype as the settings spell it: float16, not torch.float16."""
    return str(dtype).removeprefix("torch.")


def config_kv_dtype(config: EngineConfig, loaded: LoadedModel) -> torch.dtype:
    """resolve_kv_dtype for an engine's settings and its loaded model."""
    return resolve_kv_dtype(config.kv_cache_dtype, loaded.device, loaded.dtype, loaded.weights)


class ModelRunner:
    """Owns the model and the KV pool; turns a scheduler output into sampled tokens."""

    def __init__(
        self,
        loaded: LoadedModel,
        num_blocks: int,
        block_size: int,
        backend: str | None = None,
        kv_dtype: torch.dtype | None = None,
        structured: StructuredOutput | None = None,
    ) -> None:
        """Allocate the pool (zeroed, so padding never reads NaN) and switch attention over.

        ``kv_dtype``: what the pool holds, config_kv_dtype(config, loaded) for an engine;
        None keeps the model's dtype. ``structured`` masks constrained requests' logits
        (None: no masking).
        """
        self.loaded = loaded
        self.model = loaded.model
        self.device = loaded.device
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.backend = None if backend in (None, "auto") else backend
        if kv_dtype is None:
            kv_dtype = loaded.dtype
        self.kv_dtype = kv_dtype
        # For diagnostics beside LoadedModel.attention: what the pool holds, and how it is read.
        self.kv_cache_text = f"{_name(kv_dtype)} KV cache"
        if kv_dtype != loaded.dtype:
            self.kv_cache_text += f", read as {_name(loaded.dtype)}"
        layers, kv_heads, head_dim = kv_geometry(self.model.config)
        shape = (num_blocks, block_size, kv_heads, head_dim)
        self.kv_caches = [
            (zeroed(shape, kv_dtype, self.device), zeroed(shape, kv_dtype, self.device))
            for _ in range(layers)
        ]
        if not isinstance(self.model, NativeModel):
            _register_attention()
            self.model.set_attn_implementation(ATTENTION_NAME)
        # The engine's own C forward where it runs the model (CPU, GGUF in place), else None
        # and transformers' forward; tests set it to None to compare the two.
        self.native: NativeForward | None = None
        self.forward_text = "transformers' forward"
        if self.device.type == "cpu":
            self.native, self.forward_text = NativeForward.of(self.model, self.kv_caches)
        # The C forward's thread count, chosen from how fast its steps run.
        self.tuner = ThreadTuner(self.native.max_threads() if self.native is not None else 1)
        if self.native is None and isinstance(self.model, NativeModel):
            # The loader builds one only where the C forward runs; it has no other forward.
            raise RuntimeError(f"a NativeModel cannot run: {self.forward_text}")
        # How attention runs (for diagnostics): the loader's choice, unless the C forward
        # runs the whole step.
        self.attention_text = loaded.attention
        if self.native is not None:
            self.attention_text = "C kernels in place (decodes in spans, prompt rows in tiles)"
        self.sampler = Sampler(self.device)
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
        positions, seq_of_token, slots = step.positions, step.seq_of_token, step.slots
        tables, keep, sample_rows = step.tables, step.keep, step.sample_rows
        shape = step.decode_shape
        dev = self.device
        threads = self.tuner.pick(shape)
        with torch.inference_mode():
            started = time.perf_counter()
            if self.native is not None:
                logits = self.native.forward(
                    torch.from_numpy(step.ids),
                    torch.from_numpy(positions),
                    torch.from_numpy(seq_of_token),
                    torch.from_numpy(slots),
                    torch.from_numpy(tables.astype(np.int32)),
                    torch.from_numpy(keep),
                    threads,
                )
            else:
                inputs = PagedAttentionInputs(
                    block_tables=torch.from_numpy(tables.astype(np.int32)).to(dev),
                    context_lens=torch.from_numpy(step.ends.astype(np.int32)).to(dev),
                    query_start_loc=torch.from_numpy(step.cu.astype(np.int32)).to(dev),
                    max_query_len=int(step.lens.max()),
                    max_context_len=int(step.ends.max()),
                    # The torch path's plans, worked out by the first layer for all of them.
                    plan_cache={},
                )
                meta = AttentionMetadata(
                    kv_caches=self.kv_caches,
                    slot_mapping=torch.from_numpy(slots).to(dev),
                    inputs=inputs,
                    # Resolved once here rather than in each of the layers' two kernel calls.
                    backend=resolve_backend(dev, self.backend),
                )
                logits = self.model(
                    input_ids=torch.from_numpy(step.ids).unsqueeze(0).to(dev),
                    position_ids=torch.from_numpy(positions).unsqueeze(0).to(dev),
                    use_cache=False,
                    logits_to_keep=torch.from_numpy(keep).to(dev),
                    **{_METADATA_KWARG: meta},
                ).logits[0]
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            self.last_forward_s = time.perf_counter() - started
            self.tuner.record(shape, threads, self.last_forward_s)
            if step.scored:
                # The few scored rows go to the CPU in float32: the records are numpy's.
                extra = logits[step.num_sample_keep :].float().cpu().numpy()
                every = [chunk.seq for chunk in chunks]
                self.logprobs.prompt = lp.prompt_logprobs(extra, 0, step.scored, every)
                logits = logits[: step.num_sample_keep]
            if not sample_rows:
                return {}
            seqs = [chunks[i].seq for i in sample_rows]
            # Raw log probabilities: before penalties and masks change the logits in place.
            wanted = lp.wanted_rows(seqs)
            rows = None
            if wanted:
                rows = lp.log_softmax(logits[wanted].float().cpu().numpy())
            apply_penalties(logits, seqs)
            failed = self._apply_grammars(logits, seqs)
            tokens = sample_isolated(self.sampler, logits, seqs, failed)
            if rows is not None:
                self.logprobs.sampled = lp.sampled_logprobs(rows, wanted, seqs, tokens)
            return tokens

    def _apply_grammars(self, logits: torch.Tensor, seqs: list[Sequence]) -> dict[int, Exception]:
        """Mask the constrained rows; return the rows whose grammar failed, with the error."""
        if self.structured is None:
            return {}
        return mask_isolated(functools.partial(mask_logits, self.structured), logits, seqs)

    def release(self, request_id: str) -> None:
        """Forget per-request sampler state (its seeded generator)."""
        self.sampler.release(request_id)


def mask_logits(structured: StructuredOutput, logits: torch.Tensor, seqs: list[Sequence]) -> None:
    """Apply the step's grammar masks (numpy bitmasks) to torch ``logits`` in place.

    CPU float32 logits are handed to the numpy masks as a view (no copy); elsewhere (a GPU,
    bfloat16) the bitmask goes over as a tensor and is unpacked where the logits are.
    """
    if logits.device.type == "cpu" and logits.dtype == torch.float32 and logits.is_contiguous():
        structured.apply(logits.numpy(), seqs)
        return
    batch = structured.fill(seqs)
    if batch is None:
        return
    started = time.perf_counter()
    if batch.rows:
        rows = torch.tensor(batch.rows, device=logits.device)
        words = torch.from_numpy(batch.bitmask[batch.rows]).to(logits.device, non_blocking=True)
        shifts = torch.arange(32, device=logits.device, dtype=torch.int32)
        # Bit i of word w allows token 32 * w + i.
        allowed = ((words.unsqueeze(-1) >> shifts) & 1).flatten(1).bool()
        width = min(logits.shape[-1], allowed.shape[-1])
        block = logits.index_select(0, rows)
        block[:, :width].masked_fill_(~allowed[:, :width], float("-inf"))
        block[:, width:] = float("-inf")
        logits.index_copy_(0, rows, block)
    for row, token in batch.forced.items():
        logits[row].fill_(float("-inf"))
        logits[row, token] = 0.0
    structured.last_mask_s += time.perf_counter() - started
