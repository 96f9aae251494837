"""The synchronous engine: tokenize, admit, schedule, run the model, detokenize, report."""

from __future__ import annotations

import functools
import gc
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, cast

from paged_llm.engine.config import EngineConfig, KVLayout
from paged_llm.engine.core.kv.contiguous import ContiguousKVCacheManager
from paged_llm.engine.core.kv.paged import KVCacheManager
from paged_llm.engine.core.kv.sizing import plan_kv_pool
from paged_llm.engine.core.scheduler import Scheduler
from paged_llm.engine.core.sequence import FinishReason, Priority, SamplingParams, Sequence
from paged_llm.engine.detokenizer import Detokenizer
from paged_llm.engine.errors import EngineDeadError, RequestRejected
from paged_llm.engine.info import EngineInfo
from paged_llm.engine.metrics import EngineState, MetricsRecorder, MetricsSnapshot
from paged_llm.engine.model.loaded import (
    NUMPY,
    LoadedModel,
    config_kv_dtype_name,
    dtype_name,
    kv_bytes_per_block,
)
from paged_llm.engine.model.selector import load_model
from paged_llm.engine.outputs import RequestOutput, RequestTiming, StepTrace, TokenLogprob
from paged_llm.engine.structured.output import StructuredOutput
from paged_llm.engine.validation import (
    check_arrival_time,
    check_params,
    check_priority,
    check_prompt,
    check_request_id,
    check_template_kwargs,
    check_token_ids,
    check_tools,
)
from paged_llm.protocol.tool_prompt import (
    template_shows_tools,
    template_source,
    tools_as_text,
    uses_tools,
)

_LOGGER = logging.getLogger(__name__)

Prompt = str | list[dict[str, Any]] | list[int]


