"""Reasoning models: ``<think>`` text goes to the chat log's thinking content, never spoken."""

from __future__ import annotations

from typing import Any
from unittest.mock import patch

from homeassistant.components import ai_task, conversation
from homeassistant.components.conversation import async_get_chat_log
from homeassistant.core import Context, HomeAssistant
from homeassistant.helpers import chat_session
from homeassistant.helpers import entity_registry as er
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.paged_llm.const import CONF_THINK, DOMAIN
from custom_components.paged_llm.reasoning import ThinkSplitter
from tests.components.paged_llm.test_conversation import _conversation_entity_id, _StandInEngine


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
            chat_session.async_get_chat_session(hass, context=Context()) as session,
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


# A reasoning switch as Qwen3's template has it: off, an empty think block opens the answer.
THINKING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}"
)


async def test_thinking_is_off_for_voice_unless_the_agent_turns_it_on(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    """A template with a reasoning switch gets enable_thinking from the conversation agent
    (off by default); an AI task leaves the template's own default."""
    entry = init_integration
    engine = entry.runtime_data.backend.engine
    tokenizer = engine.tokenizer
    saved = tokenizer.chat_template
    tokenizer.chat_template = THINKING_TEMPLATE
    real_generate = engine.generate
    seen: list[Any] = []

    def observed(prompt: Any, params: Any, *args: Any, **kwargs: Any) -> Any:
        if params.max_tokens > 1:  # not the agent's prefix warm-up
            seen.append(kwargs.get("chat_template_kwargs"))
        return real_generate(prompt, params, *args, **kwargs)

    subentry = next(s for s in entry.subentries.values() if s.subentry_type == "conversation")
    agent = _conversation_entity_id(hass, entry)
    try:
        with patch.object(engine, "generate", observed):
            await conversation.async_converse(hass, "Hi", None, Context(), agent_id=agent)
            hass.config_entries.async_update_subentry(
                entry, subentry, data={**subentry.data, CONF_THINK: True}
            )
            await hass.async_block_till_done()
            await conversation.async_converse(hass, "Hi", None, Context(), agent_id=agent)
            task = next(s for s in entry.subentries.values() if s.subentry_type == "ai_task_data")
            task_id = er.async_get(hass).async_get_entity_id("ai_task", DOMAIN, task.subentry_id)
            await ai_task.async_generate_data(
                hass, task_name="t", entity_id=task_id, instructions="Hi"
            )
    finally:
        tokenizer.chat_template = saved
    assert seen == [{"enable_thinking": False}, {"enable_thinking": True}, None]
