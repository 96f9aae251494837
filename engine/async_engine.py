"""The asyncio face of the engine: one stepping thread, streamed deltas, pushed metrics."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from typing import Any

from .block_map import BlockMap, take_block_map
from .config import EngineConfig
from .errors import EngineDeadError, RequestRejected
from .llm_engine import LLMEngine, Prompt
from .loader import LoadedModel, load_model
from .metrics import EngineState, MetricsSnapshot
from .outputs import RequestOutput
from .sequence import FinishReason, Priority, SamplingParams
from .validation import check_params, check_priority, check_prompt, check_request_id, check_tools

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
    """Hosts an LLMEngine in a background thread and serves many asyncio consumers.

    ``async for out in engine.generate(...)`` streams RequestOutput deltas; leaving the
    loop early or cancelling the task aborts the request and frees its KV blocks.
    """

    def __init__(self, config: EngineConfig, loaded: LoadedModel | None = None) -> None:
        """Prepare; nothing is loaded until ``start``."""
        self.config = config
        self._loaded = loaded
        self._engine: LLMEngine | None = None
        self._thread: threading.Thread | None = None
        self._commands: queue.SimpleQueue[_Add | _Abort | _TakeBlockMap] = queue.SimpleQueue()
        self._wakeup = threading.Event()
        self._stopping = False
        self._error: BaseException | None = None
        self._streams: dict[str, _Stream] = {}
        self._lock = threading.Lock()
        self._snapshot = MetricsSnapshot()
        self._subscribers: list[
            tuple[asyncio.AbstractEventLoop, Callable[[MetricsSnapshot], None]]
        ] = []

    # Life cycle -------------------------------------------------------------------------

    async def start(self, progress: Callable[[float], None] | None = None) -> None:
        """Start the engine thread; it loads the model and the pool, then steps.

        Loading and stepping share one thread on purpose. torch's OpenMP runtime (libgomp)
        gives every thread that runs parallel ops a worker pool of its own, and while more
        pool threads live than there are cores its workers stop spinning between parallel
        regions: a model loaded in an executor thread left the engine thread decoding one
        request at 18 tokens/s instead of 33 on 2 cores. ``progress`` is called from the
        engine thread with the done fraction of a conversion.
        """
        loop = asyncio.get_running_loop()
        self._snapshot = MetricsSnapshot(engine_state=EngineState.LOADING)
        built: asyncio.Future[None] = loop.create_future()
        thread = threading.Thread(
            target=self._main, args=(loop, built, progress), name="paged-llm-engine", daemon=True
        )
        self._thread = thread
        thread.start()
        try:
            await built
        except asyncio.CancelledError:
            self._stopping = True  # the thread ends once the load is done
            raise
        except BaseException:
            # The load failed: its thread is ending; let it finish before reporting.
            self._thread = None
            await loop.run_in_executor(None, thread.join)
            raise

    def _main(
        self,
        loop: asyncio.AbstractEventLoop,
        built: asyncio.Future[None],
        progress: Callable[[float], None] | None,
    ) -> None:
        """The engine thread: build the engine, report to ``start``, then step until stopped."""
        try:
            engine = self._build(progress)
        except BaseException as err:
            _settle(loop, built, None, err)
            return
        self._engine = engine
        self._snapshot = engine.metrics()
        _settle(loop, built, None)
        self._run()

    def _build(self, progress: Callable[[float], None] | None = None) -> LLMEngine:
        """Blocking part of start: load weights, size and allocate the KV pool."""
        loaded = self._loaded if self._loaded is not None else load_model(self.config, progress)
        self._loaded = None
        return LLMEngine(loaded, self.config)

    async def stop(self) -> None:
        """Stop the thread, fail what is pending, and free the model and the pool."""
        self._stopping = True
        self._wakeup.set()
        if self._thread is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._thread.join)
            self._thread = None
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

    @property
    def is_running(self) -> bool:
        """Whether the stepping thread is alive and healthy."""
        return self._thread is not None and self._thread.is_alive() and self._error is None

    @property
    def error(self) -> BaseException | None:
        """The exception that killed the stepping thread, if one did."""
        return self._error

    @property
    def engine(self) -> LLMEngine:
        """The hosted synchronous engine (read-only use from the event loop)."""
        if self._engine is None:
            raise EngineDeadError("the engine is not started")
        return self._engine

    # Requests ---------------------------------------------------------------------------

    def _check_alive(self) -> None:
        """Raise EngineDeadError when no request can be served."""
        if self._error is not None:
            raise EngineDeadError(f"the engine failed: {self._error}") from self._error
        if self._stopping:
            raise EngineDeadError("the engine is stopped")
        if self._engine is None or self._thread is None:
            raise EngineDeadError("the engine is not running")

    async def generate(
        self,
        prompt: Prompt,
        params: SamplingParams | None = None,
        priority: Priority | str = Priority.INTERACTIVE,
        *,
        tools: list[dict[str, Any]] | None = None,
        request_id: str | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Stream a request's outputs; the last one has ``finished`` set and the totals.

        Raises InvalidArgument (naming the argument), RequestRejected (admission; a
        request_id that is live already), InvalidSamplingParams, or EngineDeadError.
        """
        check_prompt(prompt)
        params = check_params(params)
        priority = check_priority(priority)
        tools = check_tools(tools)
        check_request_id(request_id)
        self._check_alive()
        arrival = time.monotonic()
        loop = asyncio.get_running_loop()
        engine = self.engine
        # Chat templates and long documents take milliseconds to tokenize: not on the loop.
        token_ids = await loop.run_in_executor(None, engine.tokenize, prompt, tools)
        if params.structured is not None:
            # Compiling a grammar takes up to a second: here, so the step loop finds it cached.
            await loop.run_in_executor(None, engine.structured.compile, params)
        request_id = request_id or uuid.uuid4().hex
        stream = _Stream(loop, asyncio.Queue())
        with self._lock:
            self._check_alive()
            if request_id in self._streams:
                # The live request keeps its stream; only this second one is refused.
                raise RequestRejected(
                    "duplicate_id", f"request id {request_id!r} is already in use"
                )
            self._streams[request_id] = stream
        self._commands.put(_Add(request_id, token_ids, params, priority, arrival))
        self._wakeup.set()
        finished = False
        completion_tokens = 0
        try:
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
            if not finished:
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
        self._wakeup.set()

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
        self._wakeup.set()
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

    # The stepping thread ----------------------------------------------------------------

    def _run(self) -> None:
        """Step while there is work; sleep on the wake-up event when idle."""
        engine = self._engine
        assert engine is not None
        last_snapshot = last_publish = 0.0
        dirty = unpublished = False
        try:
            while not self._stopping:
                self._wakeup.clear()
                self._drain(engine)
                if not engine.has_unfinished():
                    # Going idle refreshes the readable figures at once; pushes keep to the
                    # rate limit. While idle the throughput window still drains, so keep
                    # refreshing until it reads 0.
                    snap = self._snapshot
                    if dirty or snap.generation_throughput > 0 or snap.prompt_throughput > 0:
                        self._snapshot = engine.metrics()
                        dirty, unpublished = False, True
                    wait = PUBLISH_INTERVAL_S
                    if unpublished:
                        wait = last_publish + PUBLISH_INTERVAL_S - time.monotonic()
                        if wait <= 0:
                            self._publish()
                            last_publish = time.monotonic()
                            unpublished, wait = False, PUBLISH_INTERVAL_S
                    self._wakeup.wait(timeout=wait)
                    continue
                first = not dirty  # the idle branch clears dirty: this step follows idle
                for out in engine.step():
                    self._deliver(out)
                dirty = True
                now = time.monotonic()
                if first or now - last_snapshot >= SNAPSHOT_INTERVAL_S:
                    self._snapshot = engine.metrics()
                    last_snapshot = now
                    unpublished = True
                # The first step after idle is pushed at once: a voice answer can be over
                # within the rate limit's second, and the sensors would never show it.
                if first or now - last_publish >= PUBLISH_INTERVAL_S:
                    self._publish()
                    last_publish = now
                    unpublished = False
        except BaseException as err:
            _LOGGER.exception("The engine's step loop crashed")
            self._error = err
            self._snapshot = replace(self._snapshot, engine_state=EngineState.UNLOADED)
            self._fail_all(EngineDeadError(f"the engine failed: {err}"))

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
