"""One engine per server process: loading it, its readiness, and stopping it cleanly."""

from __future__ import annotations

import asyncio
import enum
import importlib
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from paged_llm.protocol.errors import ApiError

if TYPE_CHECKING:
    from paged_llm.engine.api import AsyncEngine, EngineConfig, MetricsSnapshot

_LOGGER = logging.getLogger(__name__)


def load_progress(model: str) -> Callable[[float], None]:
    """Log a load's progress at each tenth, called on the loading thread.

    A server's log (the add-on's, for one) then shows how far a minutes-long load got.
    """
    logged = -1

    def report(fraction: float) -> None:
        """Log the fraction when it reached the next tenth."""
        nonlocal logged
        tenth = min(int(fraction * 10), 10)
        if tenth > logged:
            logged = tenth
            _LOGGER.info("Loading %s: %d%%", model, tenth * 10)

    return report


class HostState(enum.StrEnum):
    """Where the engine is in its life."""

    LOADING = "loading"
    READY = "ready"
    FAILED = "failed"
    STOPPING = "stopping"


class EngineHost:
    """Starts the engine in the background and tells the routes whether it can serve."""

    def __init__(self, config: EngineConfig, served_name: str | None = None) -> None:
        """Prepare; ``start`` loads the model."""
        self.config = config
        self.model_name = served_name or config.model
        self.state = HostState.LOADING
        self.error: BaseException | None = None
        self.created = int(time.time())
        self._engine: AsyncEngine | None = None

    async def start(self) -> None:
        """Load the model and start stepping; on failure the state says so (no raise)."""
        started = time.monotonic()
        try:
            # Importing torch takes seconds: in a thread, so /health answers meanwhile.
            frontend = await asyncio.get_running_loop().run_in_executor(
                None, importlib.import_module, "paged_llm.engine.processor"
            )
            engine: AsyncEngine = await frontend.start_engine(
                self.config, load_progress(self.model_name)
            )
        except Exception as err:
            _LOGGER.exception("Could not start the engine for %s", self.config.model)
            self.error, self.state = err, HostState.FAILED
            return
        self._engine = engine
        if self.state is HostState.LOADING:
            self.state = HostState.READY
        info = engine.info
        _LOGGER.info(
            "Model %s ready in %.1f s: %d KV blocks of %d tokens, context %d",
            self.model_name,
            time.monotonic() - started,
            info.num_kv_blocks,
            info.block_size,
            info.max_model_len,
        )
        # What the engine made of the model, for a reader comparing runs or systems.
        _LOGGER.info(
            "Weights: %s; attention: %s; %s; %s",
            info.weights,
            info.attention,
            info.kv_cache,
            info.forward,
        )

    async def stop(self) -> None:
        """Stop the engine and free the model and the pool."""
        self.state = HostState.STOPPING
        engine, self._engine = self._engine, None
        if engine is not None:
            await engine.stop()

    @property
    def ready(self) -> bool:
        """Whether requests can be served now."""
        engine = self._engine
        if self.state is HostState.READY and engine is not None and not engine.is_running:
            self.state, self.error = HostState.FAILED, engine.error
        return self.state is HostState.READY

    @property
    def engine(self) -> AsyncEngine:
        """The running engine, or a 503 saying why there is none."""
        if not self.ready or self._engine is None:
            raise ApiError(
                503,
                f"the model is not ready ({self.describe()})",
                code="model_not_ready",
                retry_after=5 if self.state is HostState.LOADING else None,
            )
        return self._engine

    def describe(self) -> str:
        """A short status line for /health."""
        if self.state is HostState.FAILED:
            return f"failed: {self.error}"
        return self.state.value

    @property
    def max_model_len(self) -> int:
        """The model's usable context in tokens."""
        return self.engine.info.max_model_len

    @property
    def max_request_tokens(self) -> int:
        """The most tokens one request can hold: the context, or the whole pool if smaller."""
        return self.engine.info.max_request_tokens

    def metrics(self) -> MetricsSnapshot | None:
        """The engine's latest snapshot, or None while none is running."""
        return self._engine.metrics() if self._engine is not None else None
