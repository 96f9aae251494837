"""The remote backend: an OpenAI-compatible server (this project's, vLLM, llama.cpp, Ollama)."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import math
import time
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
from paged_llm.metric_windows import LatencyWindows, RateWindow
from paged_llm.protocol.priority import to_vllm
from paged_llm.protocol.snapshot import EngineState, MetricsSnapshot

from .backend import BackendError, Delta, Sampling, ScoreQuery
from .score_plan import QueryTokens, build_plan, run_plan

# When the server does not say its context length (only vLLM and this project's do).
FALLBACK_CONTEXT = 4096
# Without the server's tokenizer: a conservative count (most tokenizers average 3.5 to 4.5
# bytes of English per token), so summaries split early rather than overflow.
BYTES_PER_TOKEN = 3
# A loading server that does not say how long to wait: the metrics poll's pace.
LOADING_RETRY_S = 5
# What the evaluate check scores: a short chat, its last prompt token read back.
PROBE_MESSAGES = ({"role": "user", "content": "Is the light on?"},)

_LOGGER = logging.getLogger(__package__)


def client_error(err: ClientError, url: str) -> BackendError:
    """The seam's error for a failed request to the server at ``url``."""
    reason = str(err)
    if isinstance(err, CannotConnectError):
        return BackendError("server_unreachable", reason)
    if isinstance(err, AuthenticationError):
        return BackendError("server_auth_failed", reason)
    if isinstance(err, ServerError) and err.loading:
        seconds = math.ceil(err.retry_after or LOADING_RETRY_S)
        return BackendError(
            "server_loading", reason, placeholders={"url": url, "seconds": str(seconds)}
        )
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


def _estimate(text: str) -> int:
    """A conservative token count of ``text`` without the server's tokenizer."""
    return math.ceil(len(text.encode("utf-8")) / BYTES_PER_TOKEN)


def _template_kwargs(sampling: Sampling) -> dict[str, Any] | None:
    """The chat template's reasoning switch, where the agent sets it.

    vLLM and paged-llm serve pass it to the template; one without the switch ignores it.
    """
    return None if sampling.thinking is None else {"enable_thinking": sampling.thinking}


