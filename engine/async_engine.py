"""The asyncio face of the engine: turns on the step thread, streamed deltas, pushed metrics."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import queue
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from typing import Any

from paged_llm.engine.config import EngineConfig
from paged_llm.engine.core.kv.block_map import BlockMap, take_block_map
from paged_llm.engine.core.kv.sizing import plan_kv_pool
from paged_llm.engine.core.sequence import FinishReason, Priority, SamplingParams
from paged_llm.engine.errors import EngineDeadError, RequestRejected
from paged_llm.engine.info import EngineInfo
from paged_llm.engine.llm_engine import LLMEngine, Prompt
from paged_llm.engine.metrics import EngineState, MetricsSnapshot
from paged_llm.engine.model.file_identity import FileIdentity, ModelFileChanged, model_file
from paged_llm.engine.model.loaded import NUMPY, LoadedModel
from paged_llm.engine.model.selector import load_model, runner_for
from paged_llm.engine.outputs import RequestOutput, StepTrace
from paged_llm.engine.step_thread import STEP_THREAD
from paged_llm.engine.validation import (
    check_params,
    check_priority,
    check_prompt,
    check_request_id,
    check_template_kwargs,
    check_tools,
)

_LOGGER = logging.getLogger(__name__)

PUBLISH_INTERVAL_S = 1.0
SNAPSHOT_INTERVAL_S = 0.2


@dataclass(slots=True)
class _Stream:
    """Where one request's outputs go: a queue owned by the caller's event loop.

    ``aborted`` (and a None in the queue, to wake the consumer) means the request was
    aborted: the stream ends at once, even before outputs already queued.
    """

    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[RequestOutput | BaseException | None]
    aborted: bool = False

    def put(self, item: RequestOutput | BaseException | None) -> None:
        """Hand an item over from the engine thread."""
        # A closed loop raises RuntimeError: its consumer is gone and nobody is listening.
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)


@dataclass(slots=True)
class _Add:
    """Command: admit a tokenized request."""

    request_id: str
    token_ids: list[int]
    params: SamplingParams
    priority: Priority
    arrival_time: float


@dataclass(slots=True)
class _Abort:
    """Command: abort a request."""

    request_id: str


@dataclass(slots=True)
class _Expect:
    """Command: an interactive request is on its way; hold the latency policy's budget."""


@dataclass(slots=True)
class _TakeBlockMap:
    """Command: take a block map between steps and hand it to a future on its loop."""

    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[BlockMap]

    def run(self, engine: LLMEngine) -> None:
        """Take the map on the engine thread, where the pool is consistent."""
        sched = engine.scheduler
        block_map = take_block_map(
            engine.kv_manager,
            sched.running,
            timestamp=engine.clock(),
            num_waiting=sched.num_waiting,
            num_preemptions=sched.num_preemptions,
        )

        _settle(self.loop, self.future, block_map)


def _settle[T](
    loop: asyncio.AbstractEventLoop,
    future: asyncio.Future[T],
    result: T,
    err: BaseException | None = None,
) -> None:
    """From another thread: finish ``future`` on its loop, unless its caller gave up."""

    def settle() -> None:
        if future.done():  # cancelled: the caller gave up
            return
        if err is None:
            future.set_result(result)
        else:
            future.set_exception(err)

    with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
        loop.call_soon_threadsafe(settle)


