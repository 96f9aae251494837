"""The remote backend: an OpenAI-compatible server (this project's, vLLM, llama.cpp, Ollama)."""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from homeassistant.helpers import llm

from paged_llm.client import (
    AuthenticationError,
    CannotConnectError,
    ChatChunk,
    ClientError,
    MetricsReader,
    OpenAIClient,
    RequestError,
    ServerError,
    chat_request,
)
from paged_llm.protocol.priority import to_vllm
from paged_llm.protocol.snapshot import MetricsSnapshot, percentiles

from .backend import BackendError, Delta, Sampling
from .const import PRIORITIES

# When the server does not say its context length (only vLLM and this project's do).
FALLBACK_CONTEXT = 4096
# Without the server's tokenizer: a conservative count (most tokenizers average 3.5 to 4.5
# bytes of English per token), so summaries split early rather than overflow.
BYTES_PER_TOKEN = 3
WINDOW_REQUESTS = 256
THROUGHPUT_WINDOW_S = 10.0


def client_error(err: ClientError) -> BackendError:
    """The seam's error for a failed request to the server."""
    reason = str(err)
    if isinstance(err, CannotConnectError):
        return BackendError("server_unreachable", reason)
    if isinstance(err, AuthenticationError):
        return BackendError("server_auth_failed", reason)
    if isinstance(err, ServerError):
        key = "rejected_queue_full" if err.status == 503 else "server_error"
        return BackendError(key, reason, placeholders={"code": str(err.status)})
    if isinstance(err, RequestError):
        return BackendError("server_rejected", reason, caller=True)
    return BackendError("generation_failed", reason)


def _tool_input(call_id: str, name: str, arguments: str) -> llm.ToolInput:
    """A server's tool call as Home Assistant's tool input."""
    try:
        args = json.loads(arguments) if arguments.strip() else {}
    except json.JSONDecodeError:
        args = {}
    return llm.ToolInput(
        tool_name=name, tool_args=args if isinstance(args, dict) else {}, id=call_id
    )


class _Timings:
    """Time to first token per class and the token rate, as Home Assistant sees them."""

    def __init__(self) -> None:
        self.ttft: dict[str, deque[float]] = {
            name: deque(maxlen=WINDOW_REQUESTS) for name in PRIORITIES
        }
        self._tokens: deque[tuple[float, int]] = deque()

    def first_token(self, priority: str, seconds: float) -> None:
        """Record one request's time to first token."""
        self.ttft.setdefault(priority, deque(maxlen=WINDOW_REQUESTS)).append(seconds)

    def tokens(self, now: float, count: int) -> None:
        """Count generated tokens that arrived now."""
        if count > 0:
            self._tokens.append((now, count))

    def throughput(self, now: float) -> float:
        """Tokens per second over the recent window (0 once nothing arrives)."""
        while self._tokens and self._tokens[0][0] < now - THROUGHPUT_WINDOW_S:
            self._tokens.popleft()
        if not self._tokens:
            return 0.0
        span = max(now - self._tokens[0][0], 1.0)
        return sum(count for _, count in self._tokens) / span


