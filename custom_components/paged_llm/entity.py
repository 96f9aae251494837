"""Base entities: the engine's service device, and agents that answer a chat log with the model."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

import probatio
from homeassistant.components import conversation
from homeassistant.config_entries import ConfigSubentry
from homeassistant.exceptions import HomeAssistantError
from homeassistant.helpers import device_registry as dr
from homeassistant.helpers.entity import Entity

from paged_llm.engine.errors import EngineDeadError, EngineError
from paged_llm.engine.sequence import FinishReason, SamplingParams

from .const import (
    CONF_MAX_HISTORY,
    CONF_MAX_TOKENS,
    CONF_TEMPERATURE,
    DEFAULT_MAX_HISTORY,
    DEFAULT_MAX_TOKENS,
    DEFAULT_TEMPERATURE,
    DOMAIN,
    LOGGER,
    MAX_TOOL_ITERATIONS,
)
from .constraints import constrain, structure_schema, tools_tag
from .prompt import (
    PLAIN_STOP,
    build_messages,
    chat_template,
    format_tool,
    json_schema_instruction,
    render_plain,
    template_knows_tools,
    trim_history,
)
from .runtime import PagedLLMConfigEntry, engine_error
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


def sampling_params(settings: dict[str, Any], **overrides: Any) -> SamplingParams:
    """Sampling settings of an agent (raises a translated error for invalid values)."""
    values: dict[str, Any] = {
        "max_tokens": int(settings.get(CONF_MAX_TOKENS, DEFAULT_MAX_TOKENS)),
        "temperature": float(settings.get(CONF_TEMPERATURE, DEFAULT_TEMPERATURE)),
        **overrides,
    }
    try:
        return SamplingParams(**values)
    except EngineError as err:
        raise engine_error(err) from err


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
        self._attr_device_info = dr.DeviceInfo(
            identifiers={(DOMAIN, subentry.subentry_id)},
            name=subentry.title,
            manufacturer=MANUFACTURER,
            model=entry.title,
            entry_type=dr.DeviceEntryType.SERVICE,
            via_device_id=entry.runtime_data.device_id,
        )

    async def _async_handle_chat_log(
        self,
        chat_log: conversation.ChatLog,
        structure: probatio.Schema | None = None,
    ) -> FinishReason | None:
        """Answer the chat log, running tool calls until the model answers in words.

        Decoding is held to the structure's JSON schema, or, with tools, to text or calls
        of the offered tools. Returns why the last answer ended.
        """
        settings = dict(self.subentry.data)
        engine = self.entry.runtime_data.engine
        try:
            tokenizer = engine.engine.tokenizer
        except EngineDeadError as err:
            raise engine_error(err) from err
        templated = chat_template(tokenizer) is not None
        native_tools = template_knows_tools(tokenizer)

        tools: list[dict[str, Any]] | None = None
        tool_names: set[str] = set()
        serializer = None
        if chat_log.llm_api:
            serializer = chat_log.llm_api.custom_serializer
            tools = [format_tool(tool, serializer) for tool in chat_log.llm_api.tools]
            tool_names = {tool.name for tool in chat_log.llm_api.tools}
        json_instruction = json_schema_instruction(structure, serializer) if structure else None
        params = sampling_params(settings, stop=() if templated else PLAIN_STOP)
        if tools:
            if (tag := tools_tag(tokenizer, tools, native_tools)) is not None:
                params = await constrain(self.hass, engine, params, structural_tag=tag)
        elif structure and (schema := structure_schema(structure, serializer)) is not None:
            params = await constrain(self.hass, engine, params, json_schema=schema)
        max_history = int(settings.get(CONF_MAX_HISTORY, DEFAULT_MAX_HISTORY))
        finish: list[FinishReason | None] = [None]

        for _iteration in range(MAX_TOOL_ITERATIONS):
            messages = build_messages(
                trim_history(chat_log.content, max_history),
                tools=tools,
                native_tools=native_tools,
                json_instruction=json_instruction,
            )
            prompt: str | list[dict[str, Any]] = messages if templated else render_plain(messages)
            parser = ToolCallStream(tool_names) if tools else None
            stream = self._async_stream(
                chat_log, prompt, params, tools if native_tools else None, parser, finish
            )
            async for _content in chat_log.async_add_delta_content_stream(self.entity_id, stream):
                pass
            if not chat_log.unresponded_tool_results:
                break
        return finish[0]

    async def _async_stream(
        self,
        chat_log: conversation.ChatLog,
        prompt: str | list[dict[str, Any]],
        params: SamplingParams,
        template_tools: list[dict[str, Any]] | None,
        parser: ToolCallStream | None,
        finish: list[FinishReason | None],
    ) -> AsyncGenerator[conversation.AssistantContentDeltaDict]:
        """Stream one answer as chat-log deltas, tool calls last; ``finish[0]``: why it ended."""
        engine = self.entry.runtime_data.engine
        yield {"role": "assistant"}
        last = None
        try:
            async for out in engine.generate(prompt, params, self._priority, tools=template_tools):
                last = out
                text = parser.feed(out.text) if parser else out.text
                if text:
                    yield {"content": text}
        except EngineError as err:
            if isinstance(err, EngineDeadError) and engine.error is not None:
                # The step loop crashed: restart the engine rather than stay broken.
                LOGGER.error("The engine failed (%s); restarting it", engine.error)
                self.hass.config_entries.async_schedule_reload(self.entry.entry_id)
            raise engine_error(err) from err
        except HomeAssistantError:
            raise
        except Exception as err:
            LOGGER.exception("Generation failed")
            raise HomeAssistantError(
                translation_domain=DOMAIN,
                translation_key="generation_failed",
                translation_placeholders={"reason": str(err)},
            ) from err
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
            if parser.calls:
                yield {"tool_calls": parser.calls}
