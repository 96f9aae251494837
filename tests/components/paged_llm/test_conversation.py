"""Conversation agent: answers, streamed deltas, history, and the tool-call loop."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any
from unittest.mock import patch

import probatio
from homeassistant.components import conversation
from homeassistant.components.conversation import async_get_chat_log
from homeassistant.const import CONF_LLM_HASS_API
from homeassistant.core import Context, HomeAssistant
from homeassistant.helpers import chat_session, intent, llm
from homeassistant.helpers import entity_registry as er
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.paged_llm.const import DOMAIN
from paged_llm.engine.core.sequence import FinishReason
from paged_llm.engine.llm_engine import RequestOutput


def _conversation_entity_id(hass: HomeAssistant, entry: MockConfigEntry) -> str:
    """The entity id of the entry's conversation agent."""
    subentry = next(s for s in entry.subentries.values() if s.subentry_type == "conversation")
    entity_id = er.async_get(hass).async_get_entity_id("conversation", DOMAIN, subentry.subentry_id)
    assert entity_id is not None
    return entity_id


async def test_converse_returns_the_models_text(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    entity_id = _conversation_entity_id(hass, init_integration)
    result = await conversation.async_converse(
        hass, "What is the weather like?", None, Context(), agent_id=entity_id
    )
    assert result.response.response_type is intent.IntentResponseType.ACTION_DONE
    speech = result.response.speech["plain"]["speech"]
    assert isinstance(speech, str)
    assert speech.strip()
    assert result.conversation_id
    state = hass.states.get(entity_id)
    assert state is not None
    assert state.state not in ("unknown", "unavailable")


async def test_streamed_deltas_reach_the_chat_log_in_order(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    entity_id = _conversation_entity_id(hass, init_integration)
    engine = init_integration.runtime_data.backend.engine
    engine_texts: list[str] = []
    priorities: list[Any] = []
    real_generate = engine.generate

    async def observed(*args: Any, **kwargs: Any) -> AsyncIterator[RequestOutput]:
        priorities.append(args[2] if len(args) > 2 else kwargs.get("priority"))
        async for out in real_generate(*args, **kwargs):
            engine_texts.append(out.text)
            yield out

    deltas: list[dict[str, Any]] = []
    with (
        patch.object(engine, "generate", observed),
        chat_session.async_get_chat_session(hass, context=Context()) as session,
        async_get_chat_log(
            hass, session, chat_log_delta_listener=lambda _log, delta: deltas.append(delta)
        ) as chat_log,
    ):
        result = await conversation.async_converse(
            hass, "Tell me a story", session.conversation_id, Context(), agent_id=entity_id
        )
    assert result.response.response_type is intent.IntentResponseType.ACTION_DONE
    assert priorities == ["interactive"]
    assert deltas[0] == {"role": "assistant"}
    streamed = [d["content"] for d in deltas[1:]]
    assert len(streamed) >= 2, "a short answer still comes in several deltas"
    # Every delta the engine produced reaches the chat log, in the order it was produced.
    assert streamed == [text for text in engine_texts if text]
    answer = chat_log.content[-1]
    assert isinstance(answer, conversation.AssistantContent)
    assert answer.content == "".join(streamed)
    assert result.response.speech["plain"]["speech"] == answer.content


async def test_second_turn_sees_the_first(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    entity_id = _conversation_entity_id(hass, init_integration)
    engine = init_integration.runtime_data.backend.engine
    prompts: list[list[dict[str, Any]]] = []
    cached: list[int] = []
    real_generate = engine.generate

    async def observed(prompt: Any, *args: Any, **kwargs: Any) -> AsyncIterator[RequestOutput]:
        prompts.append(prompt)
        async for out in real_generate(prompt, *args, **kwargs):
            if out.finished:
                cached.append(out.cached_tokens)
            yield out

    with patch.object(engine, "generate", observed):
        first = await conversation.async_converse(
            hass, "My name is Ada.", None, Context(), agent_id=entity_id
        )
        first_answer = first.response.speech["plain"]["speech"]
        second = await conversation.async_converse(
            hass, "What is my name?", first.conversation_id, Context(), agent_id=entity_id
        )
    assert second.conversation_id == first.conversation_id
    assert len(prompts) == 2
    roles = [m["role"] for m in prompts[1]]
    assert roles == ["system", "user", "assistant", "user"]
    assert prompts[1][1]["content"] == "My name is Ada."
    assert prompts[1][2]["content"] == first_answer
    assert prompts[1][3]["content"] == "What is my name?"
    # The first turn finds the system prompt the agent warmed at start; the second reuses
    # the shared prefix too (up to the time line of the prompt, which changes each second).
    assert cached[0] >= 16
    assert cached[1] >= 16


class _WeatherTool(llm.Tool):
    """A tool the stand-in model calls."""

    name = "get_weather"
    description = "Get the weather for a city"
    parameters = probatio.Schema({probatio.Required("city"): str})
    integration = DOMAIN

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    async def async_call(
        self, hass: HomeAssistant, tool_input: llm.ToolInput, llm_context: llm.LLMContext
    ) -> llm.ToolResult:
        self.calls.append(tool_input.tool_args)
        return llm.ToolResult(data={"city": tool_input.tool_args["city"], "sky": "sunny"})


class _WeatherAPI(llm.API):
    """An LLM API offering the weather tool."""

    def __init__(self, hass: HomeAssistant, tool: _WeatherTool) -> None:
        super().__init__(hass=hass, id="weather_api", name="Weather API")
        self.tool = tool

    async def async_get_api_instance(self, llm_context: llm.LLMContext) -> llm.APIInstance:
        return llm.APIInstance(
            api=self,
            api_prompt="Use the weather tool for weather questions.",
            llm_context=llm_context,
            tools=[self.tool],
        )


class _StandInEngine:
    """Replays scripted answers through the real engine's tokenizer, recording prompts."""

    def __init__(self, real: Any, answers: list[list[str]]) -> None:
        self.real = real
        self.answers = answers
        self.prompts: list[list[dict[str, Any]]] = []
        self.error = None
        self.is_running = True

    @property
    def tokenizer(self) -> Any:
        return self.real.tokenizer

    @property
    def info(self) -> Any:
        return self.real.info

    async def compile_constraint(self, params: Any) -> None:
        await self.real.compile_constraint(params)

    async def generate(
        self,
        prompt: Any,
        params: Any,
        priority: Any,
        *,
        tools: Any = None,
        chat_template_kwargs: Any = None,
    ) -> AsyncIterator[RequestOutput]:
        self.prompts.append(prompt)
        pieces = self.answers.pop(0)
        for i, piece in enumerate(pieces, 1):
            done = i == len(pieces)
            yield RequestOutput(
                request_id="stand-in",
                text=piece,
                token_ids=[i],
                finished=done,
                finish_reason=FinishReason.STOP if done else None,
                prompt_tokens=10,
                completion_tokens=i,
                cached_tokens=0,
            )


async def test_tool_call_loop_runs_the_tool_and_returns_its_result(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    entry = init_integration
    tool = _WeatherTool()
    unregister = llm.async_register_api(hass, _WeatherAPI(hass, tool))
    subentry = next(s for s in entry.subentries.values() if s.subentry_type == "conversation")
    hass.config_entries.async_update_subentry(
        entry, subentry, data={**subentry.data, CONF_LLM_HASS_API: ["weather_api"]}
    )
    # With the reloaded agent's warm-up, which must not mix with what is observed.
    await hass.async_block_till_done(wait_background_tasks=True)
    entity_id = _conversation_entity_id(hass, entry)

    real = entry.runtime_data.backend.engine
    # The tool call arrives split across deltas, after a little text, as models stream it.
    stand_in = _StandInEngine(
        real,
        [
            [
                "Let me check. ",
                "<tool_",
                'call>\n{"name": "get_weather", ',
                '"arguments": {"city": "Oslo"}}\n</tool_call>',
            ],
            ["It is ", "sunny in Oslo."],
        ],
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
                hass, "Weather in Oslo?", session.conversation_id, Context(), agent_id=entity_id
            )
    finally:
        entry.runtime_data.backend.engine = real
        unregister()

    assert tool.calls == [{"city": "Oslo"}]
    assert result.response.speech["plain"]["speech"] == "It is sunny in Oslo."
    # The markup never reached the user; the words before it did.
    streamed = "".join(d.get("content") or "" for d in deltas)
    assert "<tool" not in streamed
    assert streamed.startswith("Let me check.")
    # The tools were offered through the system prompt (this template knows no tools).
    first_prompt = stand_in.prompts[0]
    assert '"name": "get_weather"' in first_prompt[0]["content"]
    # The second request carries the call and the tool's result back to the model.
    second = stand_in.prompts[1]
    assert second[-2]["role"] == "assistant"
    assert '"get_weather"' in second[-2]["content"]
    assert second[-1]["role"] == "user"
    assert second[-1]["content"].startswith("<tool_response>")
    assert '"sky":"sunny"' in second[-1]["content"].replace(" ", "")
    kinds = [type(c).__name__ for c in chat_log.content[1:]]
    assert kinds == ["UserContent", "AssistantContent", "ToolResultContent", "AssistantContent"]


# A chat template that renders tools itself, as Qwen's and Llama 3.1's do.
TOOL_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
    "{% if loop.first and tools %}\n# Tools\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}"
    "{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


async def test_tools_go_through_a_chat_template_that_knows_them(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    entry = init_integration
    tool = _WeatherTool()
    unregister = llm.async_register_api(hass, _WeatherAPI(hass, tool))
    subentry = next(s for s in entry.subentries.values() if s.subentry_type == "conversation")
    hass.config_entries.async_update_subentry(
        entry, subentry, data={**subentry.data, CONF_LLM_HASS_API: ["weather_api"]}
    )
    # With the reloaded agent's warm-up, which must not mix with what is observed.
    await hass.async_block_till_done(wait_background_tasks=True)
    engine = entry.runtime_data.backend.engine
    tokenizer = engine.tokenizer
    original = tokenizer.chat_template
    calls: list[tuple[Any, Any]] = []
    real_generate = engine.generate

    def observed(prompt: Any, *args: Any, **kwargs: Any) -> AsyncIterator[RequestOutput]:
        calls.append((prompt, kwargs.get("tools")))
        return real_generate(prompt, *args, **kwargs)

    tokenizer.chat_template = TOOL_TEMPLATE
    try:
        with patch.object(engine, "generate", observed):
            result = await conversation.async_converse(
                hass,
                "Weather in Oslo?",
                None,
                Context(),
                agent_id=_conversation_entity_id(hass, entry),
            )
        assert result.response.response_type is intent.IntentResponseType.ACTION_DONE
        ((prompt, tools),) = calls
        # The template gets the tools; the system prompt does not describe them again.
        assert tools is not None
        assert tools[0]["function"]["name"] == "get_weather"
        assert tools[0]["function"]["parameters"]["required"] == ["city"]
        assert "<tools>" not in prompt[0]["content"]
        rendered = tokenizer.decode(await engine.tokenize(prompt, tools))
        assert '"name": "get_weather"' in rendered
    finally:
        tokenizer.chat_template = original
        unregister()
