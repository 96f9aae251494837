"""What the engine hands back: per-request deltas and timings, per-step traces."""

from __future__ import annotations

from dataclasses import dataclass

from paged_llm.engine.core.logprob import TokenLogprob as TokenLogprob  # re-exported
from paged_llm.engine.core.sequence import FinishReason


@dataclass(slots=True, frozen=True)
class RequestTiming:
    """A finished request's monotonic timestamps, for latency figures per request."""

    arrival: float
    first_scheduled: float | None
    first_token: float | None
    finished: float | None
    num_preemptions: int

    @property
    def queue_time(self) -> float | None:
        """Seconds from arrival to first being scheduled."""
        return None if self.first_scheduled is None else self.first_scheduled - self.arrival

    @property
    def time_to_first_token(self) -> float | None:
        """Seconds from arrival to the first generated token."""
        return None if self.first_token is None else self.first_token - self.arrival


@dataclass(slots=True)
class RequestOutput:
    """What one step produced for one request: a text delta, and the totals once it ends."""

    request_id: str
    text: str
    token_ids: list[int]
    finished: bool
    finish_reason: FinishReason | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    timing: RequestTiming | None = None
    # Set when this request failed inside a step (finish_reason ERROR); others went on.
    error: Exception | None = None
    # One record per token of ``token_ids`` when the request asked (SamplingParams.logprobs).
    logprobs: list[TokenLogprob] | None = None
    # With the first output of a request that asked (SamplingParams.prompt_logprobs): one
    # entry per prompt token, None where unscored (the first, those before prompt_logprobs_from).
    prompt_logprobs: list[TokenLogprob | None] | None = None


@dataclass(slots=True, frozen=True)
class StepTrace:
    """One step's figures, recorded when ``LLMEngine.trace`` is a list (benchmarks)."""

    time: float
    duration: float
    forward: float
    num_batched_tokens: int
    num_chunks: int
    num_running: int
    num_waiting: int
    kv_blocks_used: int
    kv_live_tokens: int
    kv_allocated_slots: int
    num_preemptions: int
