"""Actions with response data: ``paged_llm.generate`` and ``paged_llm.summarize``."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import probatio
from homeassistant.core import HomeAssistant, ServiceCall, ServiceResponse, SupportsResponse
from homeassistant.exceptions import HomeAssistantError, ServiceValidationError
from homeassistant.helpers import config_validation as cv
from homeassistant.helpers import selector, service

from paged_llm.engine.errors import EngineDeadError, EngineError
from paged_llm.engine.sequence import Priority, SamplingParams

from .const import (
    ATTR_CONFIG_ENTRY_ID,
    ATTR_MAX_TOKENS,
    ATTR_PATH,
    ATTR_PRIORITY,
    ATTR_PROMPT,
    ATTR_REPETITION_PENALTY,
    ATTR_SYSTEM_PROMPT,
    ATTR_TEMPERATURE,
    ATTR_TEXT,
    DEFAULT_MAX_TOKENS,
    DEFAULT_SERVICE_PRIORITY,
    DEFAULT_SUMMARY_MAX_TOKENS,
    DEFAULT_SUMMARY_REPETITION_PENALTY,
    DEFAULT_TEMPERATURE,
    DOMAIN,
    LOGGER,
    MAX_MAX_TOKENS,
    MAX_SUMMARY_FILE_BYTES,
    PRIORITIES,
    PRIORITY_SUMMARY,
    SERVICE_GENERATE,
    SERVICE_SUMMARIZE,
    SUMMARY_CHUNK_CONCURRENCY,
    SUMMARY_COMBINE_PROMPT,
    SUMMARY_PART_MAX_TOKENS,
    SUMMARY_PROMPT,
)
from .entity import sampling_params
from .prompt import PLAIN_STOP, chat_template, render_plain
from .runtime import PagedLLMConfigEntry, engine_error

if TYPE_CHECKING:
    from paged_llm.engine.async_engine import AsyncEngine

_ENTRY_FIELD = {
    probatio.Optional(ATTR_CONFIG_ENTRY_ID): selector.ConfigEntrySelector({"integration": DOMAIN})
}
GENERATE_SCHEMA = probatio.Schema(
    {
        **_ENTRY_FIELD,
        probatio.Required(ATTR_PROMPT): cv.string,
        probatio.Optional(ATTR_SYSTEM_PROMPT): cv.string,
        # Checked in the handler, so an unknown class gets a translated error.
        probatio.Optional(ATTR_PRIORITY, default=DEFAULT_SERVICE_PRIORITY): cv.string,
        probatio.Optional(ATTR_MAX_TOKENS, default=DEFAULT_MAX_TOKENS): probatio.All(
            probatio.Coerce(int), probatio.Range(min=1, max=MAX_MAX_TOKENS)
        ),
        probatio.Optional(ATTR_TEMPERATURE, default=DEFAULT_TEMPERATURE): probatio.All(
            probatio.Coerce(float), probatio.Range(min=0, max=2)
        ),
    }
)
SUMMARIZE_SCHEMA = probatio.Schema(
    {
        **_ENTRY_FIELD,
        probatio.Optional(ATTR_TEXT): cv.string,
        probatio.Optional(ATTR_PATH): cv.string,
        probatio.Optional(ATTR_MAX_TOKENS, default=DEFAULT_SUMMARY_MAX_TOKENS): probatio.All(
            probatio.Coerce(int), probatio.Range(min=1, max=MAX_MAX_TOKENS)
        ),
        probatio.Optional(ATTR_TEMPERATURE, default=0.0): probatio.All(
            probatio.Coerce(float), probatio.Range(min=0, max=2)
        ),
        probatio.Optional(
            ATTR_REPETITION_PENALTY, default=DEFAULT_SUMMARY_REPETITION_PENALTY
        ): probatio.All(probatio.Coerce(float), probatio.Range(min=1, max=2)),
    }
)


@dataclass
class Completion:
    """A finished request: its text and token counts."""

    text: str
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


def _prompt(engine: AsyncEngine, messages: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """Chat messages for models with a chat template, a transcript for those without."""
    if chat_template(engine.engine.tokenizer) is not None:
        return messages
    return render_plain(messages)


async def async_complete(
    engine: AsyncEngine,
    messages: list[dict[str, Any]],
    params: SamplingParams,
    priority: str | Priority,
) -> Completion:
    """Run one request to the end; engine errors become translated Home Assistant errors."""
    parts: list[str] = []
    last = None
    try:
        async for out in engine.generate(_prompt(engine, messages), params, priority):
            parts.append(out.text)
            last = out
    except EngineError as err:
        raise engine_error(err) from err
    except Exception as err:
        LOGGER.exception("Generation failed")
        raise HomeAssistantError(
            translation_domain=DOMAIN,
            translation_key="generation_failed",
            translation_placeholders={"reason": str(err)},
        ) from err
    return Completion(
        text="".join(parts).strip(),
        finish_reason=str(last.finish_reason) if last and last.finish_reason else None,
        prompt_tokens=last.prompt_tokens if last else 0,
        completion_tokens=last.completion_tokens if last else 0,
        cached_tokens=last.cached_tokens if last else 0,
    )


def _loaded_entry(hass: HomeAssistant, call: ServiceCall) -> PagedLLMConfigEntry:
    """The entry an action targets: the one given, or the only loaded one."""
    entry: PagedLLMConfigEntry = service.async_get_config_entry(
        hass, DOMAIN, call.data.get(ATTR_CONFIG_ENTRY_ID)
    )
    return entry


def _running_engine(entry: PagedLLMConfigEntry) -> AsyncEngine:
    """The entry's engine, or a translated error when it no longer runs."""
    engine = entry.runtime_data.engine
    if not engine.is_running:
        raise engine_error(EngineDeadError(str(engine.error or "the engine is not running")))
    return engine


