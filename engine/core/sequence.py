"""Request state: sampling parameters, priority class, status and timestamps."""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from paged_llm.engine.core.logprob import MAX_LOGPROBS, TokenLogprob
from paged_llm.engine.errors import InvalidSamplingParams
from paged_llm.protocol.priority import Priority as Priority  # the one enum, re-exported

# Below this temperature sampling is argmax: dividing logits by it would overflow to NaN.
GREEDY_TEMPERATURE = 1e-5
# Seeds torch's generators take: any 64-bit value, signed or unsigned.
SEED_RANGE = range(-(2**63), 2**64)


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


STRUCTURED_FIELDS = ("json_schema", "json_object", "regex", "grammar", "structural_tag")


def _json_object_text(name: str, value: object) -> str:
    """Compact JSON text of a JSON object given as text or a mapping; errors name ``name``."""
    parsed = value
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError as err:
            raise InvalidSamplingParams(f"{name} is not valid JSON: {err}") from err
    if not isinstance(parsed, Mapping):
        raise InvalidSamplingParams(f"{name} must be a JSON object, got {value!r:.200}")
    try:
        return json.dumps(parsed, separators=(",", ":"))
    except (TypeError, ValueError) as err:
        raise InvalidSamplingParams(f"{name} cannot be written as JSON: {err}") from err


