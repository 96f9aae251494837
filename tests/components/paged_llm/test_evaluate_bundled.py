"""ai_task.evaluate on the bundled model (numpy runner): its answers agree with its own decoding."""

from __future__ import annotations

import re
from typing import Any

import pytest
from homeassistant.components import ai_task
from homeassistant.const import CONF_DEVICE, CONF_MODEL
from homeassistant.core import HomeAssistant
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.paged_llm.evaluate import build_queries
from paged_llm.defaults import DEFAULT_MODEL
from paged_llm.engine.api import SamplingParams
from tests.components.paged_llm.test_evaluate import _entity_id, _evaluate

STATE = {
    "time": "14:05",
    "sensor.kitchen_noise": "78 dB",
    "sensor.bedroom_noise": "21 dB",
    "sensor.living_room_noise": "24 dB",
    "binary_sensor.smoke_kitchen": "on",
}
QUESTIONS: dict[str, Any] = {
    "smoke": {"type": "noul", "instructions": "Is there smoke in the kitchen?"},
    "room": {
        "type": "choice",
        "instructions": "Which room is the noise from?",
        "criteria": {
            "kitchen": "the kitchen",
            "bedroom": "the bedroom",
            "living_room": "the living room",
            "garden_shed": "the shed outside",
        },
    },
    "urgency": {
        "type": "score",
        "instructions": "How urgent is a smoke alarm in the kitchen?",
        "criteria": ["not urgent", "a little", "somewhat", "very urgent"],
    },
}


@pytest.fixture
def engine_settings(engine_settings: dict[str, Any]) -> dict[str, Any]:
    """The bundled SmolLM2 135M (a GGUF file) on the numpy runner."""
    return {**engine_settings, CONF_MODEL: DEFAULT_MODEL, CONF_DEVICE: "cpu", "kv_budget_mib": 48}


async def test_top_alternative_is_what_greedy_decoding_under_the_alternatives_writes(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    entity_id = _entity_id(hass, init_integration)
    engine = init_integration.runtime_data.backend.engine
    result = await _evaluate(hass, entity_id, QUESTIONS, STATE)
    _, queries = build_queries(
        ai_task.EvaluationTask(name="kitchen", questions=QUESTIONS, state=STATE)
    )
    for question_id, query in zip(QUESTIONS, queries, strict=True):
        answer = result["answers"][question_id]
        if question_id == "smoke":
            probabilities = [answer["noul"], 1 - answer["noul"]]
        elif question_id == "room":
            probabilities = list(answer["probabilities"].values())
        else:
            probabilities = answer["probabilities"]
        top = query.continuations[max(range(len(probabilities)), key=probabilities.__getitem__)]
        pattern = "|".join(re.escape(name) for name in query.continuations)
        params = SamplingParams(temperature=0.0, max_tokens=16, regex=f"({pattern})")
        text = ""
        async for out in engine.generate(query.messages, params, "automation"):
            text += out.text
        assert text == top, (question_id, probabilities)
    assert engine._llm.kv_manager.num_used_blocks == 0
