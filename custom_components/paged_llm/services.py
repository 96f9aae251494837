"""Actions with response data: ``paged_llm.generate`` and ``paged_llm.summarize``."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import probatio
from homeassistant.core import HomeAssistant, ServiceCall, ServiceResponse, SupportsResponse
from homeassistant.exceptions import ServiceValidationError
from homeassistant.helpers import config_validation as cv
from homeassistant.helpers import selector, service

from paged_llm.protocol.priority import parse_priority as parse_class

from .chat import async_complete
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
    MAX_MAX_TOKENS,
    MAX_SUMMARY_FILE_BYTES,
    PRIORITIES,
    SERVICE_GENERATE,
    SERVICE_SUMMARIZE,
)
from .entity import agent_sampling
from .errors import raising_one_error
from .runtime import PagedLLMConfigEntry
from .summarize import Summarizer

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


def _one_error(
    handler: Callable[[ServiceCall], Coroutine[Any, Any, ServiceResponse]],
) -> Callable[[ServiceCall], Coroutine[Any, Any, ServiceResponse]]:
    """``handler``, raising one translated error for any failure, never a group or a bare one.

    Home Assistant translates a single HomeAssistantError (the REST API answers it with
    its message as JSON); anything else reaches callers as an untranslated 500.
    Cancellation (a stopped automation) passes as it is.
    """

    @functools.wraps(handler)
    async def wrapped(call: ServiceCall) -> ServiceResponse:
        """Run the action; translate what fails."""
        with raising_one_error():
            return await handler(call)

    return wrapped


def _loaded_entry(hass: HomeAssistant, call: ServiceCall) -> PagedLLMConfigEntry:
    """The entry an action targets: the one given, or the only loaded one."""
    entry: PagedLLMConfigEntry = service.async_get_config_entry(
        hass, DOMAIN, call.data.get(ATTR_CONFIG_ENTRY_ID)
    )
    return entry


def parse_priority(value: str) -> str:
    """The request class for a name, or a translated error listing the known ones."""
    try:
        return parse_class(value).label
    except ValueError:
        raise ServiceValidationError(
            translation_domain=DOMAIN,
            translation_key="invalid_priority",
            translation_placeholders={"priority": value, "priorities": ", ".join(PRIORITIES)},
        ) from None


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


async def _async_generate(call: ServiceCall) -> ServiceResponse:
    """Answer a prompt in the requested priority class."""
    entry = _loaded_entry(call.hass, call)
    prompt: str = call.data[ATTR_PROMPT]
    if not prompt.strip():
        raise ServiceValidationError(translation_domain=DOMAIN, translation_key="empty_prompt")
    priority = parse_priority(call.data[ATTR_PRIORITY])
    sampling = agent_sampling(
        {}, max_tokens=call.data[ATTR_MAX_TOKENS], temperature=call.data[ATTR_TEMPERATURE]
    )
    messages: list[dict[str, Any]] = []
    if system := call.data.get(ATTR_SYSTEM_PROMPT):
        messages.append({"role": "system", "content": system})
    messages.append({"role": "user", "content": prompt})
    done = await async_complete(call.hass, entry, messages, sampling, priority)
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
    sampling = agent_sampling(
        {},
        max_tokens=call.data[ATTR_MAX_TOKENS],
        temperature=call.data[ATTR_TEMPERATURE],
        repetition_penalty=call.data[ATTR_REPETITION_PENALTY],
    )
    started = time.monotonic()
    summarizer = Summarizer(hass, entry, sampling, call.context)
    summary = await summarizer.async_summarize(text)
    final = summarizer.final
    return {
        "summary": summary,
        "finish_reason": final.finish_reason if final else None,
        "truncated": summarizer.truncated,
        "elapsed_seconds": round(time.monotonic() - started, 3),
        "chunks": summarizer.chunks,
        "rounds": summarizer.rounds,
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
        _one_error(_async_generate),
        schema=GENERATE_SCHEMA,
        supports_response=SupportsResponse.ONLY,
    )
    hass.services.async_register(
        DOMAIN,
        SERVICE_SUMMARIZE,
        _one_error(_async_summarize),
        schema=SUMMARIZE_SCHEMA,
        supports_response=SupportsResponse.ONLY,
    )