@dataclass(slots=True, frozen=True)
class SamplingParams:
    """How to pick tokens and when to stop; validated on creation."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    # Keep tokens at least min_p times as likely as the top one; 0 is off (sample/min_p.py).
    min_p: float = 0.0
    max_tokens: int = 256
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    # Structured output (engine/structured/output.py): at most one of these five is set.
    # A schema or tag is stored as compact JSON text (key order kept: it is the output order).
    json_schema: str | Mapping[str, Any] | None = None
    json_object: bool = False
    regex: str | None = None
    grammar: str | None = None
    structural_tag: str | Mapping[str, Any] | None = None
    # None: the model's own (its generation_config's, else 1: off).
    repetition_penalty: float | None = None
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    # Log probabilities (engine/sample/logprobs.py): None asks for none; n gives each
    # generated token's with its n most likely alternatives (0: the chosen token's alone).
    logprobs: int | None = None
    # The same for the prompt's tokens (vLLM's prompt_logprobs), from position
    # ``prompt_logprobs_from`` on (negative: counted from the prompt's end). Positions
    # before it may come from the prefix cache; the scored ones are always computed.
    prompt_logprobs: int | None = None
    prompt_logprobs_from: int = 0

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
        if isinstance(self.min_p, bool) or not isinstance(self.min_p, int | float):
            raise InvalidSamplingParams(f"min_p must be a number, got {self.min_p!r}")
        if not 0 <= self.min_p <= 1:  # NaN fails this too
            raise InvalidSamplingParams(f"min_p must be in [0, 1], got {self.min_p}")
        # 0 scores a prompt without generating: only with prompt_logprobs.
        least = 0 if self.prompt_logprobs is not None else 1
        if (
            isinstance(self.max_tokens, bool)
            or not isinstance(self.max_tokens, int)
            or self.max_tokens < least
        ):
            raise InvalidSamplingParams(
                f"max_tokens must be an integer >= 1 (0 only with prompt_logprobs), "
                f"got {self.max_tokens!r}"
            )
        seed = self.seed
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise InvalidSamplingParams(f"seed must be an integer or None, got {self.seed!r}")
        if seed is not None and seed not in SEED_RANGE:
            raise InvalidSamplingParams(
                f"seed must be a 64-bit integer (between -2**63 and 2**64 - 1), got {seed}"
            )
        # None means no stop strings (OpenAI's null); a bare string is refused below, as
        # iterating it would make each character a stop string.
        if self.stop is None:
            object.__setattr__(self, "stop", ())
        if self.stop_token_ids is None:
            object.__setattr__(self, "stop_token_ids", ())
        if (
            isinstance(self.stop, str)
            or not isinstance(self.stop, list | tuple)
            or not all(isinstance(s, str) and s for s in self.stop)
        ):
            raise InvalidSamplingParams(
                f"stop must be a sequence of non-empty strings, got {self.stop!r}"
            )
        if not isinstance(self.stop_token_ids, list | tuple) or not all(
            isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in self.stop_token_ids
        ):
            raise InvalidSamplingParams(
                f"stop_token_ids must be non-negative integers, got {self.stop_token_ids!r}"
            )
        if not isinstance(self.ignore_eos, bool):
            raise InvalidSamplingParams(
                f"ignore_eos must be True or False, got {self.ignore_eos!r}"
            )
        self._check_penalties()
        self._check_logprobs()
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        self._check_structured()

    def _check_structured(self) -> None:
        """Validate the structured-output fields and store the JSON ones as compact text."""
        for name in ("json_schema", "structural_tag"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, _json_object_text(name, value))
        if not isinstance(self.json_object, bool):
            raise InvalidSamplingParams(f"json_object must be a boolean, got {self.json_object!r}")
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise InvalidSamplingParams(f"{name} must be a non-empty string, got {value!r}")
        chosen = [name for name in STRUCTURED_FIELDS if getattr(self, name) not in (None, False)]
        if len(chosen) > 1:
            raise InvalidSamplingParams(
                f"{' and '.join(chosen)} cannot be combined: give at most one of "
                f"{', '.join(STRUCTURED_FIELDS)}"
            )

    @property
    def structured(self) -> tuple[str, str] | None:
        """The structured-output constraint as (field name, text), or None when free."""
        for name in STRUCTURED_FIELDS:
            value = getattr(self, name)
            if value is True:
                return name, ""
            if isinstance(value, str):
                return name, value
        return None

    def _check_penalties(self) -> None:
        """Reject penalties outside the ranges vLLM and OpenAI accept, naming the field."""
        for name in ("repetition_penalty", "frequency_penalty", "presence_penalty"):
            value = getattr(self, name)
            if value is None and name == "repetition_penalty":
                continue
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise InvalidSamplingParams(f"{name} must be a number, got {value!r}")
            if not math.isfinite(value):
                raise InvalidSamplingParams(f"{name} must be finite, got {value}")
        if self.repetition_penalty is not None and self.repetition_penalty <= 0:
            raise InvalidSamplingParams(
                f"repetition_penalty must be > 0 (1 turns it off), got {self.repetition_penalty}"
            )
        for name in ("frequency_penalty", "presence_penalty"):
            value = getattr(self, name)
            if not -2 <= value <= 2:
                raise InvalidSamplingParams(f"{name} must be in [-2, 2], got {value}")

    def _check_logprobs(self) -> None:
        """Reject log-probability requests outside 0..MAX_LOGPROBS, naming the field."""
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                raise InvalidSamplingParams(f"{name} must be an integer or None, got {value!r}")
            if not 0 <= value <= MAX_LOGPROBS:
                raise InvalidSamplingParams(
                    f"{name} must be between 0 and {MAX_LOGPROBS}, got {value}"
                )
        start = self.prompt_logprobs_from
        if isinstance(start, bool) or not isinstance(start, int):
            raise InvalidSamplingParams(f"prompt_logprobs_from must be an integer, got {start!r}")

    @property
    def greedy(self) -> bool:
        """Whether sampling reduces to argmax."""
        return self.temperature < GREEDY_TEMPERATURE or self.top_k == 1


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
    # Prompt log probabilities computed so far, for positions from first_scored on; kept
    # across a preemption, so a recompute scores only what is still missing.
    scored_prompt: list[TokenLogprob] = field(default_factory=list)

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
    def first_scored(self) -> int:
        """The first prompt position to score (position 0 has no context); prompt length: none."""
        params = self.params
        if params.prompt_logprobs is None:
            return self.num_prompt_tokens
        start = params.prompt_logprobs_from
        if start < 0:
            start += self.num_prompt_tokens
        return min(max(start, 1), self.num_prompt_tokens)

    @property
    def next_scored(self) -> int:
        """The first prompt position still to score; the prompt's length once all are."""
        return self.first_scored + len(self.scored_prompt)

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
