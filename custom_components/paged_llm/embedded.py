"""The embedded backend: the engine in Home Assistant's process, unloaded when idle."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from paged_llm.protocol.snapshot import MetricsSnapshot

from .backend import BackendError, Delta, Sampling, ScoreQuery
from .const import LOGGER
from .errors import load_error_key
from .prompt import PLAIN_STOP, chat_template, render_plain, template_knows_tools
from .score_plan import QueryTokens, build_plan, run_plan

if TYPE_CHECKING:
    from paged_llm.engine.api import (
        AsyncEngine,
        Constraint,
        EngineConfig,
        EngineError,
        SamplingParams,
    )

# Rejections with a translation of their own; any other is "rejected", naming its code.
_KNOWN_REJECTIONS = frozenset(
    {"empty_prompt", "context_too_long", "exceeds_kv_pool", "invalid_token", "queue_full"}
)


def backend_error(err: EngineError, restart: bool = False) -> BackendError:
    """The seam's error for an error the engine raised on a request."""
    from paged_llm.engine.api import RequestRejected, error_info

    info = error_info(err)
    if isinstance(err, RequestRejected):
        key = f"rejected_{info.code}" if info.code in _KNOWN_REJECTIONS else "rejected"
        return BackendError(key, info.message, caller=info.caller, placeholders={"code": info.code})
    if info.code in ("invalid_sampling_params", "invalid_argument"):
        return BackendError(info.code, info.message, caller=True)
    if info.code == "engine_dead":
        return BackendError("engine_dead", info.message, restart=restart)
    return BackendError("generation_failed", info.message)


def _constrained(params: SamplingParams, constraint: Constraint, template: str | None) -> Any:
    """``params`` held to ``constraint`` (tool calls in the format of ``template``)."""
    return dataclasses.replace(params, **constraint.fields(template))


