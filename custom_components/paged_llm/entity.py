"""Base entities: the engine's service device, and agents that answer a chat log with the model."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping
from typing import Any

import probatio
from homeassistant.components import conversation
from homeassistant.config_entries import ConfigSubentry
from homeassistant.helpers import device_registry as dr
from homeassistant.helpers import llm
from homeassistant.helpers.entity import Entity

from .backend import Sampling
from .chat import async_stream
from .const import (
    CONF_HOME_GRAMMAR,
    CONF_MAX_HISTORY,
    CONF_MAX_TOKENS,
    CONF_TEMPERATURE,
    CONF_THINK,
    DEFAULT_HOME_GRAMMAR,
    DEFAULT_MAX_HISTORY,
    DEFAULT_MAX_TOKENS,
    DEFAULT_TEMPERATURE,
    DEFAULT_THINK,
    DOMAIN,
    MAX_TOOL_ITERATIONS,
    STRUCTURE_FREQUENCY_PENALTY,
    SUBENTRY_CONVERSATION,
)
from .errors import raising_one_error
from .home_grammar import async_get_home, grammar_tools
from .prompt import (
    build_messages,
    format_tool,
    json_schema_instruction,
    structure_schema,
    trim_history,
)
from .reasoning import ThinkSplitter
from .runtime import PagedLLMConfigEntry
from .tool_calls import ToolCallStream

MANUFACTURER = "Paged LLM"


def engine_device_info(entry: PagedLLMConfigEntry) -> dr.DeviceInfo:
    """The service device that stands for an entry's engine."""
    return dr.DeviceInfo(
        identifiers={(DOMAIN, entry.entry_id)},
        name=entry.title,
        manufacturer=MANUFACTURER,
        model=entry.title,
        entry_type=dr.DeviceEntryType.SERVICE,
    )


def agent_device_info(entry: PagedLLMConfigEntry, subentry: ConfigSubentry) -> dr.DeviceInfo:
    """An agent's own service device, under the engine's device."""
    info = engine_device_info(entry)
    info["identifiers"] = {(DOMAIN, subentry.subentry_id)}
    info["name"] = subentry.title
    info["via_device_id"] = entry.runtime_data.device_id
    return info


def agent_sampling(settings: Mapping[str, Any], **overrides: Any) -> Sampling:
    """Sampling settings of an agent or an action, with the defaults filled in."""
    values: dict[str, Any] = {
        "max_tokens": int(settings.get(CONF_MAX_TOKENS, DEFAULT_MAX_TOKENS)),
        "temperature": float(settings.get(CONF_TEMPERATURE, DEFAULT_TEMPERATURE)),
        **overrides,
    }
    return Sampling(**values)


