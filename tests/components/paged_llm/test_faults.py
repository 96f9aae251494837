"""Faults in a Home Assistant with the real engine: every caller gets an answer or one clear error.

Each case asserts, within a bound: each caller's answer or translated error, the KV pool's
used blocks back to 0, the engine serving the next request, nothing half-written on disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import aclosing
from pathlib import Path
from typing import Any

import pytest
from homeassistant.components import ai_task, conversation
from homeassistant.config_entries import ConfigEntryState
from homeassistant.core import Context, HomeAssistant
from homeassistant.exceptions import HomeAssistantError
from homeassistant.helpers import intent
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.paged_llm.const import (
    DOMAIN,
    PRIORITY_AI_TASK,
    PRIORITY_CONVERSATION,
    PRIORITY_SUMMARY,
)
from tests.helpers.home_assistant import agent_entity_id, engine_settled
from tests.helpers.support import becomes_true, bundled_model_dir

BUNDLED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# How long a caller may wait for its answer or its error once the fault happened.
BOUND_S = 60.0
# Enough words for a 512-token context to cut into several parts that run at once.
WORDS = 3000
# Each engine step sleeps this long, so a voice answer is still streaming when the fault
# comes (the tiny model writes a few hundred tokens a second otherwise).
SLOW_STEP_S = 0.02


@pytest.fixture
def conversation_options(conversation_options: dict[str, Any]) -> dict[str, Any]:
    """Answers long enough to be under way when the fault comes."""
    return {**conversation_options, "max_tokens": 200}


@pytest.fixture
def ai_task_options(ai_task_options: dict[str, Any]) -> dict[str, Any]:
    """AI task answers long enough to be under way when the fault comes."""
    return {**ai_task_options, "max_tokens": 200}


@pytest.fixture
def slow_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every engine step takes at least SLOW_STEP_S, as on a slower model."""
    import time

    from paged_llm.engine.llm_engine import LLMEngine

    real_step = LLMEngine.step

    def step(self: LLMEngine) -> Any:
        """The real step, then a pause (on the engine's thread)."""
        outputs = real_step(self)
        time.sleep(SLOW_STEP_S)
        return outputs

    monkeypatch.setattr(LLMEngine, "step", step)


async def _set_up(hass: HomeAssistant, entry: MockConfigEntry, **data: Any) -> Any:
    """Set ``entry`` up with a 512-token context (and ``data``); its engine once idle."""
    hass.config_entries.async_update_entry(entry, data={**entry.data, "max_model_len": 512, **data})
    assert await hass.config_entries.async_setup(entry.entry_id)
    await hass.async_block_till_done(wait_background_tasks=True)
    assert entry.state is ConfigEntryState.LOADED
    return entry.runtime_data.backend.engine


@contextlib.contextmanager
def _streaming(engine: Any) -> Iterator[dict[str, int]]:
    """Count, by priority, requests of ``engine`` that streamed at least one output."""
    real_generate = engine.generate
    streamed: dict[str, int] = {}

    async def counting(
        prompt: Any, params: Any, priority: Any, **kwargs: Any
    ) -> AsyncIterator[Any]:
        """The real request; its first output counts it."""
        first = True
        async with aclosing(real_generate(prompt, params, priority, **kwargs)) as outputs:
            async for out in outputs:
                if first:
                    streamed[str(priority)] = streamed.get(str(priority), 0) + 1
                    first = False
                yield out

    engine.generate = counting
    try:
        yield streamed
    finally:
        del engine.generate


def _callers(
    hass: HomeAssistant, entry: MockConfigEntry, text: str
) -> dict[str, asyncio.Task[Any]]:
    """A voice question, an AI task and a summary, started at once."""
    voice = agent_entity_id(hass, entry, "conversation", "conversation")
    task = agent_entity_id(hass, entry, "ai_task", "ai_task_data")
    return {
        PRIORITY_CONVERSATION: hass.async_create_task(
            conversation.async_converse(
                hass, "Is the kitchen light on?", None, Context(), agent_id=voice
            )
        ),
        PRIORITY_AI_TASK: hass.async_create_task(
            ai_task.async_generate_data(
                hass, task_name="fault", entity_id=task, instructions="Describe the home."
            )
        ),
        PRIORITY_SUMMARY: hass.async_create_task(
            hass.services.async_call(
                DOMAIN,
                "summarize",
                {"text": text, "max_tokens": 8},
                blocking=True,
                return_response=True,
            )
        ),
    }


