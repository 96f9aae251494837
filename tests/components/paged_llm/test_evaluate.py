"""ai_task.evaluate on the embedded engine: answers from the model's own probabilities."""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

import pytest
from homeassistant.components import ai_task, conversation
from homeassistant.core import Context, HomeAssistant
from homeassistant.exceptions import ServiceValidationError
from homeassistant.helpers import entity_registry as er
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.paged_llm.const import DOMAIN
from custom_components.paged_llm.evaluate import build_queries, distribution
from paged_llm.engine.api import SamplingParams
from paged_llm.engine.core.sequence import Priority
from tests.components.paged_llm.test_ai_task import _ai_task_entity_id as _entity_id

STATE = {
    "time": "23:40",
    "light.bedroom": "on",
    "media_player.living_room": "playing",
    "binary_sensor.front_door": "off",
    "sensor.hallway_noise": "42 dB",
}
QUESTIONS: dict[str, Any] = {
    "awake": {"type": "noul", "instructions": "Is anyone likely still awake?"},
    "room": {
        "type": "choice",
        "instructions": "Which room is the noise from?",
        "criteria": {
            "living_room": "the television room",
            "bedroom": "where people sleep",
            "kitchen": "where food is made",
            "hallway_upstairs": "between the bedrooms",
        },
    },
    "urgency": {
        "type": "score",
        "instructions": "How urgent is a notification about this?",
        "criteria": ["not at all", "a little", "somewhat", "very", "at once"],
    },
}


async def _evaluate(
    hass: HomeAssistant, entity_id: str, questions: dict[str, Any], state: Any = None
) -> Any:
    """Call ai_task.evaluate as an automation would (``state``: STATE unless given)."""
    data = {"task_name": "night", "state": state or STATE, "questions": questions}
    return await hass.services.async_call(
        "ai_task",
        "evaluate",
        {"entity_id": entity_id, **data},
        blocking=True,
        return_response=True,
    )


def _entity(hass: HomeAssistant, entity_id: str) -> Any:
    """The AI task entity object, to call its evaluate method directly."""
    component = hass.data[ai_task.DOMAIN]
    return component.get_entity(entity_id)


async def _score_whole(engine: Any, ids: list[int], tail: int) -> float:
    """The summed log probability of ``ids``' last ``tail`` tokens, every prompt token scored."""
    params = SamplingParams(temperature=0.0, max_tokens=0, prompt_logprobs=0)
    records: list[Any] = []
    async for out in engine.generate(ids, params, "automation"):
        if out.prompt_logprobs is not None:
            records = out.prompt_logprobs
    return math.fsum(record.logprob for record in records[-tail:])


