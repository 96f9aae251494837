"""The engine's public face: what a host (the server, the integration) imports, and nothing more.

A host starts an AsyncEngine with an EngineConfig (``start_engine``), turns its requests
into SamplingParams and Constraints with the shared front end (``sampling_params``,
``first_compiled``), streams RequestOutputs and maps errors to codes (``error_info``).
Everything else under ``paged_llm.engine`` is the engine's own and may move.
"""

from __future__ import annotations

from paged_llm.engine.async_engine import AsyncEngine
from paged_llm.engine.config import EngineConfig
from paged_llm.engine.core.sequence import SamplingParams
from paged_llm.engine.errors import (
    EngineDeadError,
    EngineError,
    InvalidSamplingParams,
    RequestRejected,
)
from paged_llm.engine.metrics import MetricsSnapshot
from paged_llm.engine.model.selector import runner_for
from paged_llm.engine.outputs import RequestOutput, RequestTiming, TokenLogprob
from paged_llm.engine.processor import (
    Constraint,
    ErrorInfo,
    error_info,
    first_compiled,
    sampling_params,
    start_engine,
)
from paged_llm.engine.structured.json_bounds import JsonBounds
from paged_llm.kernels.cpu.native_build import kernels_unavailable

__all__ = [
    "AsyncEngine",
    "Constraint",
    "EngineConfig",
    "EngineDeadError",
    "EngineError",
    "ErrorInfo",
    "InvalidSamplingParams",
    "JsonBounds",
    "MetricsSnapshot",
    "RequestOutput",
    "RequestRejected",
    "RequestTiming",
    "SamplingParams",
    "TokenLogprob",
    "error_info",
    "first_compiled",
    "kernels_unavailable",
    "runner_for",
    "sampling_params",
    "start_engine",
]