class EmbeddedBackend:
    """Runs requests on an AsyncEngine in this process, unloading it when idle if asked."""

    def __init__(self, engine: AsyncEngine, idle_unload_s: float = 0.0) -> None:
        """Serve through a started engine; unload it after ``idle_unload_s`` (0: never)."""
        self.engine = engine
        self.idle_unload_s = idle_unload_s
        self.unloaded = False
        self._busy = 0
        self._timer: asyncio.TimerHandle | None = None
        self._lock = asyncio.Lock()
        # Closed on purpose (the entry unloads or reloads, Home Assistant stops): requests
        # the stop ends are told the engine is restarting, not that it broke.
        self._closing = False
        # A crash asks for one reload, however many requests it ends.
        self._restart_asked = False
        # What the model is, kept across idle unloads (the same model loads again).
        self._last_info: Any = None
        self._native_tools: bool | None = None
        # Each subscriber, with how to leave the current engine's pushes (None: unloaded).
        self._subscribers: dict[Callable[[MetricsSnapshot], None], Callable[[], None] | None] = {}

    @property
    def loaded(self) -> bool:
        """Whether the model is in memory now."""
        return not self.unloaded and bool(self.engine.is_running)

    async def _async_ensure_loaded(self) -> None:
        """Load the model again after an idle unload (the request waits for it)."""
        async with self._lock:
            if not self.unloaded:
                return
            from paged_llm.engine.api import start_engine

            try:
                engine = await start_engine(self.engine.config)
            except Exception as err:
                raise BackendError(load_error_key(err), str(err)) from err
            self.engine, self.unloaded = engine, False
            for callback in self._subscribers:
                self._subscribers[callback] = engine.subscribe(callback)
            self._notify()

    def _notify(self) -> None:
        """Push the current snapshot, so whoever watches sees the loaded state change."""
        snapshot = self.engine.metrics()
        for callback in list(self._subscribers):
            callback(snapshot)

    def _arm(self) -> None:
        """Start the idle countdown once nothing runs."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.idle_unload_s > 0 and self._busy == 0 and not self.unloaded:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(
                self.idle_unload_s, lambda: loop.create_task(self._async_unload_idle())
            )

    async def _async_unload_idle(self) -> None:
        """Free the model and the KV pool; the next request loads them again."""
        async with self._lock:
            if self._busy or self.unloaded:
                return
            with contextlib.suppress(BackendError):  # a crashed engine: nothing to keep
                self._info()  # kept: what the model is stays known while it is unloaded
            for callback, leave in self._subscribers.items():
                if leave is not None:
                    leave()
                self._subscribers[callback] = None
            await self.engine.stop()
            self.unloaded = True
        LOGGER.info("Unloaded %s after %.0f idle seconds", self.config.model, self.idle_unload_s)
        self._notify()

    @property
    def config(self) -> EngineConfig:
        """The engine's settings."""
        return self.engine.config

    @property
    def available(self) -> bool:
        """Whether the engine's thread runs, or it was unloaded on purpose and can reload."""
        return self.unloaded or bool(self.engine.is_running)

    def _error(self, err: EngineError, restart: bool = False) -> BackendError:
        """The seam's error for ``err``, knowing why the engine stopped.

        A stop this backend asked for (an unload or a reload) is ``engine_restarting``.
        With ``restart`` (a request, whose caller reloads the entry), a crash asks for a
        restart, once; anything else maps as :func:`backend_error` says.
        """
        from paged_llm.engine.api import EngineDeadError

        if not isinstance(err, EngineDeadError):
            return backend_error(err)
        if self._closing and self.engine.error is None:
            return BackendError("engine_restarting", str(err))
        crashed = restart and self.engine.error is not None and not self._restart_asked
        self._restart_asked = self._restart_asked or crashed
        return backend_error(err, restart=crashed)

    def _tokenizer(self) -> Any:
        """The model's tokenizer, or a seam error once the engine is gone."""
        from paged_llm.engine.api import EngineDeadError

        try:
            return self.engine.tokenizer
        except EngineDeadError as err:
            raise self._error(err) from err

    @property
    def native_tools(self) -> bool:
        """Whether the model's chat template renders a tools list itself."""
        try:
            self._native_tools = template_knows_tools(self._tokenizer())
        except BackendError:
            # Unloaded on purpose (idle): the last answer stands, as _info's do.
            asleep = self.engine.error is None and not self._closing
            if not asleep or self._native_tools is None:
                raise
        return self._native_tools

    @property
    def can_evaluate(self) -> bool:
        """The engine scores prompt tokens itself: every model here can evaluate."""
        return True

    def _info(self) -> Any:
        """The engine's model, pool and limits, or a seam error once the engine is gone.

        Unloaded on purpose (idle), the last ones stand: the next request loads the same
        model with the same settings, and a caller sizing its work (a summary's chunks)
        must not be told the engine is dead while it is only asleep.
        """
        from paged_llm.engine.api import EngineDeadError

        try:
            info = self.engine.info
        except EngineDeadError as err:
            asleep = self.engine.error is None and not self._closing
            if asleep and self._last_info is not None:
                return self._last_info
            raise self._error(err) from err
        self._last_info = info
        return info

    @property
    def context_size(self) -> int:
        """The engine's context length."""
        return int(self._info().max_model_len)

    @property
    def context_known(self) -> bool:
        """The engine knows its own."""
        return True

    @property
    def kv_pool_tokens(self) -> int:
        """Tokens the engine's KV pool holds."""
        return int(self._info().pool_tokens)

    @contextlib.asynccontextmanager
    async def _in_use(self) -> AsyncIterator[None]:
        """Hold the model loaded while a request or a count uses it (no idle unload under it).

        A count that loaded the model and was then unloaded under it by an idle timer
        armed before it came asked a stopped engine, and its caller got "the engine is
        stopped" for a request that had only just arrived.
        """
        self._busy += 1
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        try:
            await self._async_ensure_loaded()
            yield
        finally:
            self._busy -= 1
            self._arm()

    async def async_count_tokens(self, text: str) -> int:
        """Tokens in ``text`` by the model's tokenizer (off the event loop)."""
        async with self._in_use():
            tokenizer = self._tokenizer()
            ids = await self._executor(tokenizer.encode, text, add_special_tokens=False)
        return len(ids)

    async def _executor(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run blocking work in the default executor."""
        return await asyncio.get_running_loop().run_in_executor(
            None, functools.partial(func, *args, **kwargs)
        )

    async def stream(
        self,
        messages: Sequence[Mapping[str, Any]],
        sampling: Sampling,
        priority: str,
        tools: list[dict[str, Any]] | None = None,
    ) -> AsyncIterator[Delta]:
        """Stream from the engine: chat messages through the template, or a transcript."""
        async with self._in_use():
            async for delta in self._stream(messages, sampling, priority, tools):
                yield delta

    async def async_score(self, queries: Sequence[ScoreQuery], priority: str) -> list[list[float]]:
        """Score continuations with prompt log probabilities (see score_plan), nothing generated."""
        from paged_llm.engine.api import EngineError

        async with self._in_use():
            try:
                tokens = [await self._score_tokens(query) for query in queries]
                plan = build_plan(queries, tokens, self.context_size)
                return await run_plan(plan, functools.partial(self._score_tail, priority))
            except EngineError as err:
                raise self._error(err, restart=True) from err

    async def _score_tokens(self, query: ScoreQuery) -> QueryTokens:
        """A query's tokens: its prompt, its first answer in the conversation, each answer."""
        # Answers come without reasoning: a template's switch, where it has one, is off.
        sampling = Sampling(max_tokens=1, temperature=0.0, thinking=False)
        prompt, kwargs, _ = self._prompt(query.messages, sampling)
        first = {"role": "assistant", "content": query.continuations[0]}
        answered, _, _ = self._prompt([*query.messages, first], sampling)
        engine = self.engine
        return QueryTokens(
            prompt=await engine.tokenize(prompt, None, kwargs),
            answered=await engine.tokenize(answered, None, kwargs),
            continuations=[
                await engine.tokenize(text, add_special_tokens=False)
                for text in query.continuations
            ],
        )

    async def _score_tail(self, priority: str, ids: list[int], tail: int) -> float:
        """The summed log probability of the last ``tail`` of ``ids`` (one scoring request).

        A tail of 0 reads ``ids`` into the prefix cache: a plain request of one token.
        """
        from paged_llm.engine.api import SamplingParams

        if tail == 0:
            read = SamplingParams(temperature=0.0, max_tokens=1)
            async for _out in self.engine.generate(ids, read, priority):
                pass
            return 0.0
        params = SamplingParams(
            temperature=0.0, max_tokens=0, prompt_logprobs=0, prompt_logprobs_from=-tail
        )
        scored: list[Any] = []
        async for out in self.engine.generate(ids, params, priority):
            if out.prompt_logprobs is not None:
                scored = out.prompt_logprobs[-tail:]
        if len(scored) != tail or any(record is None for record in scored):
            raise BackendError("generation_failed", "the engine scored no prompt tokens")
        return float(sum(record.logprob for record in scored))

    async def _stream(
        self,
        messages: Sequence[Mapping[str, Any]],
        sampling: Sampling,
        priority: str,
        tools: list[dict[str, Any]] | None,
    ) -> AsyncIterator[Delta]:
        """One request on the loaded engine."""
        from paged_llm.engine.api import EngineError, sampling_params

        prompt, kwargs, templated = self._prompt(messages, sampling)
        try:
            params = sampling_params(
                max_tokens=sampling.max_tokens,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                top_k=sampling.top_k,
                min_p=sampling.min_p,
                seed=sampling.seed,
                stop=() if templated else PLAIN_STOP,
                repetition_penalty=sampling.repetition_penalty,
                frequency_penalty=sampling.frequency_penalty,
                presence_penalty=sampling.presence_penalty,
            )
            params = await self._constrain(params, sampling)
            async for out in self.engine.generate(
                prompt, params, priority, tools=tools, chat_template_kwargs=kwargs
            ):
                yield Delta(
                    text=out.text,
                    finished=out.finished,
                    finish_reason=str(out.finish_reason) if out.finish_reason else None,
                    prompt_tokens=out.prompt_tokens,
                    completion_tokens=out.completion_tokens,
                    cached_tokens=out.cached_tokens,
                )
        except EngineError as err:
            raise self._error(err, restart=True) from err

    def _prompt(
        self, messages: Sequence[Mapping[str, Any]], sampling: Sampling
    ) -> tuple[str | list[dict[str, Any]], dict[str, Any] | None, bool]:
        """What the engine gets for chat messages: prompt, template variables, templated.

        Messages go through the model's chat template (with its reasoning switch as the
        agent sets it); a model without one (a base model) gets a plain transcript. Both
        generation and counting take this, so a count is the request's prompt tokens.
        """
        if chat_template(self._tokenizer()) is not None:
            return [dict(m) for m in messages], self._template_kwargs(sampling), True
        return render_plain([dict(m) for m in messages]), None, False

    async def async_count_prompt_tokens(
        self,
        messages: Sequence[Mapping[str, Any]],
        sampling: Sampling,
        tools: list[dict[str, Any]] | None = None,
    ) -> tuple[int, bool]:
        """The exact prompt tokens of a request: the engine's own templating and tokenizer.

        The same path generate takes (off the event loop), so the count equals the request's
        reported prompt tokens.
        """
        from paged_llm.engine.api import EngineError

        async with self._in_use():
            prompt, kwargs, _ = self._prompt(messages, sampling)
            try:
                ids = await self.engine.tokenize(prompt, tools, kwargs)
            except EngineError as err:
                raise self._error(err) from err
        return len(ids), True

    def _template_kwargs(self, sampling: Sampling) -> dict[str, Any] | None:
        """The chat template's reasoning switch, where it has one and the agent sets it."""
        template = chat_template(self._tokenizer()) or ""
        if sampling.thinking is None or "enable_thinking" not in template:
            return None
        return {"enable_thinking": sampling.thinking}

    async def _constrain(self, params: SamplingParams, sampling: Sampling) -> SamplingParams:
        """Hold decoding to the response format, or to text-or-calls of the offered tools.

        A schema the grammar library cannot handle must not fail the request: tools
        narrowed to the home fall back to the tools as offered, and what still cannot be
        compiled is generated freely (an AI task's answer is still checked); each cause is
        logged once.
        """
        from paged_llm.engine.api import Constraint, first_compiled

        response_format = sampling.response_format or {}
        template = None
        if response_format.get("type") == "json_schema":
            constraints = [Constraint(json_schema=response_format["json_schema"]["schema"])]
        elif response_format.get("type") == "json_object":
            constraints = [Constraint(json_object=True)]
        elif sampling.tool_grammar:
            tool_lists = [sampling.tool_grammar, sampling.plain_tools]
            constraints = [Constraint(tools=tools) for tools in tool_lists if tools]
            # A template that knows no tools gets the Hermes instructions in the prompt.
            template = chat_template(self._tokenizer()) if self.native_tools else None
        else:
            return params
        candidates = [
            functools.partial(_constrained, params, constraint, template)
            for constraint in constraints
        ]
        return await first_compiled(self.engine, candidates, LOGGER) or params

    def metrics(self) -> MetricsSnapshot:
        """The engine's latest snapshot."""
        return self.engine.metrics()

    async def async_refresh_metrics(self) -> MetricsSnapshot:
        """The engine's latest snapshot (the engine pushes the others)."""
        return self.engine.metrics()

    def subscribe(self, callback: Callable[[MetricsSnapshot], None]) -> Callable[[], None]:
        """Snapshots pushed by the engine's thread, at most about once a second."""
        self._subscribers[callback] = None if self.unloaded else self.engine.subscribe(callback)

        def unsubscribe() -> None:
            """Stop pushing to ``callback``, from this engine and any later one."""
            if (leave := self._subscribers.pop(callback, None)) is not None:
                leave()

        # Setup subscribes once the entry is ready: from then on, idle time counts.
        self._arm()
        return unsubscribe

    def expect_interactive(self) -> None:
        """Hold the engine's latency budget; an unloaded model stays unloaded until asked.

        A wake word may start a pipeline whose agent is not ours, so it is not worth a load.
        """
        if self.loaded:
            self.engine.expect_interactive()

    async def block_map(self) -> dict[str, Any]:
        """The KV pool's block map, taken on the engine thread (for the dashboard card)."""
        block_map = await self.engine.block_map()
        result: dict[str, Any] = block_map.as_dict()
        return result

    def check_settings(self, config: EngineConfig) -> None:
        """Raise KVBudgetError when new settings cannot hold one full sequence (blocking).

        Exact only when the running engine already has the model on the same device and
        dtype; otherwise the check is left to the restart.
        """
        self.engine.check_config(config)

    def diagnostics(self) -> dict[str, Any]:
        """The engine's settings, model, KV pool and latest metrics."""
        from paged_llm.engine.api import EngineDeadError

        engine = self.engine
        config = engine.config
        figures: dict[str, Any] = {
            "backend": "embedded",
            "loaded": self.loaded,
            "idle_unload_s": self.idle_unload_s,
            "is_running": engine.is_running,
            "error": repr(engine.error) if engine.error else None,
            "config": {
                **asdict(config),
                "cache_dir": str(config.cache_dir),
                "kv_layout": str(config.kv_layout),
            },
        }
        try:
            info = engine.info
        except EngineDeadError:
            return figures
        figures.update(
            {
                "model": info.model,
                "device": info.device,
                "dtype": info.dtype,
                "weights": info.weights,
                "attention": info.attention,
                "forward": info.forward,
                "max_model_len": info.max_model_len,
                "num_kv_blocks": info.num_kv_blocks,
                "block_size": info.block_size,
                "eos_token_ids": list(info.eos_token_ids),
            }
        )
        return figures

    async def async_close(self) -> None:
        """Stop the engine's thread and free the model and the KV pool."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.idle_unload_s = 0.0
        self._closing = True
        await self.engine.stop()