async def test_every_question_type_answers_from_probabilities(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    entity_id = _entity_id(hass, init_integration)
    state = hass.states.get(entity_id)
    assert state is not None
    features = state.attributes["supported_features"]
    assert features & ai_task.AITaskEntityFeature.EVALUATE
    engine = init_integration.runtime_data.backend.engine
    priorities: list[Any] = []
    cached: list[int] = []
    real_generate = engine.generate

    async def observed(prompt: Any, params: Any, priority: Any, **kwargs: Any) -> Any:
        priorities.append(priority)
        async for out in real_generate(prompt, params, priority, **kwargs):
            if out.finished:
                cached.append(out.cached_tokens)
            yield out

    engine.generate = observed  # type: ignore[method-assign]
    try:
        result = await _evaluate(hass, entity_id, QUESTIONS)
    finally:
        del engine.generate
    answers = result["answers"]
    assert set(answers) == set(QUESTIONS)

    noul = answers["awake"]
    assert noul["type"] == "noul"
    assert 0.0 < noul["noul"] < 1.0

    room = answers["room"]
    assert room["type"] == "choice"
    assert list(room["probabilities"]) == list(QUESTIONS["room"]["criteria"])
    assert math.fsum(room["probabilities"].values()) == pytest.approx(1.0, abs=1e-6)
    assert room["choice"] == max(room["probabilities"], key=room["probabilities"].get)

    urgency = answers["urgency"]
    assert urgency["type"] == "score"
    levels = urgency["probabilities"]
    assert len(levels) == 5
    assert math.fsum(levels) == pytest.approx(1.0, abs=1e-6)
    assert urgency["score"] == pytest.approx(sum(i * p for i, p in enumerate(levels)))

    # Automation work: one trunk request (the shared state), one branch per question (its
    # prompt), then the 2 + 4 + 5 alternatives; all but the trunk read the cache.
    assert priorities == ["automation"] * 15
    assert all(tokens >= 16 for tokens in cached[1:])
    assert init_integration.runtime_data.backend.engine._llm.kv_manager.num_used_blocks == 0


async def test_a_multi_token_name_is_scored_whole_and_not_length_normalised(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    entity_id = _entity_id(hass, init_integration)
    backend = init_integration.runtime_data.backend
    engine = backend.engine
    question = QUESTIONS["room"]
    result = await _evaluate(hass, entity_id, {"room": question})
    probabilities = list(result["answers"]["room"]["probabilities"].values())

    # Each name's tokens and the end of the turn, scored whole by an independent request
    # that reads every prompt token (no tail, no prefix cache): the sum, not the mean.
    _, queries = build_queries(
        ai_task.EvaluationTask(name="night", questions={"room": question}, state=STATE)
    )
    query = queries[0]
    prompt = await engine.tokenize(query.messages)
    end = await engine.tokenize(
        [*query.messages, {"role": "assistant", "content": query.continuations[0]}]
    )
    totals, lengths = [], []
    for name in query.continuations:
        ids = await engine.tokenize(name, add_special_tokens=False)
        first = await engine.tokenize(query.continuations[0], add_special_tokens=False)
        tail = [*ids, end[len(prompt) + len(first)]]
        lengths.append(len(tail))
        totals.append(await _score_whole(engine, prompt + tail, len(tail)))
    assert max(lengths) >= 4  # "hallway_upstairs" is several tokens
    assert probabilities == pytest.approx(distribution(totals), abs=1e-4)
    means = distribution([total / length for total, length in zip(totals, lengths, strict=True)])
    assert probabilities != pytest.approx(means, abs=1e-4)


async def test_bad_questions_fail_clearly_and_leave_nothing_in_the_pool(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    entity_id = _entity_id(hass, init_integration)
    entity = _entity(hass, entity_id)
    kv = init_integration.runtime_data.backend.engine._llm.kv_manager
    cases: list[tuple[dict[str, Any], str]] = [
        ({"q": {"type": "ranking", "instructions": "Rank"}}, "evaluate_unknown_type"),
        (
            {"q": {"type": "choice", "instructions": "Which?", "criteria": {"a": "A"}}},
            "evaluate_too_few_alternatives",
        ),
        (
            {"q": {"type": "score", "instructions": "How much?", "criteria": ["none"]}},
            "evaluate_too_few_alternatives",
        ),
        (
            {
                "q": {
                    "type": "choice",
                    "instructions": "Which room?",
                    "criteria": {"kitchen": "cooking", " kitchen ": "the same, spaced"},
                }
            },
            "evaluate_same_tokens",
        ),
    ]
    for questions, key in cases:
        task = ai_task.EvaluationTask(name="bad", questions=questions, state=STATE)
        with pytest.raises(ServiceValidationError) as caught:
            await entity.internal_async_evaluate(task)
        assert caught.value.translation_key == key
        assert kv.num_used_blocks == 0

    context = init_integration.runtime_data.backend.context_size
    huge = {"log": "motion in the hallway " * context}
    task = ai_task.EvaluationTask(name="big", questions={"q": QUESTIONS["awake"]}, state=huge)
    with pytest.raises(ServiceValidationError) as caught:
        await entity.internal_async_evaluate(task)
    assert caught.value.translation_key == "evaluate_context_too_long"
    assert kv.num_used_blocks == 0

    # Through the action, Home Assistant's own schema refuses the first two kinds first.
    with pytest.raises(Exception, match=r"type|criteria|length"):
        await _evaluate(hass, entity_id, {"q": {"type": "ranking", "instructions": "Rank"}})
    # The engine still serves.
    result = await _evaluate(hass, entity_id, {"awake": QUESTIONS["awake"]})
    assert 0.0 < result["answers"]["awake"]["noul"] < 1.0
    assert kv.num_used_blocks == 0


async def test_a_voice_query_never_waits_behind_a_big_evaluation(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    entry = init_integration
    engine = entry.runtime_data.backend.engine
    llm_engine = engine._llm
    subentry = next(s for s in entry.subentries.values() if s.subentry_type == "conversation")
    agent = er.async_get(hass).async_get_entity_id("conversation", DOMAIN, subentry.subentry_id)
    assert agent is not None
    await hass.async_block_till_done(wait_background_tasks=True)

    # After every step, note whether a voice request was left waiting.
    scheduler = llm_engine.scheduler
    real_schedule = scheduler.schedule
    voice_left_waiting: list[int] = []

    def schedule() -> Any:
        out = real_schedule()
        voice_left_waiting.append(scheduler.num_waiting_by_class()[Priority.INTERACTIVE])
        return out

    outputs: list[Any] = []
    alternatives_started = asyncio.Event()
    real_generate = engine.generate

    async def observed(prompt: Any, params: Any, priority: Any, **kwargs: Any) -> Any:
        if params.max_tokens == 0 and params.prompt_logprobs_from != -1:
            alternatives_started.set()
        async for out in real_generate(prompt, params, priority, **kwargs):
            if out.finished:
                outputs.append((priority, params, out, time.monotonic()))
            yield out

    # Eight questions of eight options over a long state: 64 requests.
    state = {f"sensor.room_{i}_noise": f"{20 + i} dB" for i in range(120)}
    questions = {
        f"q{q}": {
            "type": "choice",
            "instructions": f"Which room is loudest, guess {q}?",
            "criteria": {f"room_{q}_{i}": f"room number {i}" for i in range(8)},
        }
        for q in range(8)
    }
    scheduler.schedule = schedule  # type: ignore[method-assign]
    engine.generate = observed  # type: ignore[method-assign]

    async def evaluate() -> tuple[Any, float]:
        result = await _evaluate(hass, _entity_id(hass, entry), questions, state)
        return result, time.monotonic()

    async def voice() -> tuple[conversation.ConversationResult, float]:
        await alternatives_started.wait()
        asked = time.monotonic()
        answer = await conversation.async_converse(
            hass, "Is the light on?", None, Context(), agent_id=agent
        )
        return answer, asked

    try:
        (result, evaluated_at), (answer, asked_at) = await asyncio.gather(evaluate(), voice())
    finally:
        del engine.generate
        del scheduler.schedule
    assert len(result["answers"]) == 8
    assert answer.response.speech["plain"]["speech"]
    voice_outputs = [
        o for p, params, o, _ in outputs if p == "interactive" and params.max_tokens > 1
    ]
    assert len(voice_outputs) == 1
    # Asked while the evaluation ran; never left waiting a step, never preempted.
    assert asked_at < evaluated_at
    assert voice_left_waiting
    assert not any(voice_left_waiting)
    assert voice_outputs[0].timing.num_preemptions == 0
    assert llm_engine.kv_manager.num_used_blocks == 0