class RemoteBackend:
    """Serves requests through an OpenAI-compatible server with Home Assistant's session."""

    def __init__(self, client: OpenAIClient, model: str, context_size: int | None = None) -> None:
        """Talk to ``model`` on the server behind ``client``."""
        self.client = client
        self.model = model
        self._context = context_size or FALLBACK_CONTEXT
        self._reachable = True
        self._has_metrics: bool | None = None
        self._reader = MetricsReader(model)
        self._timings = _Timings()
        self._snapshot = MetricsSnapshot()
        # Whether the server takes announced voice queries (None: not asked yet).
        self._announces: bool | None = None
        self._announcing: asyncio.Task[None] | None = None

    @property
    def available(self) -> bool:
        """Whether the server answered the last time it was asked."""
        return self._reachable

    @property
    def native_tools(self) -> bool:
        """Tools go to the server, which renders them with the model's template."""
        return True

    @property
    def context_size(self) -> int:
        """The model's context as the server reported it (or a conservative default)."""
        return self._context

    async def block_map(self) -> dict[str, Any] | None:
        """The server's block map (this project's server has one; others give None)."""
        block_map: dict[str, Any] | None = await self.client.block_map()
        return block_map

    @property
    def kv_pool_tokens(self) -> None:
        """A server's pool is its own to share out; it is not known here."""
        return None

    async def async_count_tokens(self, text: str) -> int:
        """The server's count where it offers one (vLLM's /tokenize), else an estimate."""
        count = await self.client.count_tokens(self.model, text)
        if count is not None:
            return int(count)
        return math.ceil(len(text.encode("utf-8")) / BYTES_PER_TOKEN)

    def _reached(self, ok: bool) -> None:
        """Note whether the server answered."""
        self._reachable = ok

    async def stream(
        self,
        messages: Sequence[Mapping[str, Any]],
        sampling: Sampling,
        priority: str,
        tools: list[dict[str, Any]] | None = None,
    ) -> AsyncIterator[Delta]:
        """Stream a chat completion; time to first token and tokens per second measured here."""
        body = chat_request(
            self.model,
            messages,
            max_tokens=sampling.max_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p if sampling.top_p < 1 else None,
            top_k=sampling.top_k,
            seed=sampling.seed,
            priority=to_vllm(priority),
            tools=tools,
            response_format=sampling.response_format,
            repetition_penalty=sampling.repetition_penalty,
            frequency_penalty=sampling.frequency_penalty,
            presence_penalty=sampling.presence_penalty,
        )
        start = time.monotonic()
        first = True
        counted = 0
        try:
            async for chunk in self.client.stream_chat(body):
                now = time.monotonic()
                self._reached(True)
                if chunk.content or chunk.reasoning:
                    if first:
                        self._timings.first_token(priority, now - start)
                        first = False
                    counted += 1
                    self._timings.tokens(now, 1)
                yield self._delta(chunk, counted)
        except ClientError as err:
            if isinstance(err, CannotConnectError):
                self._reached(False)
            raise client_error(err) from err

    def _delta(self, chunk: ChatChunk, counted: int) -> Delta:
        """The seam's delta for one chunk; the last one carries totals and tool calls."""
        finished = chunk.finish_reason is not None or chunk.usage is not None
        delta = Delta(
            text=chunk.content,
            reasoning=chunk.reasoning,
            tool_calls=[_tool_input(c.id, c.name, c.arguments) for c in chunk.tool_calls],
            finished=finished,
            finish_reason=chunk.finish_reason,
        )
        if chunk.usage is not None:
            delta.prompt_tokens = chunk.usage.prompt_tokens
            delta.completion_tokens = chunk.usage.completion_tokens
            delta.cached_tokens = chunk.usage.cached_tokens
            # Chunks may carry several tokens: the usage count is the exact one.
            self._timings.tokens(time.monotonic(), chunk.usage.completion_tokens - counted)
        return delta

    def metrics(self) -> MetricsSnapshot:
        """The last snapshot read."""
        return self._snapshot

    async def async_refresh_metrics(self) -> MetricsSnapshot:
        """Read the server's /metrics (vLLM's names) and add this side's own timings."""
        text: str | None = None
        try:
            if self._has_metrics is not False:
                try:
                    text = await self.client.metrics_text()
                except (AuthenticationError, RequestError, ServerError):
                    # /metrics protected or broken: the sensors show this side's timings.
                    text = None
            if text is None:
                await self.client.models()  # is the server there at all?
        except ClientError as err:
            if isinstance(err, CannotConnectError):
                self._reached(False)
            raise client_error(err) from err
        self._reached(True)
        now = time.monotonic()
        snapshot = MetricsSnapshot(timestamp=now)
        if text is not None:
            scraped = self._reader.read(text, now)
            self._has_metrics = bool(self._reader.vllm_names)
            if self._has_metrics:
                snapshot = scraped
        else:
            self._has_metrics = False
        snapshot = replace(
            snapshot,
            time_to_first_token_seconds={
                name: percentiles(list(window)) for name, window in self._timings.ttft.items()
            },
            generation_throughput=self._timings.throughput(now),
        )
        self._snapshot = snapshot
        return snapshot

    def subscribe(self, callback: Callable[[MetricsSnapshot], None]) -> Callable[[], None]:
        """Nothing is pushed: the coordinator polls."""
        return lambda: None

    def expect_interactive(self) -> None:
        """Tell a Paged LLM server, in the background; other servers are asked only once."""
        if self._announces is False:
            return
        if self._announcing is not None and not self._announcing.done():
            return
        self._announcing = asyncio.get_running_loop().create_task(self._async_announce())

    async def _async_announce(self) -> None:
        """POST the announcement; remember a server without the call (None: ask next time)."""
        taken = await self.client.expect_interactive()
        if taken is not None:
            self._announces = taken

    def diagnostics(self) -> dict[str, Any]:
        """Where the server is and what it said about itself (never the API key)."""
        return {
            "backend": "remote",
            "url": self.client.root,
            "model": self.model,
            "context_size": self._context,
            "reachable": self._reachable,
            "server_metrics": self._has_metrics,
            "sends_priority": self.client.sends_priority,
            # Whether the server takes a satellite's announced voice queries (None: not yet asked).
            "takes_voice_announcements": self._announces,
            "timeout": self.client.timeout,
        }

    async def async_close(self) -> None:
        """End an announcement still in flight; the session belongs to Home Assistant."""
        if self._announcing is not None and not self._announcing.done():
            self._announcing.cancel()
