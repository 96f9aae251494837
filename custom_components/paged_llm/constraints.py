"""Decoding constraints for agents: an AI task's structure, and tool calls in the model's format."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import probatio
from homeassistant.core import HomeAssistant
from homeassistant.helpers import llm

from paged_llm.engine.async_engine import AsyncEngine
from paged_llm.engine.errors import EngineError
from paged_llm.engine.sequence import SamplingParams
from paged_llm.engine.tool_grammar import detect_tool_call_format, tool_call_structural_tag

from .const import LOGGER
from .prompt import chat_template


def structure_schema(
    structure: probatio.Schema, custom_serializer: Callable[[Any], Any] | None
) -> dict[str, Any] | None:
    """The JSON schema of an AI task's structure, converted the way Home Assistant does it."""
    try:
        schema: dict[str, Any] = probatio.to_openapi(
            structure,
            custom_serializer=custom_serializer or llm.selector_serializer,
            openapi_version="3.1.0",
        )
    except (TypeError, ValueError) as err:
        LOGGER.warning(
            "The task's structure has no JSON schema (%s); answers are checked only", err
        )
        return None
    return schema


def tools_tag(
    tokenizer: Any, tools: list[dict[str, Any]], native_tools: bool
) -> dict[str, Any] | None:
    """A structural tag for text or calls of the offered tools, in the model's own format.

    A template that knows nothing of tools gets the Hermes instructions, so its model is
    held to the Hermes format.
    """
    fmt = detect_tool_call_format(chat_template(tokenizer) if native_tools else None)
    tag: dict[str, Any] | None = tool_call_structural_tag(tools, fmt)
    return tag


async def constrain(
    hass: HomeAssistant, engine: AsyncEngine, params: SamplingParams, **constraint: Any
) -> SamplingParams:
    """``params`` with the constraint, compiled ahead; unchanged when it cannot be enforced.

    A schema the grammar library cannot handle must not fail the request: the answer is
    then generated freely and still checked afterwards.
    """
    try:
        constrained = dataclasses.replace(params, **constraint)
        await hass.async_add_executor_job(engine.engine.structured.compile, constrained)
    except EngineError as err:
        LOGGER.warning("Decoding is not constrained: %s", err)
        return params
    return constrained