class LLMEngine:
    """Steps many requests together over one paged KV pool; single-threaded by design."""

    def __init__(
        self,
        loaded: LoadedModel,
        config: EngineConfig,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Size the pool from the budget and build scheduler, KV manager and runner."""
        self.config = config
        self.loaded = loaded
        self.tokenizer = loaded.tokenizer
        self.clock = clock
        num_blocks, self.max_model_len = plan_kv_pool(config, loaded)
        self.kv_manager: KVCacheManager | ContiguousKVCacheManager
        if config.kv_layout is KVLayout.CONTIGUOUS:
            self.kv_manager = ContiguousKVCacheManager(
                num_blocks, config.block_size, self.max_model_len
            )
        else:
            self.kv_manager = KVCacheManager(
                num_blocks, config.block_size, enable_prefix_caching=config.enable_prefix_caching
            )
        self.scheduler = Scheduler(
            config.scheduler_config(self.max_model_len), self.kv_manager, clock=clock
        )
        self.structured = StructuredOutput(
            loaded.tokenizer,
            int(loaded.model.config.vocab_size),
            loaded.eos_token_ids,
            config.json_bounds,
        )
        self.runner: Any = _runner(loaded, config, num_blocks, self.structured)
        self.recorder = MetricsRecorder()
        self._detokenizers: dict[str, Detokenizer] = {}
        self._next_id = 0
        self._closed = False
        self.trace: list[StepTrace] | None = None
        # Whether the last step fed prompt tokens (or recomputed a preempted sequence).
        self._reading_prompts = False

    @classmethod
    def from_config(cls, config: EngineConfig) -> LLMEngine:
        """Load the configured model (blocking: tens of seconds the first time) and build."""
        return cls(load_model(config), config)

    @property
    def num_kv_blocks(self) -> int:
        """Blocks in the KV pool."""
        return self.kv_manager.num_blocks

    @functools.cached_property
    def info(self) -> EngineInfo:
        """The model, the pool and the limits, as hosts may read them (fixed: built once)."""
        loaded, runner, block_size = self.loaded, self.runner, self.config.block_size
        return EngineInfo(
            model=loaded.name,
            device=str(loaded.device),
            dtype=dtype_name(loaded.dtype),
            weights=loaded.weights,
            attention=runner.attention_text,
            kv_cache=runner.kv_cache_text,
            forward=runner.forward_text,
            block_size=block_size,
            block_bytes=kv_bytes_per_block(loaded.model.config, block_size, runner.kv_dtype),
            num_kv_blocks=self.num_kv_blocks,
            max_model_len=self.max_model_len,
            eos_token_ids=tuple(loaded.eos_token_ids),
        )

    def tokenize(
        self,
        prompt: Prompt,
        tools: list[dict[str, Any]] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        *,
        add_special_tokens: bool = True,
    ) -> list[int]:
        """Token ids for plain text, chat messages (through the chat template) or ids as given.

        ``chat_template_kwargs`` are variables for the template (Qwen3's ``enable_thinking``);
        ``add_special_tokens=False`` leaves the tokenizer's special tokens off plain text.
        """
        check_prompt(prompt)
        check_tools(tools)
        check_template_kwargs(chat_template_kwargs)
        if isinstance(prompt, str):
            if not prompt:
                raise RequestRejected("empty_prompt", "the prompt is empty")
            ids: list[int] = self.tokenizer(prompt, add_special_tokens=add_special_tokens)[
                "input_ids"
            ]
            return ids
        if not prompt:
            raise RequestRejected("empty_prompt", "the prompt is empty")
        if all(isinstance(t, int) for t in prompt):
            return list(prompt)  # type: ignore[arg-type]
        messages = cast("list[dict[str, Any]]", prompt)  # not ids, as checked above
        template = template_source(getattr(self.tokenizer, "chat_template", None))
        if not template_shows_tools(template) and uses_tools(messages, tools):
            # The template would drop the tools: the Hermes instructions and turns instead.
            messages, tools = tools_as_text(messages, tools), None
        chat_template = self.loaded.chat_template
        if chat_template is not None:
            # The numpy path: the file's template rendered as transformers renders it, then
            # tokenized as apply_chat_template tokenizes (no special tokens added).
            text = chat_template.render(
                messages,
                tools=tools or None,
                add_generation_prompt=True,
                **(chat_template_kwargs or {}),
            )
            ids = self.tokenizer.encode(text, add_special_tokens=False)
            return ids
        encoded = self.tokenizer.apply_chat_template(
            messages,
            tools=tools or None,
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
            **(chat_template_kwargs or {}),
        )
        return list(encoded["input_ids"])

    def add_request(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams | None = None,
        priority: Priority = Priority.INTERACTIVE,
        request_id: str | None = None,
        arrival_time: float | None = None,
    ) -> Sequence:
        """Admit a tokenized request or raise RequestRejected saying which limit it hit."""
        self._check_open()
        check_token_ids(prompt_token_ids)
        params = check_params(params)
        priority = check_priority(priority)
        check_request_id(request_id)
        check_arrival_time(arrival_time)
        if not prompt_token_ids:
            raise RequestRejected("empty_prompt", "the prompt is empty")
        vocab = self.loaded.model.config.vocab_size
        if any(not 0 <= t < vocab for t in prompt_token_ids):
            raise RequestRejected(
                "invalid_token", f"the prompt has token ids outside 0..{vocab - 1}"
            )
        if params.repetition_penalty is None:
            params = replace(params, repetition_penalty=self.loaded.repetition_penalty)
        if request_id is None:
            self._next_id += 1
            request_id = f"req-{self._next_id}"
        if self.scheduler.get(request_id) is not None:
            raise RequestRejected("duplicate_id", f"request id {request_id!r} is already in use")
        seq = Sequence(
            request_id=request_id,
            prompt_token_ids=list(prompt_token_ids),
            params=params,
            priority=priority,
            arrival_time=self.clock() if arrival_time is None else arrival_time,
        )
        if not seq.params.ignore_eos:
            seq.extra_stop_token_ids = self.loaded.eos_token_ids
        self.structured.add(seq)
        try:
            self.scheduler.add(seq)
        except BaseException:
            self.structured.release(request_id)
            raise
        self._detokenizers[request_id] = Detokenizer(self.tokenizer, seq.params.stop)
        return seq

    def abort(self, request_id: str) -> bool:
        """Abort a request in any state and free its blocks; False if it is unknown."""
        seq = self.scheduler.abort(request_id)
        if seq is None:
            return False
        self._forget(seq)
        return True

    def _check_open(self) -> None:
        """Raise EngineDeadError once close() has run."""
        if self._closed:
            raise EngineDeadError("the engine is stopped: it was closed")

    def has_unfinished(self) -> bool:
        """Whether any request is waiting or running."""
        return self.scheduler.has_unfinished()

    def step(self) -> list[RequestOutput]:
        """Run one scheduling step and one forward pass; return the new output per request."""
        self._check_open()
        started = time.perf_counter()
        self.runner.last_forward_s = 0.0
        self.structured.last_mask_s = 0.0
        output = self.scheduler.schedule()
        results: dict[str, int | Exception] = {}
        if output.chunks:
            tables = [self.kv_manager.block_table(chunk.seq) for chunk in output.chunks]
            # A failure of the forward pass itself propagates: the engine cannot go on.
            results = self.runner.execute(output, tables)
        by_id = {chunk.seq.request_id: chunk.seq for chunk in output.chunks}
        if output.chunks:
            for request_id, records in self.runner.logprobs.prompt.items():
                # Kept on the sequence: the next step's packing reads how far it got.
                by_id[request_id].scored_prompt.extend(records)
        sampled = {rid: t for rid, t in results.items() if not isinstance(t, Exception)}
        prompt_tokens = sum(
            c.num_tokens for c in output.chunks if c.start < c.seq.num_prompt_tokens
        )
        self._reading_prompts = prompt_tokens > 0
        self.scheduler.update(output, sampled)
        self.recorder.record_step(self.clock(), len(sampled), prompt_tokens)
        outputs = []
        for request_id, token in results.items():
            seq = by_id[request_id]
            try:
                if isinstance(token, Exception):
                    raise token
                logprob = self.runner.logprobs.sampled.get(request_id)
                outputs.append(self._finish_step(seq, logprob))
            except Exception as err:  # this request fails with its error; others go on
                outputs.append(self._fail(seq, err))
        if self.trace is not None:
            self._record_trace(started, output.num_batched_tokens, len(output.chunks))
        return outputs

    def _finish_step(self, seq: Sequence, logprob: TokenLogprob | None = None) -> RequestOutput:
        """Detokenize a request's new token, apply stop strings, and package its output."""
        detok = self._detokenizers[seq.request_id]
        text, stop_hit = detok.add(seq.token_ids, seq.num_prompt_tokens)
        if seq.num_output_tokens == 1:
            self.recorder.record_first_token(seq)
        if stop_hit and not seq.is_finished:
            self.scheduler.finish(seq, FinishReason.STOP)
        if not seq.is_finished and self.structured.is_constrained(seq.request_id):
            self._advance_grammar(seq)
        if seq.is_finished:
            text += detok.flush()
            self._forget(seq)
        generated = seq.num_output_tokens
        # A scoring request (max_tokens 0) ends with no token: its sampled one is dropped.
        out = self._output(seq, text, [seq.token_ids[-1]] if generated else [])
        if logprob is not None and generated:
            out.logprobs = [logprob]
        if seq.params.prompt_logprobs is not None and generated <= 1:
            out.prompt_logprobs = [None] * seq.first_scored + list(seq.scored_prompt)
        return out

    def _fail(self, seq: Sequence, err: Exception) -> RequestOutput:
        """End one request that failed inside a step; its blocks go back, others go on."""
        self.scheduler.finish(seq, FinishReason.ERROR)
        self._forget(seq)
        out = self._output(seq, "", [])
        out.error = err
        return out

    def _advance_grammar(self, seq: Sequence) -> None:
        """Feed the new token to the request's grammar; end the request where it must end."""
        if not self.structured.sync(seq):
            # Only a sampler that ignored the mask could get here; never emit past it.
            self.scheduler.finish(seq, FinishReason.ERROR)
        elif self.structured.is_terminated(seq.request_id):
            # The grammar took its end token (ignore_eos kept the request alive): nothing
            # more may follow.
            self.scheduler.finish(seq, FinishReason.STOP)

    def _record_trace(self, started: float, num_tokens: int, num_chunks: int) -> None:
        """Append this step's figures to the benchmark trace."""
        assert self.trace is not None
        kv = self.kv_manager
        self.trace.append(
            StepTrace(
                time=self.clock(),
                duration=time.perf_counter() - started,
                forward=self.runner.last_forward_s,
                num_batched_tokens=num_tokens,
                num_chunks=num_chunks,
                num_running=self.scheduler.num_running,
                num_waiting=self.scheduler.num_waiting,
                kv_blocks_used=kv.num_used_blocks,
                kv_live_tokens=kv.num_live_tokens,
                kv_allocated_slots=kv.num_allocated_slots,
                num_preemptions=self.scheduler.num_preemptions,
            )
        )

    def _output(self, seq: Sequence, text: str, token_ids: list[int]) -> RequestOutput:
        """Package one request's step result."""
        return RequestOutput(
            request_id=seq.request_id,
            text=text,
            token_ids=token_ids,
            finished=seq.is_finished,
            finish_reason=seq.finish_reason,
            prompt_tokens=seq.num_prompt_tokens,
            completion_tokens=seq.num_output_tokens,
            cached_tokens=seq.num_cached_tokens,
            timing=RequestTiming(
                arrival=seq.arrival_time,
                first_scheduled=seq.first_scheduled_time,
                first_token=seq.first_token_time,
                finished=seq.finished_time,
                num_preemptions=seq.num_preemptions,
            )
            if seq.is_finished
            else None,
        )

    def _forget(self, seq: Sequence) -> None:
        """Drop per-request state once a sequence has ended."""
        self._detokenizers.pop(seq.request_id, None)
        self.runner.release(seq.request_id)
        self.structured.release(seq.request_id)
        self.recorder.record_finished(seq)
        if _LOGGER.isEnabledFor(logging.DEBUG):
            _log_finished(seq)

    def metrics(self) -> MetricsSnapshot:
        """A consistent snapshot of every figure; call from the thread that steps."""
        kv = self.kv_manager
        sched = self.scheduler
        now = self.clock()
        ttft, queue, e2e = self.recorder.latencies()
        return MetricsSnapshot(
            timestamp=now,
            kv_blocks_used=kv.num_used_blocks,
            kv_blocks_total=kv.num_blocks,
            kv_blocks_cached=kv.num_free_cached_blocks,
            kv_cache_usage_perc=kv.usage,
            kv_live_tokens=kv.num_live_tokens,
            kv_allocated_slots=kv.num_allocated_slots,
            num_requests_running=sched.num_running,
            num_requests_waiting=sched.num_waiting,
            num_requests_waiting_by_class={
                p.name.lower(): n for p, n in sched.num_waiting_by_class().items()
            },
            num_preemptions=sched.num_preemptions,
            prefix_cache_queries=kv.prefix_cache_queries,
            prefix_cache_hits=kv.prefix_cache_hits,
            prompt_tokens_total=sched.prompt_tokens_total,
            generation_tokens_total=sched.generation_tokens_total,
            num_requests_finished=self.recorder.num_finished,
            time_to_first_token_seconds=ttft,
            request_queue_time_seconds=queue,
            e2e_request_latency_seconds=e2e,
            generation_throughput=self.recorder.throughput(now),
            prompt_throughput=self.recorder.prompt_throughput(now),
            engine_state=self.state,
        )

    @property
    def state(self) -> EngineState:
        """Idle, reading prompts (the last step fed prompt tokens) or generating."""
        if not self.scheduler.has_unfinished():
            return EngineState.IDLE
        return EngineState.READING_PROMPTS if self._reading_prompts else EngineState.GENERATING

    def close(self) -> None:
        """End every request and free the KV pool; the model goes with the last reference.

        The LoadedModel itself is left intact so a caller that owns it (a benchmark running
        several engines over one set of weights) can reuse it.
        """
        self._closed = True
        for seq in [*self.scheduler.running, *self.scheduler.waiting]:
            self.scheduler.finish(seq, FinishReason.ABORT)
        self.runner.kv_caches.clear()
        gc.collect()
        # Only the torch path has a CUDA cache to empty; the numpy path never imports torch.
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available():
            torch.cuda.empty_cache()


def _runner(
    loaded: LoadedModel, config: EngineConfig, num_blocks: int, structured: StructuredOutput
) -> Any:
    """The runner ``loaded.runner`` names: the numpy one (no torch), or the torch one."""
    if loaded.runner == NUMPY:
        from paged_llm.engine.model.cpu_runner import CpuRunner

        return CpuRunner(
            loaded,
            num_blocks,
            config.block_size,
            kv_dtype=config_kv_dtype_name(config, loaded),
            structured=structured,
        )
    from paged_llm.engine.model.runner import ModelRunner, config_kv_dtype

    return ModelRunner(
        loaded,
        num_blocks,
        config.block_size,
        config.attention_backend,
        kv_dtype=config_kv_dtype(config, loaded),
        structured=structured,
    )


def _seconds(start: float | None, end: float | None) -> str:
    """A duration for the log, or a dash when one end is unknown."""
    return "-" if start is None or end is None else f"{end - start:.3f} s"


def _log_finished(seq: Sequence) -> None:
    """One debug line per request with what a user needs to see where time went."""
    _LOGGER.debug(
        "Request %s (%s) %s: %d prompt tokens (%d cached), %d generated, queue wait %s, "
        "first token %s, total %s, %d preemptions",
        seq.request_id,
        seq.priority.name.lower(),
        seq.finish_reason or "ended",
        seq.num_prompt_tokens,
        seq.num_cached_tokens,
        seq.num_output_tokens,
        _seconds(seq.arrival_time, seq.first_scheduled_time),
        _seconds(seq.arrival_time, seq.first_token_time),
        _seconds(seq.arrival_time, seq.finished_time),
        seq.num_preemptions,
    )
