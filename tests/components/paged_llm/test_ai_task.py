"""AI task agent: text results, and structured results parsed and checked against the structure."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator
from typing import Any
from unittest.mock import patch

import probatio
import pytest
from homeassistant.components import ai_task
from homeassistant.core import HomeAssistant
from homeassistant.exceptions import HomeAssistantError
from homeassistant.helpers import entity_registry as er
from homeassistant.helpers import selector
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.paged_llm.ai_task import parse_structured_output
from custom_components.paged_llm.const import DOMAIN, STRUCTURE_FREQUENCY_PENALTY
from paged_llm.engine.llm_engine import RequestOutput

STRUCTURE = probatio.Schema(
    {
        probatio.Required("name"): selector.TextSelector(),
        probatio.Required("count"): selector.NumberSelector({"min": 0, "mode": "box"}),
    }
)


def _ai_task_entity_id(hass: HomeAssistant, entry: MockConfigEntry) -> str:
    """The entity id of the entry's AI task agent."""
    subentry = next(s for s in entry.subentries.values() if s.subentry_type == "ai_task_data")
    entity_id = er.async_get(hass).async_get_entity_id("ai_task", DOMAIN, subentry.subentry_id)
    assert entity_id is not None
    return entity_id


async def test_generate_data_returns_text_as_automation_request(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    entity_id = _ai_task_entity_id(hass, init_integration)
    engine = init_integration.runtime_data.backend.engine
    priorities: list[Any] = []
    real_generate = engine.generate

    def observed(prompt: Any, params: Any, priority: Any, **kwargs: Any) -> Any:
        priorities.append(priority)
        return real_generate(prompt, params, priority, **kwargs)

    with patch.object(engine, "generate", observed):
        result = await hass.services.async_call(
            "ai_task",
            "generate_data",
            {"entity_id": entity_id, "task_name": "greet", "instructions": "Say hello"},
            blocking=True,
            return_response=True,
        )
    assert isinstance(result, dict)
    assert isinstance(result["data"], str)
    assert result["data"].strip()
    assert result["conversation_id"]
    assert priorities == ["automation"]


async def test_structure_that_the_model_does_not_follow_fails_clearly(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    entity_id = _ai_task_entity_id(hass, init_integration)
    prompts: list[Any] = []
    engine = init_integration.runtime_data.backend.engine
    real_generate = engine.generate

    params: list[Any] = []

    def observed(prompt: Any, *args: Any, **kwargs: Any) -> Any:
        prompts.append(prompt)
        params.append(args[0])
        # Too few tokens for even the shortest answer: the engine closes a schema answer
        # before max_tokens wherever it fits, so only this cuts one off.
        few = dataclasses.replace(args[0], max_tokens=4)
        return real_generate(prompt, few, *args[1:], **kwargs)

    with (
        patch.object(engine, "generate", observed),
        pytest.raises(HomeAssistantError) as err,
    ):
        await ai_task.async_generate_data(
            hass,
            task_name="count",
            entity_id=entity_id,
            instructions="Count the lights",
            structure=STRUCTURE,
        )
    assert err.value.translation_domain == DOMAIN
    assert err.value.translation_key == "structured_output_cut_off"
    assert "cut off" in str(err.value)
    # Decoding was held to the structure's JSON schema, converted by Home Assistant's converter.
    schema = json.loads(params[0].json_schema)
    assert schema["required"] == ["name", "count"]
    # A loop inside the JSON is held back by penalising the answer's own repeated tokens.
    assert params[0].frequency_penalty == STRUCTURE_FREQUENCY_PENALTY > 0
    assert params[0].repetition_penalty is None  # the model's own
    assert schema["properties"]["count"]["minimum"] == 0
    # The request asked for JSON of this structure.
    last_user = prompts[0][-1]["content"]
    assert "JSON schema" in last_user
    assert '"count"' in last_user
    # The entity keeps working after the failure.
    result = await ai_task.async_generate_data(
        hass, task_name="again", entity_id=entity_id, instructions="Say hi"
    )
    assert result.data


async def test_structured_answer_is_parsed_and_validated(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    entity_id = _ai_task_entity_id(hass, init_integration)
    engine = init_integration.runtime_data.backend.engine

    async def scripted(*_args: Any, **_kwargs: Any) -> AsyncIterator[RequestOutput]:
        for i, piece in enumerate(['```json\n{"name": "Hall", ', '"count": 3}\n```'], 1):
            yield RequestOutput("x", piece, [i], i == 2, None, 5, i, 0)

    with patch.object(engine, "generate", scripted):
        result = await ai_task.async_generate_data(
            hass,
            task_name="count",
            entity_id=entity_id,
            instructions="Count the lights",
            structure=STRUCTURE,
        )
    assert result.data == {"name": "Hall", "count": 3}


def test_parse_structured_output_variants() -> None:
    assert parse_structured_output('{"name": "a", "count": 2}', STRUCTURE) == {
        "name": "a",
        "count": 2,
    }
    assert parse_structured_output('Here it is: {"name": "b", "count": 0} done', STRUCTURE) == {
        "name": "b",
        "count": 0,
    }
    with pytest.raises(HomeAssistantError) as err:
        parse_structured_output("no json here", STRUCTURE)
    assert err.value.translation_key == "structured_output_not_json"
    with pytest.raises(HomeAssistantError) as err:
        parse_structured_output('{"name": "c"}', STRUCTURE)
    assert err.value.translation_key == "structured_output_invalid"
    assert "count" in err.value.translation_placeholders["error"]
    with pytest.raises(HomeAssistantError) as err:
        parse_structured_output('{"name": "c", "count": -4}', STRUCTURE)
    assert err.value.translation_key == "structured_output_invalid"