def parse_priority(value: str) -> Priority:
    """The request class for a name, or a translated error listing the known ones."""
    try:
        return Priority.parse(value.strip().lower())
    except ValueError as err:
        raise ServiceValidationError(
            translation_domain=DOMAIN,
            translation_key="invalid_priority",
            translation_placeholders={"priority": value, "priorities": ", ".join(PRIORITIES)},
        ) from err


def read_allowed_file(hass: HomeAssistant, path: str) -> str:
    """Read a text file Home Assistant allows access to (blocking)."""
    if not hass.config.is_allowed_path(path):
        raise ServiceValidationError(
            translation_domain=DOMAIN,
            translation_key="path_not_allowed",
            translation_placeholders={"path": path},
        )
    file = Path(path)
    if not file.is_file():
        raise ServiceValidationError(
            translation_domain=DOMAIN,
            translation_key="file_not_found",
            translation_placeholders={"path": path},
        )
    size = file.stat().st_size
    if size > MAX_SUMMARY_FILE_BYTES:
        raise ServiceValidationError(
            translation_domain=DOMAIN,
            translation_key="file_too_large",
            translation_placeholders={
                "path": path,
                "size": str(size),
                "limit": str(MAX_SUMMARY_FILE_BYTES),
            },
        )
    return file.read_text(encoding="utf-8", errors="replace")


