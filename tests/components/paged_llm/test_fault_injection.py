"""A failure injected into each part of each caller's path: one translated error, never a group.

Parts: the backend's stream (every request, every summary chunk at once), its token counts
and its template lookup. Callers: the generate and summarize actions, through the service
layer and Home Assistant's REST API, the conversation agent and the AI task.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from http import HTTPStatus
from typing import Any

import pytest
from homeassistant.components import ai_task, conversation
from homeassistant.core import Context, HomeAssistant
from homeassistant.exceptions import HomeAssistantError
from homeassistant.helpers import intent
from homeassistant.setup import async_setup_component
from pytest_homeassistant_custom_component.common import MockConfigEntry
from pytest_homeassistant_custom_component.typing import ClientSessionGenerator

from custom_components.paged_llm.backend import BackendError, Delta
from custom_components.paged_llm.const import DOMAIN
from tests.helpers.home_assistant import agent_entity_id
from tests.helpers.support import becomes_true

# What a part may raise: a bug, the seam's own error, a group from a nested task group.
FAILURES: dict[str, tuple[Callable[[], Exception], str, str]] = {
    "bug": (lambda: RuntimeError("injected bug"), "generation_failed", "injected bug"),
    "backend": (
        lambda: BackendError("engine_dead", "injected stop"),
        "engine_dead",
        "injected stop",
    ),
    "group": (
        lambda: ExceptionGroup("parts", [RuntimeError("injected a"), RuntimeError("b")]),
        "generation_failed",
        "injected a",
    ),
}
# Each part, and the callers whose path goes through it (only summaries count tokens; only
# agents read the template's tool support).
PARTS: dict[str, frozenset[str]] = {
    "stream": frozenset({"generate", "summarize", "conversation", "ai_task"}),
    "count": frozenset({"summarize"}),
    "template": frozenset({"conversation", "ai_task"}),
}


def _inject(
    monkeypatch: pytest.MonkeyPatch, backend: Any, part: str, make: Callable[[], Exception]
) -> None:
    """Make ``part`` of ``backend`` raise a fresh ``make()`` each time it is used."""
    if part == "stream":
        real_stream = backend.stream

        async def stream(*args: Any, **kwargs: Any) -> AsyncIterator[Delta]:
            """One real delta, then the failure (mid-answer, as a real one comes)."""
            async for delta in real_stream(*args, **kwargs):
                yield delta
                raise make()

        monkeypatch.setattr(backend, "stream", stream)
    elif part == "count":

        async def count(*_args: Any, **_kwargs: Any) -> int:
            """The token count fails."""
            raise make()

        monkeypatch.setattr(backend, "async_count_tokens", count)
        monkeypatch.setattr(backend, "async_count_prompt_tokens", count)
    else:

        def template(_self: Any) -> bool:
            """Reading the model's template fails."""
            raise make()

        monkeypatch.setattr(type(backend), "native_tools", property(template))


def _assert_one_error(err: BaseException, key: str, words: str) -> None:
    """One translated Home Assistant error, naming the cause; never a group."""
    assert isinstance(err, HomeAssistantError), repr(err)
    assert not isinstance(err, BaseExceptionGroup)
    assert err.translation_domain == DOMAIN
    assert err.translation_key == key
    assert words in str(err)


@pytest.mark.parametrize("failure", FAILURES)
@pytest.mark.parametrize("part", PARTS)
async def test_each_caller_gets_one_translated_error(
    hass: HomeAssistant,
    init_integration: MockConfigEntry,
    hass_client: ClientSessionGenerator,
    make_long_text: Callable[[int], str],
    monkeypatch: pytest.MonkeyPatch,
    part: str,
    failure: str,
) -> None:
    make, key, words = FAILURES[failure]
    entry = init_integration
    _inject(monkeypatch, entry.runtime_data.backend, part, make)
    actions = {
        "generate": {"prompt": "hello", "max_tokens": 4},
        # Long enough for several chunks, which all fail at once.
        "summarize": {"text": make_long_text(1500), "max_tokens": 4},
    }
    callers = PARTS[part]
    for service, data in actions.items():
        if service not in callers:
            continue
        with pytest.raises(HomeAssistantError) as err:
            await hass.services.async_call(
                DOMAIN, service, data, blocking=True, return_response=True
            )
        _assert_one_error(err.value, key, words)

    # The same through the REST API: the message as JSON (a 500 is Home Assistant's own
    # mapping of a HomeAssistantError), never aiohttp's bare "Server got itself in trouble".
    assert await async_setup_component(hass, "http", {})
    assert await async_setup_component(hass, "api", {})
    client = await hass_client()
    if "summarize" in callers:
        response = await client.post(
            f"/api/services/{DOMAIN}/summarize?return_response", json=actions["summarize"]
        )
        assert response.status == HTTPStatus.INTERNAL_SERVER_ERROR
        assert response.content_type == "application/json"
        assert words in (await response.json())["message"]

    voice = agent_entity_id(hass, entry, "conversation", "conversation")
    result = await conversation.async_converse(hass, "hello", None, Context(), agent_id=voice)
    if "conversation" in callers:
        assert result.response.response_type is intent.IntentResponseType.ERROR
        assert words in result.response.speech["plain"]["speech"]

    task = agent_entity_id(hass, entry, "ai_task", "ai_task_data")
    if "ai_task" in callers:
        with pytest.raises(HomeAssistantError) as err:
            await ai_task.async_generate_data(
                hass, task_name="inject", entity_id=task, instructions="Say hi."
            )
        _assert_one_error(err.value, key, words)
    # Nothing was left running or holding blocks.
    monkeypatch.undo()
    engine = entry.runtime_data.backend.engine
    assert engine.is_running

    def idle() -> bool:
        """No request runs or waits, no block is held."""
        metrics = engine.metrics()
        busy = metrics.num_requests_running + metrics.num_requests_waiting
        return busy == 0 and metrics.kv_blocks_used == 0

    assert await becomes_true(idle, 10)
