"""Request state: sampling parameters, priority class, status and timestamps."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

from .errors import InvalidSamplingParams


class Priority(enum.IntEnum):
    """Priority class of a request; a lower value is served first."""

    INTERACTIVE = 0
    AUTOMATION = 1
    BACKGROUND = 2

    @classmethod
    def parse(cls, value: str | int | Priority) -> Priority:
        """Return the class for a name such as ``"interactive"`` or raise ValueError."""
        if isinstance(value, Priority):
            return value
        if isinstance(value, str):
            try:
                return cls[value.upper()]
            except KeyError:
                pass
        elif isinstance(value, int) and not isinstance(value, bool):
            try:
                return cls(value)
            except ValueError:
                pass
        names = ", ".join(p.name.lower() for p in cls)
        raise ValueError(f"unknown priority {value!r}; expected one of: {names}")


class SequenceStatus(enum.Enum):
    """Where a sequence is in its life."""

    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED = "finished"


class FinishReason(enum.StrEnum):
    """Why a sequence stopped generating."""

    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"
    ERROR = "error"


@dataclass(slots=True, frozen=True)
class SamplingParams:
    """How to pick tokens and when to stop; validated on creation."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 256
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0

    def __post_init__(self) -> None:
        """Reject values that would make sampling undefined."""
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, int | float):
            raise InvalidSamplingParams(f"temperature must be a number, got {self.temperature!r}")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise InvalidSamplingParams(f"temperature must be >= 0, got {self.temperature}")
        if isinstance(self.top_p, bool) or not isinstance(self.top_p, int | float):
            raise InvalidSamplingParams(f"top_p must be a number, got {self.top_p!r}")
        if not 0 < self.top_p <= 1:
            raise InvalidSamplingParams(f"top_p must be in (0, 1], got {self.top_p}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise InvalidSamplingParams(f"top_k must be an integer >= 0, got {self.top_k!r}")
        if (
            isinstance(self.max_tokens, bool)
            or not isinstance(self.max_tokens, int)
            or self.max_tokens < 1
        ):
            raise InvalidSamplingParams(
                f"max_tokens must be an integer >= 1, got {self.max_tokens!r}"
            )
        seed = self.seed
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise InvalidSamplingParams(f"seed must be an integer or None, got {self.seed!r}")
        if isinstance(self.stop, str) or not all(isinstance(s, str) and s for s in self.stop):
            raise InvalidSamplingParams(
                f"stop must be a sequence of non-empty strings, got {self.stop!r}"
            )
        if not all(
            isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in self.stop_token_ids
        ):
            raise InvalidSamplingParams(
                f"stop_token_ids must be non-negative integers, got {self.stop_token_ids!r}"
            )
        self._check_penalties()
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))

    def _check_penalties(self) -> None:
        """Reject penalties outside the ranges vLLM and OpenAI accept, naming the field."""
        for name in ("repetition_penalty", "frequency_penalty", "presence_penalty"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise InvalidSamplingParams(f"{name} must be a number, got {value!r}")
            if not math.isfinite(value):
                raise InvalidSamplingParams(f"{name} must be finite, got {value}")
        if self.repetition_penalty <= 0:
            raise InvalidSamplingParams(
                f"repetition_penalty must be > 0 (1 turns it off), got {self.repetition_penalty}"
            )
        for name in ("frequency_penalty", "presence_penalty"):
            value = getattr(self, name)
            if not -2 <= value <= 2:
                raise InvalidSamplingParams(f"{name} must be in [-2, 2], got {value}")

    @property
    def greedy(self) -> bool:
        """Whether sampling reduces to argmax."""
        return self.temperature == 0 or self.top_k == 1


@dataclass(slots=True, eq=False)
class Sequence:
    """One request's tokens and life: what the scheduler, KV manager and runner share.

    ``token_ids`` holds the prompt followed by the output; ``num_computed_tokens`` counts
    the leading tokens whose K/V is in the pool. Times come from the engine's monotonic
    clock.
    """

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    priority: Priority
    arrival_time: float
    token_ids: list[int] = field(init=False)
    status: SequenceStatus = SequenceStatus.WAITING
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0
    finish_reason: FinishReason | None = None
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None
    last_started_time: float | None = None
    preempted_times: list[float] = field(default_factory=list)
    extra_stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        """Start the token list from the prompt."""
        if not self.prompt_token_ids:
            raise InvalidSamplingParams("the prompt is empty: at least one token is needed")
        self.token_ids = list(self.prompt_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        """Tokens in the original prompt."""
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        """Prompt plus output tokens."""
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        """Tokens generated so far."""
        return len(self.token_ids) - len(self.prompt_token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        """The generated tokens."""
        return self.token_ids[len(self.prompt_token_ids) :]

    @property
    def max_total_tokens(self) -> int:
        """The most tokens this sequence can ever hold: prompt plus max_tokens."""
        return self.num_prompt_tokens + self.params.max_tokens

    @property
    def num_preemptions(self) -> int:
        """How often this sequence was preempted."""
        return len(self.preempted_times)

    @property
    def is_finished(self) -> bool:
        """Whether the sequence has ended."""
        return self.status is SequenceStatus.FINISHED

    def append_token(self, token_id: int) -> None:
        """Add one generated token."""
        self.token_ids.append(token_id)