class RemoteBackend:
    """Serves requests through an OpenAI-compatible server with Home Assistant's session."""

    def __init__(self, client: OpenAIClient, model: str, context_size: int | None = None) -> None:
        """Talk to ``model`` on the server behind ``client``."""
        self.client = client
        self.model = model
        self._context = context_size or FALLBACK_CONTEXT
        self._context_known = context_size is not None
        self._reachable = True
        # Whether the server's /health says it serves (it answers while it loads).
        self._ready = True
        self._has_metrics: bool | None = None
        self._reader = MetricsReader(model)
        # Time to first token per class and the token rate, as Home Assistant sees them.
        self._ttft = LatencyWindows()
        self._tokens = RateWindow()
        self._snapshot = MetricsSnapshot()
        # Whether the server takes announced voice queries (None: not asked yet).
        self._announces: bool | None = None
        self._announcing: asyncio.Task[None] | None = None
        # Whether the server gave what evaluating needs (None: not asked yet), and why not.
        self._evaluates: bool | None = None
        self._evaluate_reason = ""
        # Asked since the server last came (back): a server away may return as another one.
        self._evaluate_checked = False

    @property
    def available(self) -> bool:
        """Whether the server answered, ready to serve, the last time it was asked."""
        return self._reachable and self._ready

    @property
    def native_tools(self) -> bool:
        """Tools go to the server, which renders them with the model's template."""
        return True

    @property
    def can_evaluate(self) -> bool:
        """Whether the server gave token ids and prompt log probabilities when last asked."""
        return self._evaluates is True

    @property
    def context_size(self) -> int:
        """The model's context as the server reported it (or a conservative default)."""
        return self._context

    @property
    def context_known(self) -> bool:
        """Whether the server said its context (vLLM and paged-llm serve do; Ollama does not)."""
        return self._context_known

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
        return _estimate(text)

    async def async_count_prompt_tokens(
        self,
        messages: Sequence[Mapping[str, Any]],
        sampling: Sampling,
        tools: list[dict[str, Any]] | None = None,
    ) -> tuple[int, bool]:
        """The prompt's tokens as the server counts them, else an estimate of its text.

        vLLM's /tokenize (paged-llm serve has it too) renders the messages with the model's
        template: exact. A server that tokenizes only text counts the messages and tools
        without the template's own tokens, a little under the truth. Elsewhere (Ollama,
        llama.cpp's server) the conservative bytes estimate, marked as not exact.
        """
        count = await self.client.count_chat_tokens(
            self.model, messages, tools=tools, chat_template_kwargs=_template_kwargs(sampling)
        )
        if count is not None:
            return count, True
        texts = [str(m.get("content") or "") for m in messages]
        text = "\n".join([*texts, *(json.dumps(tool) for tool in tools or ())])
        count = await self.client.count_tokens(self.model, text)
        if count is not None:
            return count, True
        return _estimate(text), False

    def _reached(self, ok: bool, ready: bool | None = None, why: str = "") -> None:
        """Note whether the server answered (and, when known, is ready); log each change.

        One warning when the server goes away or starts loading, one info line when it
        serves again: an outage is not an error per poll.
        """
        was = self.available
        self._reachable = ok
        if ready is not None:
            self._ready = ready
        elif ok:
            self._ready = True
        now = self.available
        if was and not now:
            # It may come back as another server (llama.cpp's where ours was): ask again then.
            self._evaluate_checked = False
            _LOGGER.warning("The model's server at %s cannot serve now: %s", self.client.root, why)
        elif now and not was:
            _LOGGER.info("The model's server at %s serves again", self.client.root)

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
            min_p=sampling.min_p,
            seed=sampling.seed,
            priority=to_vllm(priority),
            tools=tools,
            tool_grammar=sampling.tool_grammar if tools else None,
            chat_template_kwargs=_template_kwargs(sampling),
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
                        self._ttft.add(priority, now - start)
                        first = False
                    counted += 1
                    self._tokens.add(now, 1)
                yield self._delta(chunk, counted)
        except ClientError as err:
            self._failed(err)
            raise client_error(err, self.client.root) from err

    async def async_score(self, queries: Sequence[ScoreQuery], priority: str) -> list[list[float]]:
        """Score continuations through the server's /tokenize and prompt log probabilities.

        The chat template is the server's (``/tokenize`` renders messages as a chat
        completion does); the prompt goes back as token ids to ``/v1/completions`` with
        vLLM's ``prompt_logprobs``. A server without either cannot evaluate: it says so
        rather than answer from anything else.
        """
        try:
            tokens = [await self._score_tokens(query) for query in queries]
            plan = build_plan(queries, tokens, self._context, generated=1)
            return await run_plan(plan, functools.partial(self._score_tail, to_vllm(priority)))
        except ClientError as err:
            self._failed(err)
            raise client_error(err, self.client.root) from err

    def _cannot_evaluate(self, what: str) -> BackendError:
        """The error of a server that lacks what evaluating needs (``what`` it lacks).

        The next poll asks the server again (a /tokenize that failed once may be a blip),
        and the AI task entity follows its answer.
        """
        self._evaluate_checked = False
        reason = f"{self.client.root} returns no {what}"
        return BackendError("evaluate_unsupported", reason, placeholders={})

    def _note_evaluates(self, evaluates: bool, reason: str = "") -> None:
        """Keep whether the server can evaluate; log a change once (not per poll)."""
        changed = evaluates != self._evaluates or reason != self._evaluate_reason
        self._evaluates, self._evaluate_reason = evaluates, reason
        self._evaluate_checked = True
        if not changed:
            return
        if not evaluates:
            _LOGGER.warning(
                "The model's server at %s cannot evaluate (ai_task.evaluate is not offered): %s",
                self.client.root,
                reason,
            )
        else:
            _LOGGER.debug("The model's server at %s can evaluate", self.client.root)

    async def _async_check_evaluate(self) -> None:
        """Ask the server for what scoring uses: /tokenize's ids and prompt_logprobs.

        The same two calls as an evaluation, on a short chat whose last prompt token is
        read back. A server without /tokenize, one that drops prompt_logprobs, or one that
        refuses the request (400) cannot evaluate. A server away, loading or too busy to
        answer in time leaves the question open: it is asked again at the next poll.
        """
        kwargs = {"enable_thinking": False}
        ids = await self.client.tokens(
            self.model, messages=list(PROBE_MESSAGES), chat_template_kwargs=kwargs
        )
        if not ids or len(ids) < 2:
            self._note_evaluates(False, f"{self.client.root} returns no token ids (/tokenize)")
            return
        try:
            values = await self.client.score_tail(self.model, ids, 1, to_vllm("background"))
        except AuthenticationError:
            raise
        except RequestError as err:
            self._note_evaluates(False, f"{self.client.root} refuses prompt_logprobs: {err}")
            return
        except ClientError as err:
            _LOGGER.debug("Whether %s can evaluate is asked again later: %s", self.client.root, err)
            return
        if values is None:
            what = "prompt log probabilities (prompt_logprobs)"
            self._note_evaluates(False, f"{self.client.root} returns no {what}")
            return
        self._note_evaluates(True)

    async def _score_tokens(self, query: ScoreQuery) -> QueryTokens:
        """A query's tokens by the server's tokenizer and template (see score_plan)."""
        kwargs = {"enable_thinking": False}
        first = {"role": "assistant", "content": query.continuations[0]}
        prompt = await self.client.tokens(
            self.model, messages=query.messages, chat_template_kwargs=kwargs
        )
        answered = await self.client.tokens(
            self.model, messages=[*query.messages, first], chat_template_kwargs=kwargs
        )
        continuations = [
            await self.client.tokens(self.model, text=text) for text in query.continuations
        ]
        if prompt is None or answered is None or any(ids is None for ids in continuations):
            raise self._cannot_evaluate("token ids (/tokenize)")
        return QueryTokens(prompt, answered, [ids or [] for ids in continuations])

    async def _score_tail(self, priority: int, ids: list[int], tail: int) -> float:
        """The summed log probability of the last ``tail`` of ``ids``."""
        values = await self.client.score_tail(self.model, ids, tail, priority)
        if values is None:
            raise self._cannot_evaluate("prompt log probabilities (prompt_logprobs)")
        return math.fsum(values)

    def _failed(self, err: ClientError) -> None:
        """Note what a failed call says about the server: away, or still loading."""
        if isinstance(err, CannotConnectError):
            self._reached(False, why=str(err))
        elif isinstance(err, ServerError) and err.loading:
            self._reached(True, ready=False, why="it is loading its model")

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
            if (extra := chunk.usage.completion_tokens - counted) > 0:
                self._tokens.add(time.monotonic(), extra)
        return delta

    def metrics(self) -> MetricsSnapshot:
        """The last snapshot read."""
        return self._snapshot

    async def async_refresh_metrics(self) -> MetricsSnapshot:
        """Ask whether the server serves; read its /metrics (vLLM's names) and our timings.

        A server that is away or still loading is no error here: the snapshot says so
        (engine state ``unloaded`` or ``loading``), the backend turns unavailable and one
        warning is logged; the entities follow :attr:`available`.
        """
        try:
            if await self.client.health() is False:
                self._reached(True, ready=False, why="it is loading its model")
                return self._set_snapshot(MetricsSnapshot(engine_state=EngineState.LOADING))
            if not self._context_known:
                await self._read_context()
            text = await self._metrics_text()
            if text is None:
                await self.client.models()  # is the server there at all?
            if not self._evaluate_checked:
                # At setup (the first refresh) and after the server was away or loading.
                await self._async_check_evaluate()
        except CannotConnectError as err:
            self._reached(False, why=str(err))
            return self._set_snapshot(MetricsSnapshot(engine_state=EngineState.UNLOADED))
        except ClientError as err:
            self._failed(err)
            raise client_error(err, self.client.root) from err
        self._reached(True, ready=True)
        now = time.monotonic()
        snapshot = MetricsSnapshot(timestamp=now)
        if text is not None:
            scraped = self._reader.read(text, now)
            self._has_metrics = bool(self._reader.vllm_names)
            if self._has_metrics:
                snapshot = scraped
        else:
            self._has_metrics = False
        return self._set_snapshot(snapshot)

    async def _metrics_text(self) -> str | None:
        """The server's /metrics text, or None where it has none or keeps it from us."""
        if self._has_metrics is False:
            return None
        try:
            return await self.client.metrics_text()
        except (AuthenticationError, RequestError, ServerError):
            # /metrics protected or broken: the sensors show this side's timings.
            return None

    async def _read_context(self) -> None:
        """The model's context, once the server reports it (a loading server may not)."""
        info = next((m for m in await self.client.models() if m.id == self.model), None)
        if info is not None and info.max_model_len:
            self._context, self._context_known = int(info.max_model_len), True

    def _set_snapshot(self, snapshot: MetricsSnapshot) -> MetricsSnapshot:
        """Keep ``snapshot`` with this side's time to first token and token rate."""
        now = time.monotonic()
        self._snapshot = replace(
            snapshot,
            time_to_first_token_seconds=self._ttft.percentiles(),
            generation_throughput=self._tokens.rate(now),
        )
        return self._snapshot

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
            "ready": self._ready,
            "server_metrics": self._has_metrics,
            "sends_priority": self.client.sends_priority,
            # Whether the server takes a satellite's announced voice queries (None: not yet asked).
            "takes_voice_announcements": self._announces,
            # Whether ai_task.evaluate is offered (None: not asked yet), and why not.
            "evaluates": self._evaluates,
            "cannot_evaluate_because": self._evaluate_reason or None,
            "timeout": self.client.timeout,
        }

    async def async_close(self) -> None:
        """End an announcement still in flight; the session belongs to Home Assistant."""
        if self._announcing is not None and not self._announcing.done():
            self._announcing.cancel()