class Summarizer:
    """Summarises text of any length: chunks beyond the context are summarised, then merged."""

    def __init__(self, hass: HomeAssistant, engine: AsyncEngine, params: SamplingParams) -> None:
        """Prepare for one summary."""
        self.hass = hass
        self.engine = engine
        self.params = params
        # Parts summarise pieces of the text; only the final summary is held to max_tokens.
        # A part may use an eighth of the context, so a piece still leaves room for text.
        part_tokens = min(SUMMARY_PART_MAX_TOKENS, engine.engine.max_model_len // 8)
        self.part_params = replace(params, max_tokens=part_tokens)
        self.reserve = max(params.max_tokens, part_tokens)
        self.chunks = 0
        self.requests = 0
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.parts: list[Completion] = []
        self.final: Completion | None = None
        self._slots = asyncio.Semaphore(SUMMARY_CHUNK_CONCURRENCY)

    def _messages(self, instruction: str, text: str) -> list[dict[str, Any]]:
        """The request for one piece of text."""
        return [{"role": "user", "content": f"{instruction}\n\n{text}"}]

    def _split(self, instruction: str, text: str) -> list[str]:
        """Cut text into pieces whose request fits the context (blocking: tokenizes)."""
        llm_engine = self.engine.engine
        tokenizer = llm_engine.tokenizer
        overhead = len(llm_engine.tokenize(_prompt(self.engine, self._messages(instruction, "."))))
        budget = llm_engine.max_model_len - self.reserve - overhead - 8
        ids: list[int] = tokenizer.encode(text, add_special_tokens=False)
        if len(ids) <= budget:
            return [text]
        if budget < 4 * self.reserve:
            # Each round of merging must at least halve the text, or it would never end.
            raise ServiceValidationError(
                translation_domain=DOMAIN,
                translation_key="summary_max_tokens_too_large",
                translation_placeholders={
                    "max_tokens": str(self.params.max_tokens),
                    "context": str(llm_engine.max_model_len),
                },
            )
        return [tokenizer.decode(ids[i : i + budget]) for i in range(0, len(ids), budget)]

    async def _summarize_piece(
        self, instruction: str, text: str, params: SamplingParams
    ) -> Completion:
        """Summarise one piece that fits the context."""
        async with self._slots:
            done = await async_complete(
                self.engine, self._messages(instruction, text), params, PRIORITY_SUMMARY
            )
        self.requests += 1
        self.prompt_tokens += done.prompt_tokens
        self.completion_tokens += done.completion_tokens
        return done

    async def async_summarize(self, text: str, instruction: str = SUMMARY_PROMPT) -> str:
        """Summarise ``text``, splitting and merging as often as its length needs."""
        pieces = await self.hass.async_add_executor_job(self._split, instruction, text)
        self.chunks = self.chunks or len(pieces)
        if len(pieces) == 1:
            self.final = await self._summarize_piece(instruction, pieces[0], self.params)
            return self.final.text
        partial = await asyncio.gather(
            *(self._summarize_piece(SUMMARY_PROMPT, piece, self.part_params) for piece in pieces)
        )
        self.parts.extend(partial)
        # Every round at least halves the text (see _split), so this recursion is shallow.
        merged = "\n\n".join(done.text for done in partial)
        return await self.async_summarize(merged, SUMMARY_COMBINE_PROMPT)

    @property
    def truncated(self) -> bool:
        """Whether any request stopped at its token limit rather than by itself."""
        done = [*self.parts, *([self.final] if self.final else [])]
        return any(d.finish_reason == "length" for d in done)


async def _async_generate(call: ServiceCall) -> ServiceResponse:
    """Answer a prompt in the requested priority class."""
    entry = _loaded_entry(call.hass, call)
    prompt: str = call.data[ATTR_PROMPT]
    if not prompt.strip():
        raise ServiceValidationError(translation_domain=DOMAIN, translation_key="empty_prompt")
    priority = parse_priority(call.data[ATTR_PRIORITY])
    engine = _running_engine(entry)
    params = sampling_params(
        {},
        max_tokens=call.data[ATTR_MAX_TOKENS],
        temperature=call.data[ATTR_TEMPERATURE],
        stop=() if chat_template(engine.engine.tokenizer) is not None else PLAIN_STOP,
    )
    messages: list[dict[str, Any]] = []
    if system := call.data.get(ATTR_SYSTEM_PROMPT):
        messages.append({"role": "system", "content": system})
    messages.append({"role": "user", "content": prompt})
    done = await async_complete(engine, messages, params, priority)
    return {
        "text": done.text,
        "finish_reason": done.finish_reason,
        "prompt_tokens": done.prompt_tokens,
        "completion_tokens": done.completion_tokens,
        "cached_tokens": done.cached_tokens,
    }


async def _async_summarize(call: ServiceCall) -> ServiceResponse:
    """Summarise a text or an allowed file in the background class."""
    hass = call.hass
    entry = _loaded_entry(hass, call)
    text: str | None = call.data.get(ATTR_TEXT)
    path: str | None = call.data.get(ATTR_PATH)
    if (text is None) == (path is None):
        raise ServiceValidationError(translation_domain=DOMAIN, translation_key="text_or_path")
    if path is not None:
        text = await hass.async_add_executor_job(read_allowed_file, hass, path)
    assert text is not None
    if not text.strip():
        raise ServiceValidationError(translation_domain=DOMAIN, translation_key="empty_text")
    engine = _running_engine(entry)
    params = sampling_params(
        {},
        max_tokens=call.data[ATTR_MAX_TOKENS],
        temperature=call.data[ATTR_TEMPERATURE],
        repetition_penalty=call.data[ATTR_REPETITION_PENALTY],
        stop=() if chat_template(engine.engine.tokenizer) is not None else PLAIN_STOP,
    )
    started = time.monotonic()
    summarizer = Summarizer(hass, engine, params)
    summary = await summarizer.async_summarize(text)
    final = summarizer.final
    return {
        "summary": summary,
        "finish_reason": final.finish_reason if final else None,
        "truncated": summarizer.truncated,
        "elapsed_seconds": round(time.monotonic() - started, 3),
        "chunks": summarizer.chunks,
        "requests": summarizer.requests,
        "prompt_tokens": summarizer.prompt_tokens,
        "completion_tokens": summarizer.completion_tokens,
        "parts": [
            {
                "finish_reason": part.finish_reason,
                "prompt_tokens": part.prompt_tokens,
                "completion_tokens": part.completion_tokens,
            }
            for part in summarizer.parts
        ],
    }


def async_setup_services(hass: HomeAssistant) -> None:
    """Register the actions (once, for all entries)."""
    hass.services.async_register(
        DOMAIN,
        SERVICE_GENERATE,
        _async_generate,
        schema=GENERATE_SCHEMA,
        supports_response=SupportsResponse.ONLY,
    )
    hass.services.async_register(
        DOMAIN,
        SERVICE_SUMMARIZE,
        _async_summarize,
        schema=SUMMARIZE_SCHEMA,
        supports_response=SupportsResponse.ONLY,
    )