async def _outcomes(callers: dict[str, asyncio.Task[Any]]) -> dict[str, Any]:
    """Each caller's answer or exception, all within BOUND_S."""
    async with asyncio.timeout(BOUND_S):
        results = await asyncio.gather(*callers.values(), return_exceptions=True)
    return dict(zip(callers, results, strict=True))


def _assert_told(outcome: Any, key: str, words: str) -> None:
    """``outcome`` is one translated error with ``key`` (Assist: its spoken error says it)."""
    if isinstance(outcome, conversation.ConversationResult):
        response = outcome.response
        assert response.response_type is intent.IntentResponseType.ERROR, response.speech
        assert words in response.speech["plain"]["speech"]
        return
    assert isinstance(outcome, HomeAssistantError), repr(outcome)
    assert not isinstance(outcome, BaseExceptionGroup)
    assert outcome.translation_domain == DOMAIN
    assert outcome.translation_key == key
    assert words in str(outcome)


async def _serves(hass: HomeAssistant, entry: MockConfigEntry) -> None:
    """The entry's engine holds no block, and a voice question and an action get answers."""
    engine = entry.runtime_data.backend.engine
    assert engine.is_running
    assert (await engine_settled(engine)).kv_blocks_used == 0
    voice = agent_entity_id(hass, entry, "conversation", "conversation")
    result = await conversation.async_converse(hass, "hello", None, Context(), agent_id=voice)
    assert result.response.response_type is not intent.IntentResponseType.ERROR
    await _generate(hass)
    assert (await engine_settled(engine)).kv_blocks_used == 0


async def _reloaded_itself(hass: HomeAssistant, entry: MockConfigEntry, engine: Any) -> None:
    """The entry reloaded itself onto a new engine (within BOUND_S), which serves."""
    assert await becomes_true(
        lambda: (
            entry.state is ConfigEntryState.LOADED
            and entry.runtime_data.backend.engine is not engine
        ),
        BOUND_S,
    )
    await hass.async_block_till_done(wait_background_tasks=True)
    await _serves(hass, entry)


async def test_a_reload_under_a_voice_answer_an_ai_task_and_a_summary(
    hass: HomeAssistant,
    mock_config_entry: MockConfigEntry,
    ha_core: None,
    slow_steps: None,
    make_long_text: Callable[[int], str],
) -> None:
    """Each of the three callers is told the engine restarts; the reloaded entry answers."""
    engine = await _set_up(hass, mock_config_entry)
    try:
        with _streaming(engine) as streamed:
            callers = _callers(hass, mock_config_entry, make_long_text(WORDS))
            assert await becomes_true(lambda: len(streamed) == 3, BOUND_S), streamed
            assert await hass.config_entries.async_reload(mock_config_entry.entry_id)
            outcomes = await _outcomes(callers)
        for outcome in outcomes.values():
            _assert_told(outcome, "engine_restarting", "restarting")
        # The old engine let go of its pool; the new one serves.
        assert not engine.is_running
        assert mock_config_entry.runtime_data.backend.engine is not engine
        await _serves(hass, mock_config_entry)
    finally:
        assert await hass.config_entries.async_unload(mock_config_entry.entry_id)


