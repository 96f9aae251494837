"""The backend seam: all that entities, actions, sensors and diagnostics ask of a model."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from homeassistant.helpers import llm

from paged_llm.protocol.snapshot import MetricsSnapshot


@dataclass(slots=True)
class Sampling:
    """How a request picks its tokens, whichever backend runs it."""

    max_tokens: int
    temperature: float
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    # OpenAI's response_format, for backends that enforce one.
    response_format: dict[str, Any] | None = None
    # Tools (OpenAI function format) whose calls decoding is held to, where the backend
    # enforces it: text, or calls in the model's own format that fit these tools.
    tool_grammar: list[dict[str, Any]] | None = None
    # The offered tools as they are, held to when tool_grammar (narrowed to the home) cannot
    # be compiled; None when tool_grammar is them.
    plain_tools: list[dict[str, Any]] | None = None
    # For chat templates with a reasoning switch (enable_thinking); None: the template's own.
    thinking: bool | None = None
    # vLLM's definitions; 1 and 0 turn them off. None: the model's own repetition penalty.
    repetition_penalty: float | None = None
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0


@dataclass(slots=True)
class Delta:
    """A piece of a streamed answer; the last one has ``finished`` and the token counts."""

    text: str = ""
    reasoning: str = ""
    # Calls the backend parsed itself (a server's structured tool_calls).
    tool_calls: list[llm.ToolInput] = field(default_factory=list)
    finished: bool = False
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0


@dataclass(slots=True)
class ScoreQuery:
    """Chat messages and the answers to score after them, each as the assistant's whole reply."""

    messages: list[dict[str, Any]]
    continuations: list[str]


class BackendError(Exception):
    """A request failed; ``key`` is the translation key, ``reason`` the backend's words.

    ``caller`` marks errors caused by what was asked (shown as validation errors);
    ``restart`` asks for the entry to be reloaded (the embedded engine crashed).
    """

    def __init__(
        self,
        key: str,
        reason: str,
        *,
        caller: bool = False,
        restart: bool = False,
        placeholders: Mapping[str, str] | None = None,
    ) -> None:
        """Name the failure by ``key``; ``reason`` is also the exception's message."""
        super().__init__(reason)
        self.key = key
        self.reason = reason
        self.caller = caller
        self.restart = restart
        self.placeholders = dict(placeholders or {})


class Backend(Protocol):
    """Where the model runs: in this process (the engine) or on a server (HTTP)."""

    @property
    def available(self) -> bool:
        """Whether requests can be served now."""

    @property
    def native_tools(self) -> bool:
        """Whether tools go to the model as structured tools rather than prompt text."""

    @property
    def can_evaluate(self) -> bool:
        """Whether ``async_score`` can answer: the engine always; a server where it was found to."""

    @property
    def context_size(self) -> int:
        """The most tokens one request may hold, prompt and answer together."""

    @property
    def context_known(self) -> bool:
        """Whether ``context_size`` is the model's own, not a guess (a server may not say)."""

    @property
    def kv_pool_tokens(self) -> int | None:
        """Tokens the whole KV pool holds, where the backend knows it (None elsewhere)."""

    async def async_count_tokens(self, text: str) -> int:
        """Tokens in ``text`` (the model's tokenizer where the backend has it)."""

    async def async_count_prompt_tokens(
        self,
        messages: Sequence[Mapping[str, Any]],
        sampling: Sampling,
        tools: list[dict[str, Any]] | None = None,
    ) -> tuple[int, bool]:
        """Tokens of the prompt ``stream`` would send, and whether the count is exact.

        Exact: the model's tokenizer counted it; otherwise an estimate (a remote server
        without a tokenize endpoint).
        """

    def stream(
        self,
        messages: Sequence[Mapping[str, Any]],
        sampling: Sampling,
        priority: str,
        tools: list[dict[str, Any]] | None = None,
    ) -> AsyncIterator[Delta]:
        """Stream an answer to chat messages; raises BackendError."""

    async def async_score(self, queries: Sequence[ScoreQuery], priority: str) -> list[list[float]]:
        """Each continuation's summed log probability, per query (its tokens and end of turn).

        The queries' shared prompt is read once (the prefix cache) and the continuations run
        side by side. Raises BackendError: ``evaluate_same_tokens`` and
        ``evaluate_context_too_long`` (the caller's), ``evaluate_unsupported`` (a server
        that returns no log probabilities).
        """

    def metrics(self) -> MetricsSnapshot:
        """The latest metrics snapshot known."""

    async def async_refresh_metrics(self) -> MetricsSnapshot:
        """A fresh snapshot (a remote backend asks the server; raises BackendError)."""

    def subscribe(self, callback: Callable[[MetricsSnapshot], None]) -> Callable[[], None]:
        """Push snapshots to ``callback`` where the backend pushes; returns the unsubscribe."""

    def expect_interactive(self) -> None:
        """A voice query is on its way (an Assist satellite listens): shorten steps now."""

    def diagnostics(self) -> dict[str, Any]:
        """What the backend reports about itself, for the diagnostics download."""

    async def async_close(self) -> None:
        """Stop and free everything the backend holds."""
