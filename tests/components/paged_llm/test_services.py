"""Actions: generate and summarize with response data, chunking, and clear errors for bad input."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from homeassistant.components import conversation
from homeassistant.core import Context, HomeAssistant, callback
from homeassistant.exceptions import HomeAssistantError, ServiceValidationError
from homeassistant.helpers import entity_registry as er
from homeassistant.helpers import intent
from pytest_homeassistant_custom_component.common import MockConfigEntry, async_capture_events

from custom_components.paged_llm.const import DOMAIN, EVENT_SUMMARY_PROGRESS
from custom_components.paged_llm.embedded import backend_error
from custom_components.paged_llm.errors import ha_error
from tests.helpers.home_assistant import engine_settled


async def _call(hass: HomeAssistant, service: str, data: dict[str, Any]) -> dict[str, Any]:
    """Call one of the integration's actions and return its response."""
    response = await hass.services.async_call(
        DOMAIN, service, data, blocking=True, return_response=True
    )
    assert isinstance(response, dict)
    return response


async def test_generate_returns_text_and_token_counts(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    response = await _call(
        hass,
        "generate",
        {
            "config_entry_id": init_integration.entry_id,
            "prompt": "Write a haiku about the sea",
            "system_prompt": "You are a poet.",
            "priority": "background",
            "max_tokens": 6,
            "temperature": 0.5,
        },
    )
    assert response["text"]
    assert response["completion_tokens"] <= 6
    assert response["prompt_tokens"] > 5
    assert response["finish_reason"] in {"stop", "length"}


async def test_summarize_a_text_runs_in_the_background_class(
    hass: HomeAssistant, init_integration: MockConfigEntry, make_long_text: Callable[[int], str]
) -> None:
    engine = init_integration.runtime_data.backend.engine
    priorities: list[Any] = []
    real_generate = engine.generate

    def observed(prompt: Any, params: Any, priority: Any, **kwargs: Any) -> Any:
        priorities.append(priority)
        return real_generate(prompt, params, priority, **kwargs)

    engine.generate = observed  # type: ignore[method-assign]
    try:
        response = await _call(hass, "summarize", {"text": make_long_text(300), "max_tokens": 8})
    finally:
        del engine.generate
    assert response["summary"]
    assert response["chunks"] == 1
    assert response["requests"] == 1
    assert response["prompt_tokens"] > 300
    assert priorities == ["background"]
    # One request: the final summary, held to max_tokens (a random model rarely stops).
    assert response["parts"] == []
    assert response["finish_reason"] == "length"
    assert response["truncated"] is True
    assert response["completion_tokens"] == 8
    assert 0 < response["elapsed_seconds"] < 120


async def test_summarize_chunks_a_text_beyond_the_context(
    hass: HomeAssistant,
    mock_config_entry: MockConfigEntry,
    ha_core: None,
    make_long_text: Callable[[int], str],
) -> None:
    hass.config_entries.async_update_entry(
        mock_config_entry, data={**mock_config_entry.data, "max_model_len": 512}
    )
    assert await hass.config_entries.async_setup(mock_config_entry.entry_id)
    await hass.async_block_till_done()
    try:
        assert mock_config_entry.runtime_data.backend.engine.info.max_model_len == 512
        response = await _call(hass, "summarize", {"text": make_long_text(1500), "max_tokens": 8})
        assert response["summary"]
        assert response["chunks"] >= 3
        # Each part is summarised, then the parts' summaries are merged into one.
        assert response["requests"] == response["chunks"] + 1
        parts = response["parts"]
        assert len(parts) == response["chunks"]
        assert all(p["finish_reason"] in {"stop", "length"} for p in parts)
        # Parts get room of their own (an eighth of the context), not the final's 8 tokens.
        assert max(p["completion_tokens"] for p in parts) > 8
        assert all(p["completion_tokens"] <= 512 // 8 for p in parts)
        final_tokens = response["completion_tokens"] - sum(p["completion_tokens"] for p in parts)
        assert final_tokens <= 8
        assert response["truncated"] is (
            response["finish_reason"] == "length"
            or any(p["finish_reason"] == "length" for p in parts)
        )
    finally:
        assert await hass.config_entries.async_unload(mock_config_entry.entry_id)


@pytest.mark.parametrize("words", [0, 50_000])
async def test_summarize_with_its_defaults_merges_a_long_text_in_rounds(
    hass: HomeAssistant,
    init_integration: MockConfigEntry,
    make_long_text: Callable[[int], str],
    words: int,
) -> None:
    """The documented defaults (a 512-token summary) take a text many requests long
    (eight requests' worth, and 50,000 words, which take more than one round of merging).

    Before, a text over what one request holds beside 4 x 512 tokens was refused.
    """
    backend = init_integration.runtime_data.backend
    longest = min(backend.context_size, int(backend.kv_pool_tokens * 0.2))
    events = async_capture_events(hass, EVENT_SUMMARY_PROGRESS)
    context = Context()
    response = await hass.services.async_call(
        DOMAIN,
        "summarize",
        {"text": make_long_text(words or 8 * longest)},
        blocking=True,
        return_response=True,
        context=context,
    )
    assert isinstance(response, dict)
    assert response["summary"]
    assert response["chunks"] >= 8
    assert response["rounds"] >= (2 if words else 1)
    assert response["requests"] == len(response["parts"]) + 1
    # Parts answer in at most an eighth of a request, the final summary in max_tokens.
    assert all(0 < p["completion_tokens"] <= longest // 8 for p in response["parts"])
    assert all(p["prompt_tokens"] <= longest for p in response["parts"])
    # Progress: each round announces its parts, then counts each one as it finishes, with
    # the calling action's context.
    assert {e.context.id for e in events} == {context.id}
    by_round: dict[int, list[tuple[int, int]]] = {}
    for event in events:
        assert event.data["entry_id"] == init_integration.entry_id
        by_round.setdefault(event.data["round"], []).append(
            (event.data["parts_done"], event.data["parts_total"])
        )
    assert sorted(by_round) == list(range(1, response["rounds"] + 1))
    assert by_round[1][0][1] == response["chunks"]
    for seen in by_round.values():
        total = seen[0][1]
        assert seen == [(done, total) for done in range(total + 1)]
    assert sum(seen[0][1] for seen in by_round.values()) == len(response["parts"])
    metrics = await engine_settled(init_integration.runtime_data.backend.engine)
    assert metrics.kv_blocks_used == 0


async def test_a_cancelled_summary_stops_its_requests_and_frees_their_blocks(
    hass: HomeAssistant, init_integration: MockConfigEntry, make_long_text: Callable[[int], str]
) -> None:
    """A stopped automation cancels its action: the summary's requests end, blocks return."""
    engine = init_integration.runtime_data.backend.engine
    first_part = asyncio.Event()

    @callback
    def on_progress(event: Any) -> None:
        if event.data["parts_done"] >= 1:
            first_part.set()

    unsub = hass.bus.async_listen(EVENT_SUMMARY_PROGRESS, on_progress)
    call = hass.async_create_task(_call(hass, "summarize", {"text": make_long_text(20000)}))
    await asyncio.wait_for(first_part.wait(), 120)
    assert engine.metrics().num_requests_running > 0
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    unsub()
    metrics = await engine_settled(engine)
    assert metrics.num_requests_running == metrics.num_requests_waiting == 0
    assert metrics.kv_blocks_used == 0
    # The engine serves the next request as before.
    response = await _call(hass, "generate", {"prompt": "hello", "max_tokens": 4})
    assert response["completion_tokens"] == 4


async def test_two_summaries_at_once_one_in_another_language_both_finish(
    hass: HomeAssistant, init_integration: MockConfigEntry, make_long_text: Callable[[int], str]
) -> None:
    """Two long summaries share the small pool (their parts wait or are preempted, never
    lost); a Japanese text is cut and merged like any other."""
    backend = init_integration.runtime_data.backend
    longest = min(backend.context_size, int(backend.kv_pool_tokens * 0.2))
    japanese = "。".join(
        f"居間の照明{i}番は午後七時に点灯し、寝室の暖房は二十度に保たれる" for i in range(600)
    )
    english, other = await asyncio.gather(
        _call(hass, "summarize", {"text": make_long_text(4 * longest)}),
        _call(hass, "summarize", {"text": japanese}),
    )
    for response in (english, other):
        assert response["summary"]
        assert response["chunks"] >= 2
        assert response["requests"] == len(response["parts"]) + 1
    metrics = await engine_settled(backend.engine)
    assert metrics.kv_blocks_used == 0


async def test_summarize_applies_a_repetition_penalty_by_default(
    hass: HomeAssistant, init_integration: MockConfigEntry, make_long_text: Callable[[int], str]
) -> None:
    engine = init_integration.runtime_data.backend.engine
    penalties: list[float] = []
    real_generate = engine.generate

    def observed(prompt: Any, params: Any, priority: Any, **kwargs: Any) -> Any:
        penalties.append(params.repetition_penalty)
        return real_generate(prompt, params, priority, **kwargs)

    engine.generate = observed  # type: ignore[method-assign]
    try:
        await _call(hass, "summarize", {"text": make_long_text(50), "max_tokens": 4})
        await _call(
            hass,
            "summarize",
            {"text": make_long_text(50), "max_tokens": 4, "repetition_penalty": 1.0},
        )
    finally:
        del engine.generate
    assert penalties == [1.1, 1.0]


async def test_summarize_a_file_in_an_allowed_folder(
    hass: HomeAssistant,
    init_integration: MockConfigEntry,
    tmp_path: Path,
    make_long_text: Callable[[int], str],
) -> None:
    hass.config.allowlist_external_dirs = {str(tmp_path)}
    notes = tmp_path / "notes.txt"
    notes.write_text(make_long_text(200), encoding="utf-8")
    response = await _call(hass, "summarize", {"path": str(notes), "max_tokens": 4})
    assert response["summary"]
    assert response["prompt_tokens"] > 200


async def _expect_error(
    hass: HomeAssistant,
    service: str,
    data: dict[str, Any],
    key: str,
    cls: type[HomeAssistantError] = ServiceValidationError,
) -> HomeAssistantError:
    """Call an action that must fail with a translated error of ``key``."""
    with pytest.raises(cls) as err:
        await hass.services.async_call(DOMAIN, service, data, blocking=True, return_response=True)
    assert err.value.translation_domain == DOMAIN
    assert err.value.translation_key == key
    message = str(err.value)
    # The message is the translation, with its placeholders filled in.
    assert message
    assert key not in message
    assert "{" not in message
    return err.value


async def test_bad_inputs_fail_clearly_and_the_rest_keeps_working(
    hass: HomeAssistant,
    init_integration: MockConfigEntry,
    tmp_path: Path,
    make_long_text: Callable[[int], str],
) -> None:
    engine = init_integration.runtime_data.backend.engine
    hass.config.allowlist_external_dirs = {str(tmp_path / "allowed")}
    (tmp_path / "allowed").mkdir()
    secret = tmp_path / "secret.txt"
    secret.write_text("private", encoding="utf-8")

    err = await _expect_error(hass, "summarize", {"text": "   "}, "empty_text")
    assert "no text" in str(err)
    await _expect_error(hass, "generate", {"prompt": ""}, "empty_prompt")
    err = await _expect_error(hass, "summarize", {"path": str(secret)}, "path_not_allowed")
    assert str(secret) in str(err)
    await _expect_error(
        hass, "summarize", {"path": str(tmp_path / "allowed" / "none.txt")}, "file_not_found"
    )
    await _expect_error(hass, "summarize", {}, "text_or_path")
    err = await _expect_error(
        hass,
        "summarize",
        {"text": make_long_text(5000), "max_tokens": 2000},
        "summary_max_tokens_too_large",
    )
    # It names the real limit (a request's share of the pool here) and what would fit.
    backend = init_integration.runtime_data.backend
    longest = min(4096, int(backend.kv_pool_tokens * 0.2))
    assert "4096" in str(err)
    assert f"hold {longest} tokens" in str(err)
    assert "at most " in str(err)
    err = await _expect_error(
        hass, "generate", {"prompt": "hi", "priority": "urgent"}, "invalid_priority"
    )
    assert "interactive, automation, background" in str(err)
    # Prompt plus answer beyond the context (the pool always holds one full context).
    err = await _expect_error(
        hass,
        "generate",
        {"prompt": make_long_text(5000), "max_tokens": 16},
        "rejected_context_too_long",
    )
    assert "4096" in str(err)

    # The engine and the entities are unharmed.
    assert engine.is_running
    response = await _call(hass, "generate", {"prompt": "Still there?", "max_tokens": 4})
    assert response["text"]
    subentry = next(
        s for s in init_integration.subentries.values() if s.subentry_type == "conversation"
    )
    entity_id = er.async_get(hass).async_get_entity_id("conversation", DOMAIN, subentry.subentry_id)
    result = await conversation.async_converse(hass, "Hello", None, Context(), agent_id=entity_id)
    assert result.response.response_type is intent.IntentResponseType.ACTION_DONE
    sensor = hass.states.get("sensor.tiny_kv_cache_usage")
    assert sensor is not None
    assert sensor.state != "unavailable"


async def test_actions_need_a_loaded_entry(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    assert await hass.config_entries.async_unload(init_integration.entry_id)
    with pytest.raises(ServiceValidationError) as err:
        await hass.services.async_call(
            DOMAIN,
            "generate",
            {"config_entry_id": init_integration.entry_id, "prompt": "hi"},
            blocking=True,
            return_response=True,
        )
    assert err.value.translation_key == "service_config_entry_not_loaded"


def test_a_malformed_request_is_the_callers_error_naming_the_argument() -> None:
    from paged_llm.engine.errors import EngineError, InvalidArgument

    err = backend_error(InvalidArgument("prompt", "prompt: a message needs a role"))
    assert (err.key, err.caller) == ("invalid_argument", True)
    assert err.reason == "prompt: a message needs a role"
    assert isinstance(ha_error(err), ServiceValidationError)
    # An unexpected engine error stays the generic failure, not the caller's.
    other = backend_error(EngineError("the step failed"))
    assert (other.key, other.caller) == ("generation_failed", False)