async def test_home_assistant_stopping_under_requests_tells_each_caller(
    hass: HomeAssistant,
    mock_config_entry: MockConfigEntry,
    ha_core: None,
    slow_steps: None,
    make_long_text: Callable[[int], str],
) -> None:
    """hass.async_stop under three callers: each is told, the engine's thread ends."""
    import threading

    engine = await _set_up(hass, mock_config_entry)
    with _streaming(engine) as streamed:
        callers = _callers(hass, mock_config_entry, make_long_text(WORDS))
        assert await becomes_true(lambda: len(streamed) == 3, BOUND_S), streamed
        stopping = asyncio.get_running_loop().create_task(hass.async_stop())
        outcomes = await _outcomes(callers)
        async with asyncio.timeout(BOUND_S):
            await stopping
    for outcome in outcomes.values():
        _assert_told(outcome, "engine_restarting", "restarting")
    assert not engine.is_running
    assert not any(t.name == "paged-llm-engine" for t in threading.enumerate())


async def test_the_engine_thread_dying_mid_batch_is_reported_and_a_reload_recovers(
    hass: HomeAssistant,
    mock_config_entry: MockConfigEntry,
    ha_core: None,
    slow_steps: None,
    make_long_text: Callable[[int], str],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A step raising once: every caller gets engine_dead, the entry reloads itself, serves."""
    from paged_llm.engine.llm_engine import LLMEngine

    engine = await _set_up(hass, mock_config_entry)
    armed = False
    slow_step = LLMEngine.step

    def failing_step(self: LLMEngine) -> Any:
        """The step, or once armed, a fault in it (as a kernel bug or a bad tensor would)."""
        nonlocal armed
        if armed:
            armed = False
            raise RuntimeError("injected step fault")
        return slow_step(self)

    monkeypatch.setattr(LLMEngine, "step", failing_step)
    with _streaming(engine) as streamed:
        callers = _callers(hass, mock_config_entry, make_long_text(WORDS))
        assert await becomes_true(lambda: len(streamed) == 3, BOUND_S), streamed
        with caplog.at_level(logging.ERROR):
            armed = True
            outcomes = await _outcomes(callers)
    for outcome in outcomes.values():
        _assert_told(outcome, "engine_dead", "injected step fault")
    # The crash is logged once with its cause, and the entry reloads itself, once.
    assert "The engine's step loop crashed" in caplog.text
    assert caplog.text.count("restarting it") == 1
    assert isinstance(engine.error, RuntimeError)
    await _reloaded_itself(hass, mock_config_entry, engine)
    assert await hass.config_entries.async_unload(mock_config_entry.entry_id)


async def test_a_full_kv_pool_under_a_long_document_still_answers_voice_and_tasks(
    hass: HomeAssistant,
    mock_config_entry: MockConfigEntry,
    ha_core: None,
    make_long_text: Callable[[int], str],
) -> None:
    """A pool that holds little more than one full request: the summary preempts or waits.

    Voice and the AI task come first by priority; everyone answers, the pool drains to 0.
    """
    # 1 MiB of KV at this tiny model's 2 layers x 64 wide is a few thousand tokens; with a
    # 512-token context the summary's parts alone would fill it several times over.
    engine = await _set_up(hass, mock_config_entry, kv_budget_mib=1)
    pool = engine.info.num_kv_blocks * engine.info.block_size
    assert pool < 8 * 512, pool
    try:
        callers = _callers(hass, mock_config_entry, make_long_text(WORDS))
        peak = 0
        while not all(task.done() for task in callers.values()):
            peak = max(peak, engine.metrics().kv_blocks_used)
            await asyncio.sleep(0.02)
        outcomes = await _outcomes(callers)
        voice = outcomes[PRIORITY_CONVERSATION]
        assert voice.response.response_type is not intent.IntentResponseType.ERROR
        assert isinstance(outcomes[PRIORITY_AI_TASK], ai_task.GenDataTaskResult)
        summary = outcomes[PRIORITY_SUMMARY]
        assert isinstance(summary, dict), repr(summary)
        assert summary["summary"]
        assert peak > 0
        await _serves(hass, mock_config_entry)
    finally:
        assert await hass.config_entries.async_unload(mock_config_entry.entry_id)


async def test_idle_unload_firing_as_requests_arrive(
    hass: HomeAssistant,
    mock_config_entry: MockConfigEntry,
    ha_core: None,
    make_long_text: Callable[[int], str],
) -> None:
    """The idle timer's unload and requests race: each request answers, one engine serves."""
    await _set_up(hass, mock_config_entry)
    backend = mock_config_entry.runtime_data.backend
    try:
        for unload_first in (True, False):
            first = backend.engine
            backend.idle_unload_s = 600.0  # armed, not due: the test fires it
            unload = hass.async_create_task(backend._async_unload_idle())
            calls = [
                hass.async_create_task(
                    hass.services.async_call(
                        DOMAIN,
                        service,
                        data,
                        blocking=True,
                        return_response=True,
                    ),
                    eager_start=False,
                )
                for service, data in (
                    ("generate", {"prompt": "hello", "max_tokens": 3}),
                    ("summarize", {"text": make_long_text(600), "max_tokens": 4}),
                )
            ]
            if not unload_first:
                await asyncio.sleep(0)
            async with asyncio.timeout(BOUND_S):
                results = await asyncio.gather(unload, *calls, return_exceptions=True)
            assert results[0] is None
            generated, summarized = results[1:]
            assert isinstance(generated, dict), repr(generated)
            assert generated["completion_tokens"] == 3
            assert isinstance(summarized, dict), repr(summarized)
            assert summarized["summary"]
            if backend.unloaded:
                # The unload came last: nothing ran, so it went; the next request loads.
                assert not first.is_running
            backend.idle_unload_s = 0.0
        await _serves(hass, mock_config_entry)
        assert not backend.unloaded
    finally:
        assert await hass.config_entries.async_unload(mock_config_entry.entry_id)


async def test_requests_arriving_while_the_model_loads_wait_for_it(
    hass: HomeAssistant,
    mock_config_entry: MockConfigEntry,
    ha_core: None,
) -> None:
    """After an idle unload, five requests at once: one load, five answers.

    During a reload (the entry not loaded) an action is refused with Home Assistant's own
    translated "not loaded" error, never a bare failure.
    """
    await _set_up(hass, mock_config_entry)
    backend = mock_config_entry.runtime_data.backend
    try:
        await backend._async_unload_idle()
        assert backend.unloaded
        loads = 0
        from paged_llm.engine import api

        real_start = api.start_engine

        async def counting_start(*args: Any, **kwargs: Any) -> Any:
            """The real start, counted."""
            nonlocal loads
            loads += 1
            return await real_start(*args, **kwargs)

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(api, "start_engine", counting_start)
            async with asyncio.timeout(BOUND_S):
                answers = await asyncio.gather(
                    *(
                        hass.services.async_call(
                            DOMAIN,
                            "generate",
                            {"prompt": f"hello {i}", "max_tokens": 2},
                            blocking=True,
                            return_response=True,
                        )
                        for i in range(5)
                    )
                )
        assert loads == 1
        assert all(isinstance(a, dict) and a["completion_tokens"] == 2 for a in answers)

        reload = hass.async_create_task(
            hass.config_entries.async_reload(mock_config_entry.entry_id)
        )
        assert await becomes_true(
            lambda: mock_config_entry.state is not ConfigEntryState.LOADED, BOUND_S
        )
        with pytest.raises(HomeAssistantError) as err:
            await hass.services.async_call(
                DOMAIN, "generate", {"prompt": "hi"}, blocking=True, return_response=True
            )
        assert err.value.translation_key is not None
        assert await reload
        await _serves(hass, mock_config_entry)
    finally:
        assert await hass.config_entries.async_unload(mock_config_entry.entry_id)


@pytest.fixture
def gguf_copy(tmp_path: Path) -> Path:
    """A copy of the bundled GGUF file that a test may delete, replace or rewrite."""
    copy = tmp_path / "models" / "smollm2.gguf"
    copy.parent.mkdir()
    shutil.copyfile(bundled_model_dir() / BUNDLED_FILE, copy)
    return copy


async def _generate(hass: HomeAssistant) -> dict[str, Any]:
    """A short answer through the generate action."""
    response = await hass.services.async_call(
        DOMAIN,
        "generate",
        {"prompt": "hello", "max_tokens": 3},
        blocking=True,
        return_response=True,
    )
    assert isinstance(response, dict)
    assert response["completion_tokens"] == 3
    return response


def _replace_by_rename(path: Path) -> tuple[int, int]:
    """Replace ``path`` as a download does (a new file renamed over it): old, new inode."""
    old = path.stat().st_ino
    new = path.with_name("new.gguf.part")
    shutil.copyfile(path, new)
    new.replace(path)
    return old, path.stat().st_ino


def _rewrite_in_place(path: Path) -> None:
    """Write into the mapped inode (its own bytes back) with a new modification time."""
    with path.open("r+b") as file:
        head = file.read(4096)
        file.seek(0)
        file.write(head)
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))


