"""Reasoning models: ``<think>`` text goes to the chat log's thinking content, never spoken."""

from __future__ import annotations

from typing import Any

from homeassistant.components import conversation
from homeassistant.components.conversation import async_get_chat_log
from homeassistant.core import Context, HomeAssistant
from homeassistant.helpers import chat_session
from pytest_homeassistant_custom_component.common import MockConfigEntry
from test_conversation import _conversation_entity_id, _StandInEngine

from custom_components.paged_llm.reasoning import ThinkSplitter


def _split(pieces: list[str]) -> tuple[str, str]:
    splitter = ThinkSplitter()
    reasoning = answer = ""
    for piece in pieces:
        r, a = splitter.feed(piece)
        reasoning, answer = reasoning + r, answer + a
    r, a = splitter.finish()
    return reasoning + r, answer + a


def test_think_blocks_split_wherever_the_stream_cuts_them() -> None:
    text = "<think>\nThe user greets me.\n</think>\n\nHello!"
    for cut in range(1, len(text)):
        assert _split([text[:cut], text[cut:]]) == ("\nThe user greets me.\n", "Hello!")
    assert _split(list(text)) == ("\nThe user greets me.\n", "Hello!")
    # Without a think block everything is the answer, streamed as it comes.
    splitter = ThinkSplitter()
    assert splitter.feed("Hi ") == ("", "Hi ")
    assert _split(["<thi", "s is not a tag"]) == ("", "<this is not a tag")
    # An unfinished block is reasoning, not speech.
    assert _split(["<think>still thinking"]) == ("still thinking", "")


async def test_reasoning_is_kept_as_thinking_content_not_speech(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    entry = init_integration
    entity_id = _conversation_entity_id(hass, entry)
    real = entry.runtime_data.backend.engine
    stand_in = _StandInEngine(
        real, [["<think>", "The user wants ", "the time.</th", "ink>\n\n", "It is noon."]]
    )
    entry.runtime_data.backend.engine = stand_in  # type: ignore[assignment]
    deltas: list[dict[str, Any]] = []
    try:
        with (
            chat_session.async_get_chat_session(hass) as session,
            async_get_chat_log(
                hass, session, chat_log_delta_listener=lambda _log, delta: deltas.append(delta)
            ) as chat_log,
        ):
            result = await conversation.async_converse(
                hass, "What time is it?", session.conversation_id, Context(), agent_id=entity_id
            )
    finally:
        entry.runtime_data.backend.engine = real
    assert result.response.speech["plain"]["speech"] == "It is noon."
    answer = chat_log.content[-1]
    assert isinstance(answer, conversation.AssistantContent)
    assert answer.thinking_content == "The user wants the time."
    assert answer.content == "It is noon."
    assert "think" not in "".join(d.get("content") or "" for d in deltas)
