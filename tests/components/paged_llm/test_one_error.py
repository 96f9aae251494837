"""One clear error per caller: parts failing (several at once) reach it as one translated error."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from http import HTTPStatus
from typing import Any

import pytest
from homeassistant.core import HomeAssistant
from homeassistant.exceptions import HomeAssistantError
from homeassistant.setup import async_setup_component
from pytest_homeassistant_custom_component.common import MockConfigEntry
from pytest_homeassistant_custom_component.typing import ClientSessionGenerator

from custom_components.paged_llm.backend import BackendError
from custom_components.paged_llm.const import DOMAIN
from custom_components.paged_llm.embedded import EmbeddedBackend
from custom_components.paged_llm.errors import one_error
from tests.helpers.home_assistant import engine_settled
from tests.helpers.support import becomes_true

# Long enough for a 512-token context to cut it into more parts than run at once.
WORDS = 3000


async def _small_context_entry(hass: HomeAssistant, entry: MockConfigEntry) -> Any:
    """Set ``entry`` up with a 512-token context, so a few thousand words make many parts."""
    hass.config_entries.async_update_entry(entry, data={**entry.data, "max_model_len": 512})
    assert await hass.config_entries.async_setup(entry.entry_id)
    # With the agent's prompt warm-up, so the summary's requests are the only ones.
    await hass.async_block_till_done(wait_background_tasks=True)
    return entry.runtime_data.backend.engine


async def _parts_running(engine: Any) -> None:
    """Wait until at least two of a summary's parts run on the engine at once."""
    assert await becomes_true(lambda: engine.metrics().num_requests_running >= 2, 120)


def _assert_one_restarting_error(err: BaseException) -> None:
    """``err`` is one translated error saying the engine restarts, standing for several parts."""
    assert isinstance(err, HomeAssistantError)
    assert not isinstance(err, BaseExceptionGroup)
    assert err.translation_domain == DOMAIN
    assert err.translation_key == "engine_restarting"
    assert "restarting" in str(err)
    # The parts failed together; the one error stands for all of them.
    assert isinstance(err.__cause__, ExceptionGroup)
    assert len(err.__cause__.exceptions) >= 2


async def _serves(hass: HomeAssistant, entry: MockConfigEntry) -> None:
    """The reloaded entry's engine holds no block and answers the next request."""
    engine = entry.runtime_data.backend.engine
    assert (await engine_settled(engine)).kv_blocks_used == 0
    data = {"prompt": "hello", "max_tokens": 4}
    response = await hass.services.async_call(
        DOMAIN, "generate", data, blocking=True, return_response=True
    )
    assert isinstance(response, dict)
    assert response["completion_tokens"] == 4


async def test_a_summary_whose_parts_a_reload_ends_raises_one_translated_error(
    hass: HomeAssistant,
    mock_config_entry: MockConfigEntry,
    ha_core: None,
    make_long_text: Callable[[int], str],
) -> None:
    """The user's case: a reload under a running summary; its parts fail at once."""
    engine = await _small_context_entry(hass, mock_config_entry)
    try:
        call = hass.async_create_task(
            hass.services.async_call(
                DOMAIN,
                "summarize",
                {"text": make_long_text(WORDS), "max_tokens": 8},
                blocking=True,
                return_response=True,
            )
        )
        await _parts_running(engine)
        assert await hass.config_entries.async_reload(mock_config_entry.entry_id)
        with pytest.raises(HomeAssistantError) as err:
            await call
        _assert_one_restarting_error(err.value)
        assert mock_config_entry.runtime_data.backend.engine is not engine
        await _serves(hass, mock_config_entry)
    finally:
        assert await hass.config_entries.async_unload(mock_config_entry.entry_id)


async def test_the_rest_api_answers_a_summary_a_reload_ends_with_its_message_as_json(
    hass: HomeAssistant,
    mock_config_entry: MockConfigEntry,
    ha_core: None,
    hass_client: ClientSessionGenerator,
    make_long_text: Callable[[int], str],
) -> None:
    """POST /api/services/paged_llm/summarize: the translated message as JSON, not a bare 500.

    Home Assistant's REST API answers a HomeAssistantError with status 500 and its message
    as JSON (only a ServiceValidationError gets a 400); an untranslated exception (the
    task group's ExceptionGroup) gave aiohttp's bare "500 Internal Server Error" text.
    """
    assert await async_setup_component(hass, "http", {})
    assert await async_setup_component(hass, "api", {})
    engine = await _small_context_entry(hass, mock_config_entry)
    client = await hass_client()
    try:
        post = hass.async_create_task(
            client.post(
                f"/api/services/{DOMAIN}/summarize?return_response",
                json={"text": make_long_text(WORDS), "max_tokens": 8},
            )
        )
        await _parts_running(engine)
        assert await hass.config_entries.async_reload(mock_config_entry.entry_id)
        response = await post
        assert response.status == HTTPStatus.INTERNAL_SERVER_ERROR
        assert response.content_type == "application/json"
        body = await response.json()
        assert "restarting" in body["message"]
        await _serves(hass, mock_config_entry)
    finally:
        assert await hass.config_entries.async_unload(mock_config_entry.entry_id)