async def test_a_model_file_deleted_while_loaded_serves_on_and_fails_clearly_at_next_load(
    hass: HomeAssistant, mock_config_entry: MockConfigEntry, ha_core: None, gguf_copy: Path
) -> None:
    """The mapping keeps the deleted file's pages; the next load says the file is missing."""
    await _set_up(hass, mock_config_entry, model=str(gguf_copy), dtype="auto", kv_budget_mib=16)
    try:
        await hass.async_add_executor_job(gguf_copy.unlink)
        await _generate(hass)
        await hass.config_entries.async_reload(mock_config_entry.entry_id)
        assert mock_config_entry.state is ConfigEntryState.SETUP_ERROR
        assert mock_config_entry.error_reason_translation_key == "model_load_failed"
        assert str(gguf_copy) in (mock_config_entry.reason or "")
        # The file back, the entry loads and serves again.
        await hass.async_add_executor_job(
            shutil.copyfile, bundled_model_dir() / BUNDLED_FILE, gguf_copy
        )
        assert await hass.config_entries.async_reload(mock_config_entry.entry_id)
        await hass.async_block_till_done(wait_background_tasks=True)
        await _serves(hass, mock_config_entry)
    finally:
        await hass.config_entries.async_unload(mock_config_entry.entry_id)


async def test_a_model_file_replaced_by_a_rename_serves_on_and_the_next_load_maps_the_new_one(
    hass: HomeAssistant, mock_config_entry: MockConfigEntry, ha_core: None, gguf_copy: Path
) -> None:
    """`mv new old` (a download's last step): the old inode stays mapped until a reload."""
    engine = await _set_up(
        hass, mock_config_entry, model=str(gguf_copy), dtype="auto", kv_budget_mib=16
    )
    try:
        old_inode, new_inode = await hass.async_add_executor_job(_replace_by_rename, gguf_copy)
        assert new_inode != old_inode
        await _generate(hass)
        assert engine.is_running
        assert await hass.config_entries.async_reload(mock_config_entry.entry_id)
        await hass.async_block_till_done(wait_background_tasks=True)
        reloaded = mock_config_entry.runtime_data.backend.engine
        assert reloaded._model_file.inode == new_inode
        await _serves(hass, mock_config_entry)
    finally:
        await hass.config_entries.async_unload(mock_config_entry.entry_id)


async def test_a_model_file_rewritten_in_place_while_loaded_is_refused_and_reloaded(
    hass: HomeAssistant,
    mock_config_entry: MockConfigEntry,
    ha_core: None,
    gguf_copy: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """`cp new old` writes into the mapped inode: the next request is told, one reload maps it.

    Written here with its own bytes and a new modification time, so the reload still finds
    a valid model; any other content would change the pages under the old mapping.
    """
    engine = await _set_up(
        hass, mock_config_entry, model=str(gguf_copy), dtype="auto", kv_budget_mib=16
    )
    try:
        await _generate(hass)
        await hass.async_add_executor_job(_rewrite_in_place, gguf_copy)
        with caplog.at_level(logging.ERROR), pytest.raises(HomeAssistantError) as err:
            await _generate(hass)
        _assert_told(err.value, "engine_dead", "rewritten while loaded")
        assert caplog.text.count("restarting it") == 1
        await _reloaded_itself(hass, mock_config_entry, engine)
    finally:
        await hass.config_entries.async_unload(mock_config_entry.entry_id)
