"""What every host does around the engine: sampling from a request, errors as codes, starting.

The OpenAI-compatible server and the Home Assistant integration both turn a request's
fields into SamplingParams and a decoding constraint, report the engine's errors as a
code, a message and whose fault they are, and start an engine that must not outlive a
failed start. They do it here, once; each host only maps the result onto its own
errors (an HTTP status, a translated Home Assistant error).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from paged_llm.engine.async_engine import AsyncEngine
from paged_llm.engine.config import EngineConfig
from paged_llm.engine.core.sequence import SamplingParams
from paged_llm.engine.errors import (
    EngineError,
    InvalidArgument,
    InvalidSamplingParams,
    RequestRejected,
)
from paged_llm.engine.structured.tool_grammar import (
    detect_tool_call_format,
    tool_call_structural_tag,
)

# Error codes a caller fixes by changing the request, not by waiting or retrying.
CALLER_CODES = frozenset(
    {
        "empty_prompt",
        "invalid_token",
        "context_too_long",
        "exceeds_kv_pool",
        "invalid_structured_output",
        InvalidSamplingParams.code,
        InvalidArgument.code,
    }
)
# The request field each caller code points at, in the OpenAI API's names.
_PARAMS = {
    "empty_prompt": "messages",
    "invalid_token": "messages",
    "context_too_long": "max_tokens",
    "exceeds_kv_pool": "max_tokens",
}

# Refusals of the grammar library already logged: a home's schema is refused every request.
_REFUSED: set[str] = set()


@dataclass(slots=True, frozen=True)
class Constraint:
    """What decoding is held to: one JSON schema, any JSON object, or calls of offered tools."""

    json_schema: Mapping[str, Any] | None = None
    json_object: bool = False
    tools: Sequence[Mapping[str, Any]] | None = None
    # OpenAI's tool_choice: "auto", "required", "none" or a named function.
    tool_choice: str | Mapping[str, Any] = "auto"

    def fields(self, chat_template: str | None) -> dict[str, Any]:
        """SamplingParams' structured fields; tool calls take the template's own format."""
        if self.json_schema is not None:
            return {"json_schema": self.json_schema}
        if self.json_object:
            return {"json_object": True}
        if not self.tools:
            return {}
        style = detect_tool_call_format(chat_template)
        tag = tool_call_structural_tag(self.tools, style, self.tool_choice)
        return {} if tag is None else {"structural_tag": tag}


def sampling_params(
    *,
    max_tokens: int,
    temperature: float,
    top_p: float = 1.0,
    top_k: int = 0,
    min_p: float = 0.0,
    seed: int | None = None,
    stop: Sequence[str] = (),
    ignore_eos: bool = False,
    repetition_penalty: float | None = None,
    frequency_penalty: float = 0.0,
    presence_penalty: float = 0.0,
    constraint: Constraint | None = None,
    chat_template: str | None = None,
    logprobs: int | None = None,
    prompt_logprobs: int | None = None,
    prompt_logprobs_from: int = 0,
) -> SamplingParams:
    """SamplingParams for a request's fields (InvalidSamplingParams naming a bad one).

    ``chat_template`` tells the model's tool-call format (Hermes when it shows none).
    """
    structured = constraint.fields(chat_template) if constraint is not None else {}
    return SamplingParams(
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        min_p=min_p,
        max_tokens=max_tokens,
        seed=seed,
        stop=tuple(stop),
        ignore_eos=ignore_eos,
        repetition_penalty=repetition_penalty,
        frequency_penalty=frequency_penalty,
        presence_penalty=presence_penalty,
        logprobs=logprobs,
        prompt_logprobs=prompt_logprobs,
        prompt_logprobs_from=prompt_logprobs_from,
        **structured,
    )


async def first_compiled(
    engine: AsyncEngine,
    candidates: Iterable[Callable[[], SamplingParams]],
    logger: logging.Logger,
) -> SamplingParams | None:
    """The first candidate's params the grammar library compiles; None when none does.

    A schema the library cannot handle must not fail a request: tools narrowed to the home
    fall back to the tools as offered, and so on. Each refusal is logged once.
    """
    for candidate in candidates:
        try:
            params = candidate()
            await engine.compile_constraint(params)
        except (InvalidSamplingParams, RequestRejected, ValueError) as err:
            if str(err) not in _REFUSED:
                _REFUSED.add(str(err))
                logger.warning("The grammar library refused a constraint: %s", err)
            continue
        return params
    return None


@dataclass(slots=True, frozen=True)
class ErrorInfo:
    """An engine error as a host reports it: its code, its message and whose fault it is."""

    code: str
    message: str
    # The caller's request caused it: fix the request rather than retry it as it is.
    caller: bool
    # The request field at fault (OpenAI's names), where the error points at one.
    param: str | None = None


def error_info(err: BaseException) -> ErrorInfo:
    """The code, message, fault and field of an error raised on a request."""
    message = str(err)
    if not isinstance(err, EngineError):
        return ErrorInfo("internal_error", f"{type(err).__name__}: {message}", caller=False)
    code = err.code
    param = _PARAMS.get(code)
    if isinstance(err, InvalidSamplingParams):
        param = message.split(" ", 1)[0]  # the message starts with the parameter's name
    elif isinstance(err, InvalidArgument):
        param = err.argument
    elif code == "invalid_structured_output":
        # The message starts with the field: json_schema, json_object or structural_tag.
        param = "tools" if message.startswith("structural_tag") else "response_format"
    return ErrorInfo(code, message, caller=code in CALLER_CODES, param=param)


async def start_engine(
    config: EngineConfig, progress: Callable[[float], None] | None = None
) -> AsyncEngine:
    """Load the model and start stepping; a failed start frees what it built and raises."""
    engine = AsyncEngine(config)
    try:
        await engine.start(progress)
    except BaseException:
        await engine.stop()
        raise
    return engine