async def test_parts_failing_together_on_a_live_engine_give_one_error_and_free_their_blocks(
    hass: HomeAssistant,
    mock_config_entry: MockConfigEntry,
    ha_core: None,
    make_long_text: Callable[[int], str],
) -> None:
    """Parts the engine refuses after they started: one error; the others abort, blocks return."""
    from paged_llm.engine.errors import RequestRejected

    engine = await _small_context_entry(hass, mock_config_entry)
    real_generate = engine.generate
    started = itertools.count()
    fail = asyncio.Event()
    waiting = 0

    async def refusing(
        prompt: Any, params: Any, priority: Any, **kwargs: Any
    ) -> AsyncIterator[Any]:
        """The real request, refused after its first output once ``fail`` is set (two parts)."""
        nonlocal waiting
        # Only the summary's parts (background), not a warm-up of the agent's prompt.
        number = next(started) if priority == "background" else None
        async with aclosing(real_generate(prompt, params, priority, **kwargs)) as outputs:
            async for out in outputs:
                yield out
                if number is not None and number < 2:
                    waiting += 1
                    await fail.wait()
                    raise RequestRejected("queue_full", "the queue is full")

    engine.generate = refusing  # type: ignore[method-assign]
    try:
        call = hass.async_create_task(
            hass.services.async_call(
                DOMAIN,
                "summarize",
                {"text": make_long_text(WORDS), "max_tokens": 8},
                blocking=True,
                return_response=True,
            )
        )
        # Both refused parts hold blocks and wait, so they fail in the same loop turn.
        assert await becomes_true(lambda: waiting == 2, 120)
        assert await becomes_true(lambda: engine.metrics().kv_blocks_used > 0, 10)
        fail.set()
        with pytest.raises(HomeAssistantError) as err:
            await call
        assert err.value.translation_key == "rejected_queue_full"
        assert isinstance(err.value.__cause__, ExceptionGroup)
        assert len(err.value.__cause__.exceptions) == 2
        # The parts still running were cancelled: their requests aborted, their blocks back.
        metrics = await engine_settled(engine)
        assert metrics.num_requests_running == metrics.num_requests_waiting == 0
        assert metrics.kv_blocks_used == 0
        assert engine.is_running
    finally:
        del engine.generate
        assert await hass.config_entries.async_unload(mock_config_entry.entry_id)


def test_one_error_picks_the_first_meaningful_failure_of_a_group() -> None:
    first = HomeAssistantError(translation_domain=DOMAIN, translation_key="engine_restarting")
    group = ExceptionGroup("parts", [RuntimeError("bug"), first, BackendError("engine_dead", "x")])
    assert one_error(group) is first
    # A backend error is translated; an unexpected one is the generic failure, named.
    translated = one_error(ExceptionGroup("parts", [BackendError("engine_dead", "stopped")]))
    assert translated.translation_key == "engine_dead"
    bug = one_error(ExceptionGroup("parts", [ExceptionGroup("inner", [RuntimeError("bug")])]))
    assert bug.translation_key == "generation_failed"
    assert bug.translation_placeholders == {"reason": "bug"}


async def test_a_crash_asks_for_one_restart_however_many_requests_it_ends() -> None:
    from paged_llm.engine.errors import EngineDeadError

    class Crashed:
        """An engine whose step loop crashed."""

        error = RuntimeError("step failed")

    backend = EmbeddedBackend(Crashed())  # type: ignore[arg-type]
    crash = EngineDeadError("the engine failed")
    # Reading the tokenizer or the limits never asks: only requests, whose caller reloads.
    assert backend._error(crash).restart is False
    errors = [backend._error(crash, restart=True) for _ in range(5)]
    assert [err.restart for err in errors] == [True, False, False, False, False]
    assert {err.key for err in errors} == {"engine_dead"}