class PagedLLMBaseLLMEntity(Entity):
    """An agent of one subentry; every request it makes runs in its priority class."""

    _attr_has_entity_name = True
    _attr_name = None
    _priority: str

    def __init__(self, entry: PagedLLMConfigEntry, subentry: ConfigSubentry) -> None:
        """Attach the agent to its own service device, under the engine's device."""
        self.entry = entry
        self.subentry = subentry
        self._attr_unique_id = subentry.subentry_id
        self._attr_device_info = agent_device_info(entry, subentry)

    @property
    def available(self) -> bool:
        """Unavailable while the engine is stopped or the server does not answer."""
        data = getattr(self.entry, "runtime_data", None)
        return data is not None and data.coordinator.last_update_success and data.backend.available

    async def async_added_to_hass(self) -> None:
        """Follow the backend's state through the metrics coordinator."""
        await super().async_added_to_hass()
        self.async_on_remove(
            self.entry.runtime_data.coordinator.async_add_listener(self.async_write_ha_state)
        )

    async def _async_handle_chat_log(
        self,
        chat_log: conversation.ChatLog,
        structure: probatio.Schema | None = None,
    ) -> str | None:
        """Answer the chat log, running tool calls until the model answers in words.

        Decoding is held to the structure's JSON schema (``response_format``), or, with
        tools, to text or calls of the offered tools, where the backend enforces it.
        Returns why the last answer ended (``"length"``: cut off at max_tokens).
        """
        settings = dict(self.subentry.data)
        # Reading the model's template fails like a request does: one translated error
        # (Assist speaks a HomeAssistantError's message; anything else ends the pipeline
        # with no answer at all).
        with raising_one_error():
            native_tools = self.entry.runtime_data.backend.native_tools

        tools: list[dict[str, Any]] | None = None
        grammar: list[dict[str, Any]] | None = None
        tool_names: set[str] = set()
        serializer = None
        if chat_log.llm_api:
            serializer = chat_log.llm_api.custom_serializer
            tools = [format_tool(tool, serializer) for tool in chat_log.llm_api.tools]
            tool_names = {tool.name for tool in chat_log.llm_api.tools}
            grammar = self._grammar_tools(chat_log.llm_api, tools)
        # Conversation agents have the option (thinking off for voice); an AI task keeps the
        # template's own default.
        thinking = (
            bool(settings.get(CONF_THINK, DEFAULT_THINK))
            if self.subentry.subentry_type == SUBENTRY_CONVERSATION
            else None
        )
        sampling = agent_sampling(
            settings,
            tool_grammar=grammar,
            plain_tools=tools if grammar is not tools else None,
            thinking=thinking,
        )
        json_instruction = None
        if structure:
            schema = structure_schema(structure, serializer)
            json_instruction = json_schema_instruction(schema)
            sampling.frequency_penalty = STRUCTURE_FREQUENCY_PENALTY
            if not tools:
                sampling.response_format = {
                    "type": "json_schema",
                    "json_schema": {"name": "structure", "schema": schema, "strict": True},
                }
        max_history = int(settings.get(CONF_MAX_HISTORY, DEFAULT_MAX_HISTORY))
        finish: list[str | None] = [None]

        with raising_one_error():
            for _iteration in range(MAX_TOOL_ITERATIONS):
                messages = build_messages(
                    trim_history(chat_log.content, max_history),
                    tools=tools,
                    native_tools=native_tools,
                    json_instruction=json_instruction,
                )
                parser = ToolCallStream(tool_names) if tools else None
                stream = self._async_stream(
                    chat_log, messages, sampling, tools if native_tools else None, parser, finish
                )
                async for _content in chat_log.async_add_delta_content_stream(
                    self.entity_id, stream
                ):
                    pass
                if not chat_log.unresponded_tool_results:
                    break
        return finish[0]

    def _grammar_tools(
        self, api: llm.APIInstance, tools: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        """The tools decoding is held to; with the home grammar on, held to the home's things.

        On by default: Assist's tools can then name only the exposed entities, the areas
        and the floors there are.
        """
        assistant = api.llm_context.assistant
        if not assistant or not self.subentry.data.get(CONF_HOME_GRAMMAR, DEFAULT_HOME_GRAMMAR):
            return tools
        return grammar_tools(api.tools, tools, async_get_home(self.hass, assistant))

    async def _async_stream(
        self,
        chat_log: conversation.ChatLog,
        messages: list[dict[str, Any]],
        sampling: Sampling,
        native_tools: list[dict[str, Any]] | None,
        parser: ToolCallStream | None,
        finish: list[str | None],
    ) -> AsyncGenerator[conversation.AssistantContentDeltaDict]:
        """Stream one answer as chat-log deltas, tool calls last; ``finish[0]``: why it ended."""
        yield {"role": "assistant"}
        last = None
        calls: list[llm.ToolInput] = []
        thinking = ThinkSplitter()
        async for delta in async_stream(
            self.hass, self.entry, messages, sampling, self._priority, native_tools
        ):
            last = delta
            calls.extend(delta.tool_calls)
            reasoning, answer = thinking.feed(delta.text)
            if delta.finished:
                more_reasoning, rest = thinking.finish()
                reasoning, answer = reasoning + more_reasoning, answer + rest
            # Reasoning goes to the chat log's thinking content, never into the speech.
            if reasoning := delta.reasoning + reasoning:
                yield {"thinking_content": reasoning}
            text = parser.feed(answer) if parser else answer
            if text:
                yield {"content": text}
        if last is not None:
            finish[0] = last.finish_reason
            chat_log.async_trace(
                {
                    "stats": {
                        "input_tokens": last.prompt_tokens,
                        "cached_input_tokens": last.cached_tokens,
                        "output_tokens": last.completion_tokens,
                        "finish_reason": str(last.finish_reason),
                    }
                }
            )
        if parser is not None:
            if rest := parser.finish():
                yield {"content": rest}
            calls.extend(parser.calls)
        if calls:
            yield {"tool_calls": calls}