class AsyncEngine:
    """Hosts an LLMEngine on the process's step thread and serves many asyncio consumers.

    ``async for out in engine.generate(...)`` streams RequestOutput deltas; leaving the
    loop early or cancelling the task aborts the request and frees its KV blocks.
    """

    def __init__(self, config: EngineConfig, loaded: LoadedModel | None = None) -> None:
        """Prepare; nothing is loaded until ``start``."""
        self.config = config
        self._loaded = loaded
        self._engine: LLMEngine | None = None
        # The thread that loads the model; it ends before the engine takes turns.
        self._loader: threading.Thread | None = None
        self._attached = False
        # Held during a turn on the step thread: stop() waits for the one under way.
        self._turn_lock = threading.Lock()
        self._commands: queue.SimpleQueue[_Add | _Abort | _Expect | _TakeBlockMap] = (
            queue.SimpleQueue()
        )
        self._stopping = False
        self._error: BaseException | None = None
        # The GGUF file the model maps, as it was when loaded (None: not a file of its own).
        self._model_file: FileIdentity | None = None
        self._streams: dict[str, _Stream] = {}
        self._lock = threading.Lock()
        self._snapshot = MetricsSnapshot()
        self._subscribers: list[
            tuple[asyncio.AbstractEventLoop, Callable[[MetricsSnapshot], None]]
        ] = []
        # Between turns: when the snapshot was last taken and pushed, and whether steps
        # ran since the last idle turn or a snapshot waits to be pushed.
        self._last_snapshot = self._last_publish = 0.0
        self._dirty = self._unpublished = False

    # Life cycle -------------------------------------------------------------------------

    async def start(self, progress: Callable[[float], None] | None = None) -> None:
        """Load the model and the pool on a thread of their own, then take turns stepping.

        The loading thread ends before the first step: torch's OpenMP runtime (libgomp)
        keeps a worker pool for every live thread that ran parallel ops, and a second pool
        on 2 cores halves decode speed (a model loaded in an executor thread, which lives
        on, left one request decoding at 18 tokens/s instead of 33). A thread that has
        ended takes its pool with it. ``progress`` is called from the loading thread with
        the done fraction of a conversion.
        """
        loop = asyncio.get_running_loop()
        self._snapshot = MetricsSnapshot(engine_state=EngineState.LOADING)
        built: asyncio.Future[None] = loop.create_future()
        loader = threading.Thread(
            target=self._load, args=(loop, built, progress), name="paged-llm-load", daemon=True
        )
        self._loader = loader
        loader.start()
        try:
            await built
            await loop.run_in_executor(None, loader.join)
        except asyncio.CancelledError:
            self._stopping = True  # stop() waits for the load, then frees what it built
            raise
        except BaseException:
            self._loader = None
            await loop.run_in_executor(None, loader.join)
            raise
        self._loader = None
        if not self._stopping:  # stop() during the load: it frees what was built
            self._attached = True
            STEP_THREAD.attach(self)

    def _load(
        self,
        loop: asyncio.AbstractEventLoop,
        built: asyncio.Future[None],
        progress: Callable[[float], None] | None,
    ) -> None:
        """The loading thread: build the engine and report to ``start``."""
        try:
            engine = self._build(progress)
        except BaseException as err:
            _settle(loop, built, None, err)
            return
        self._engine = engine
        self._snapshot = engine.metrics()
        _settle(loop, built, None)

    def _build(self, progress: Callable[[float], None] | None = None) -> LLMEngine:
        """Blocking part of start: load weights, size and allocate the KV pool."""
        # Taken before reading it: a write during the load counts as a change too.
        path = model_file(self.config.model)
        self._model_file = FileIdentity.of(path) if path is not None else None
        loaded = self._loaded if self._loaded is not None else load_model(self.config, progress)
        self._loaded = None
        return LLMEngine(loaded, self.config)

    async def stop(self) -> None:
        """Leave the step thread, fail what is pending, and free the model and the pool."""
        self._stopping = True
        loop = asyncio.get_running_loop()
        loader, self._loader = self._loader, None
        if loader is not None:
            await loop.run_in_executor(None, loader.join)
        if self._attached:
            ending = STEP_THREAD.detach(self)
            await loop.run_in_executor(None, self._wait_for_turn)
            if ending is not None:
                # The last engine: its thread (and the OpenMP pool) is gone when stop returns.
                await loop.run_in_executor(None, STEP_THREAD.wait_ended, ending)
            self._attached = False
        self._fail_all(EngineDeadError("the engine is stopped"))
        engine, self._engine = self._engine, None
        if engine is not None:
            await asyncio.get_running_loop().run_in_executor(None, engine.close)
        self._snapshot = replace(
            self._snapshot,
            engine_state=EngineState.UNLOADED,
            num_requests_running=0,
            num_requests_waiting=0,
            generation_throughput=0.0,
            prompt_throughput=0.0,
        )

    def _wait_for_turn(self) -> None:
        """Block until a turn under way on the step thread has ended."""
        with self._turn_lock:
            pass

    @property
    def is_running(self) -> bool:
        """Whether the engine takes turns on the step thread and has not failed."""
        return self._attached and self._error is None

    @property
    def error(self) -> BaseException | None:
        """The exception that ended the engine's turns, if one did."""
        return self._error

    @property
    def _llm(self) -> LLMEngine:
        """The hosted synchronous engine; hosts read it through the methods below."""
        if self._engine is None:
            raise EngineDeadError("the engine is not started")
        return self._engine

    # What the engine is ---------------------------------------------------------------

    @property
    def info(self) -> EngineInfo:
        """The model, the pool and the limits (EngineDeadError before start and after stop)."""
        return self._llm.info

    @property
    def tokenizer(self) -> Any:
        """The model's tokenizer, for reading only (its chat template, counting tokens)."""
        return self._llm.tokenizer

    async def tokenize(
        self,
        prompt: Prompt,
        tools: list[dict[str, Any]] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        *,
        add_special_tokens: bool = True,
    ) -> list[int]:
        """A prompt's token ids, through the chat template for messages (off the loop).

        ``add_special_tokens=False`` leaves the tokenizer's special tokens off a text prompt.
        """
        check_prompt(prompt)
        checked = check_tools(tools), check_template_kwargs(chat_template_kwargs)
        return await self._tokenize(prompt, *checked, add_special_tokens=add_special_tokens)

    async def _tokenize(
        self,
        prompt: Prompt,
        tools: list[dict[str, Any]] | None,
        chat_template_kwargs: dict[str, Any] | None = None,
        *,
        add_special_tokens: bool = True,
    ) -> list[int]:
        """A checked prompt's ids, off the loop: templating a long document takes milliseconds."""
        work = functools.partial(
            self._llm.tokenize,
            prompt,
            tools,
            chat_template_kwargs,
            add_special_tokens=add_special_tokens,
        )
        return await asyncio.get_running_loop().run_in_executor(None, work)

    async def compile_constraint(self, params: SamplingParams) -> None:
        """Compile ``params``' grammar now (off the loop), so a bad one fails before generate.

        Raises InvalidSamplingParams or RequestRejected (invalid_structured_output) naming
        what the grammar library refused; a compiled grammar is kept for the request.
        """
        if params.structured is None:
            return
        engine = self._llm
        await asyncio.get_running_loop().run_in_executor(None, engine.structured.compile, params)

    def check_config(self, config: EngineConfig) -> None:
        """Raise KVBudgetError when ``config`` cannot hold one full sequence (blocking).

        Exact only when this engine has the model on the config's device and dtype;
        otherwise the check is left to the restart with the new settings.
        """
        try:
            loaded = self._llm.loaded
        except EngineDeadError:
            return
        if loaded.model is None:
            return
        if loaded.runner == NUMPY or runner_for(config) == NUMPY:
            # The numpy path's model is float32 on the CPU whatever the settings say.
            if loaded.runner == runner_for(config):
                plan_kv_pool(config, loaded)
            return
        from paged_llm.engine.model.loader import resolve_device, resolve_dtype

        device = resolve_device(config.device)
        dtype = resolve_dtype(config.dtype, device, config.weights)
        if device != loaded.device or dtype != loaded.dtype:
            return
        plan_kv_pool(config, loaded)

    def start_trace(self) -> list[StepTrace]:
        """Record every step from now on into the list returned (for benchmarks)."""
        trace: list[StepTrace] = []
        self._llm.trace = trace
        return trace

    # Requests ---------------------------------------------------------------------------

    def _check_model_file(self) -> None:
        """Stop serving, as a crash does, once the mapped model file was rewritten in place.

        One stat per request. What ran meanwhile read a file changing under it; what comes
        next would too: the engine fails every request with the cause, and its host reloads
        it (the embedded backend asks for one reload), which maps the new file.
        """
        identity = self._model_file
        if self._error is None and identity is not None and identity.changed_in_place():
            err = ModelFileChanged(
                f"the model file {identity.path} was rewritten while loaded; reload to use it"
            )
            _LOGGER.error("%s", err)
            self._error = err
            self._snapshot = replace(self._snapshot, engine_state=EngineState.UNLOADED)
            self._fail_all(EngineDeadError(f"the engine failed: {err}"))
            STEP_THREAD.wake()  # its next turn sees the error and leaves the step thread

    def _check_alive(self) -> None:
        """Raise EngineDeadError when no request can be served."""
        if self._error is not None:
            raise EngineDeadError(f"the engine failed: {self._error}") from self._error
        if self._stopping:
            raise EngineDeadError("the engine is stopped")
        if self._engine is None or not self._attached:
            raise EngineDeadError("the engine is not running")

    async def generate(
        self,
        prompt: Prompt,
        params: SamplingParams | None = None,
        priority: Priority | str = Priority.INTERACTIVE,
        *,
        tools: list[dict[str, Any]] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        request_id: str | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Stream a request's outputs; the last one has ``finished`` set and the totals.

        ``tools`` and ``chat_template_kwargs`` (the template's variables) go to the chat
        template with messages.

        Raises InvalidArgument (naming the argument), RequestRejected (admission; a
        request_id that is live already), InvalidSamplingParams, or EngineDeadError.
        """
        check_prompt(prompt)
        params = check_params(params)
        priority = check_priority(priority)
        tools = check_tools(tools)
        chat_template_kwargs = check_template_kwargs(chat_template_kwargs)
        check_request_id(request_id)
        self._check_model_file()
        self._check_alive()
        arrival = time.monotonic()
        loop = asyncio.get_running_loop()
        request_id = request_id or uuid.uuid4().hex
        stream = _Stream(loop, asyncio.Queue())
        # The id is taken before the first await: of two requests with one id, the one
        # submitted first keeps it, however long each takes to tokenize.
        with self._lock:
            self._check_alive()
            if request_id in self._streams:
                # The live request keeps its stream; only this second one is refused.
                raise RequestRejected(
                    "duplicate_id", f"request id {request_id!r} is already in use"
                )
            self._streams[request_id] = stream
        finished = submitted = False
        completion_tokens = 0
        try:
            token_ids = await self._tokenize(prompt, tools, chat_template_kwargs)
            # Compiling a grammar takes up to a second: here, so the step loop finds it.
            await self.compile_constraint(params)
            self._commands.put(_Add(request_id, token_ids, params, priority, arrival))
            submitted = True
            STEP_THREAD.wake()
            while True:
                item = await stream.queue.get()
                if item is None or stream.aborted:
                    finished = True
                    yield RequestOutput(
                        request_id,
                        "",
                        [],
                        True,
                        FinishReason.ABORT,
                        len(token_ids),
                        completion_tokens,
                        0,
                    )
                    return
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                completion_tokens += len(item.token_ids)
                if item.finished:
                    finished = True
                yield item
                if finished:
                    return
        finally:
            with self._lock:
                if self._streams.get(request_id) is stream:
                    del self._streams[request_id]
            if submitted and not finished:
                self.abort(request_id)

    def abort(self, request_id: str) -> None:
        """Abort a request: its stream ends at once (finish reason abort), its blocks go back.

        A no-op when the request already ended.
        """
        with self._lock:
            stream = self._streams.pop(request_id, None)
        if stream is not None:
            stream.aborted = True
            stream.put(None)
        self._commands.put(_Abort(request_id))
        STEP_THREAD.wake()

    def expect_interactive(self) -> None:
        """An interactive request is on its way: keep steps within the latency budget.

        Home Assistant calls this when an Assist satellite starts listening, seconds
        before the spoken query reaches the engine; the steps under way then shrink, so
        the query does not wait for a step sized to the full token budget. The budget
        holds for ``interactive_hold_seconds``; the fixed policy ignores it.
        """
        self._commands.put(_Expect())
        STEP_THREAD.wake()

    # Metrics ----------------------------------------------------------------------------

    def metrics(self) -> MetricsSnapshot:
        """The latest snapshot (at most a fraction of a second old while busy)."""
        return self._snapshot

    async def block_map(self) -> BlockMap:
        """The KV pool's block map, taken on the engine thread between two steps."""
        self._check_alive()
        loop = asyncio.get_running_loop()
        command = _TakeBlockMap(loop, loop.create_future())
        self._commands.put(command)
        STEP_THREAD.wake()
        while True:
            try:
                return await asyncio.wait_for(asyncio.shield(command.future), 1.0)
            except TimeoutError:
                self._check_alive()  # a stopped or crashed engine never answers

    def subscribe(self, callback: Callable[[MetricsSnapshot], None]) -> Callable[[], None]:
        """Call ``callback`` on this event loop with snapshots, about once a second.

        The first step after idle is pushed at once, and going idle is pushed once more.
        """
        entry = (asyncio.get_running_loop(), callback)
        with self._lock:
            self._subscribers.append(entry)

        def unsubscribe() -> None:
            with self._lock:
                if entry in self._subscribers:
                    self._subscribers.remove(entry)

        return unsubscribe

    def _publish(self) -> None:
        """Push the current snapshot to every subscriber on its own loop."""
        with self._lock:
            subscribers = list(self._subscribers)
        for loop, callback in subscribers:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(callback, self._snapshot)

    # Turns on the step thread ----------------------------------------------------------

    def serves_interactive(self) -> bool:
        """Whether an interactive request waits or runs here (read on the step thread)."""
        engine = self._engine
        return engine is not None and engine.scheduler.has_interactive()

    def turn(self, interactive_elsewhere: bool = False) -> float | None:
        """Apply commands and run at most one step; seconds until the next turn is due.

        ``interactive_elsewhere``: another engine of the process serves a voice request,
        so this one keeps its steps within the latency budget. None once the engine is
        stopping or has crashed: the step thread drops it.
        """
        with self._turn_lock:
            engine = self._engine
            if self._stopping or self._error is not None or engine is None:
                return None
            try:
                if interactive_elsewhere:
                    engine.scheduler.hold_step_budget()
                return self._turn(engine)
            except BaseException as err:
                _LOGGER.exception("The engine's step loop crashed")
                self._error = err
                self._snapshot = replace(self._snapshot, engine_state=EngineState.UNLOADED)
                self._fail_all(EngineDeadError(f"the engine failed: {err}"))
                return None

    def _turn(self, engine: LLMEngine) -> float:
        """One turn: step when there is work, else keep the idle figures fresh."""
        self._drain(engine)
        if not engine.has_unfinished():
            # Going idle refreshes the readable figures at once; pushes keep to the rate
            # limit. While idle the throughput window still drains, so keep refreshing
            # until it reads 0.
            snap = self._snapshot
            if self._dirty or snap.generation_throughput > 0 or snap.prompt_throughput > 0:
                self._snapshot = engine.metrics()
                self._dirty, self._unpublished = False, True
            if not self._unpublished:
                return PUBLISH_INTERVAL_S
            wait = self._last_publish + PUBLISH_INTERVAL_S - time.monotonic()
            if wait > 0:
                return wait
            self._publish()
            self._last_publish = time.monotonic()
            self._unpublished = False
            return PUBLISH_INTERVAL_S
        first = not self._dirty  # the idle turn clears dirty: this step follows idle
        for out in engine.step():
            self._deliver(out)
        self._dirty = True
        now = time.monotonic()
        if first or now - self._last_snapshot >= SNAPSHOT_INTERVAL_S:
            self._snapshot = engine.metrics()
            self._last_snapshot = now
            self._unpublished = True
        # The first step after idle is pushed at once: a voice answer can be over within
        # the rate limit's second, and the sensors would never show it.
        if first or now - self._last_publish >= PUBLISH_INTERVAL_S:
            self._publish()
            self._last_publish = now
            self._unpublished = False
        return 0.0

    def _drain(self, engine: LLMEngine) -> None:
        """Apply queued adds and aborts; a rejected add fails only its own stream."""
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            if isinstance(command, _Abort):
                engine.abort(command.request_id)
                continue
            if isinstance(command, _TakeBlockMap):
                command.run(engine)
                continue
            if isinstance(command, _Expect):
                engine.scheduler.hold_step_budget()
                continue
            with self._lock:
                stream = self._streams.get(command.request_id)
            if stream is None:  # the consumer left before the engine saw the request
                continue
            try:
                engine.add_request(
                    command.token_ids,
                    command.params,
                    command.priority,
                    request_id=command.request_id,
                    arrival_time=command.arrival_time,
                )
            except Exception as err:
                stream.put(err)

    def _deliver(self, out: RequestOutput) -> None:
        """Hand one output to its consumer."""
        with self._lock:
            stream = self._streams.get(out.request_id)
        if stream is not None:
            # A request that failed inside a step raises its own error to its consumer.
            stream.put(out.error if out.error is not None else out)

    def _fail_all(self, err: BaseException) -> None:
        """Fail every pending request with ``err``."""
        with self._lock:
            streams = list(self._streams.values())
            self._streams.clear()
        for stream in streams:
            stream.put(err)
