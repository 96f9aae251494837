"""ai_task.evaluate: each question answered from the model's probabilities of its alternatives.

Nothing is generated and parsed. Each question becomes one prompt (the state first, so
every question of a task shares it, then the question and its options) and each option
is scored as the assistant's whole reply. The probabilities are the model's, normalised
over the options: a softmax of the options' summed token log probabilities, not
length-normalised (the sum is the probability of the whole reply; a mean per token is no
probability and would favour long names whose later tokens are near certain).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from homeassistant.components.ai_task import (
    ChoiceAnswer,
    EvaluationAnswer,
    EvaluationQuestion,
    EvaluationTask,
    EvaluationTaskResult,
    NoulAnswer,
    ScoreAnswer,
)
from homeassistant.core import HomeAssistant
from homeassistant.exceptions import ServiceValidationError

from .backend import ScoreQuery
from .chat import async_score
from .const import DOMAIN
from .runtime import PagedLLMConfigEntry

# The instructions every question gets; the state follows them, so all questions share both.
EVALUATE_INSTRUCTIONS = (
    "You judge the state of a smart home. Read the state, then answer the question with "
    "exactly one of the options, written as it is listed, and nothing else."
)
# A noul question's options, scored as written (lower case, as the options list shows them).
YES, NO = "yes", "no"
QUESTION_TYPES = ("noul", "choice", "score")


def _invalid(key: str, **placeholders: str) -> ServiceValidationError:
    """A translated validation error for a question that cannot be evaluated."""
    return ServiceValidationError(
        translation_domain=DOMAIN, translation_key=key, translation_placeholders=placeholders
    )


def options(question_id: str, question: Mapping[str, Any]) -> list[tuple[str, str]]:
    """A question's options: (the text scored as the reply, its description) in order.

    Raises ServiceValidationError for a type the schema does not know and for fewer than
    two options (Home Assistant's action checks both; the entity may be called directly).
    """
    kind = question.get("type")
    criteria = question.get("criteria")
    if kind == "noul":
        return [(YES, ""), (NO, "")]
    if kind == "choice" and isinstance(criteria, Mapping):
        # Surrounding spaces are no part of a reply; "a" and " a" then fail as the same.
        found = [(str(name).strip(), str(text)) for name, text in criteria.items()]
    elif kind == "score" and isinstance(criteria, Sequence) and not isinstance(criteria, str):
        found = [(str(level), str(text)) for level, text in enumerate(criteria)]
    else:
        raise _invalid(
            "evaluate_unknown_type",
            question=question_id,
            type=str(kind),
            types=", ".join(QUESTION_TYPES),
        )
    if len(found) < 2:
        raise _invalid("evaluate_too_few_alternatives", question=question_id, count=str(len(found)))
    return found


def state_text(state: Any) -> str:
    """The task's state as the prompt shows it: text as it is, anything else as JSON."""
    if isinstance(state, str):
        return state
    return json.dumps(state, ensure_ascii=False, indent=1, default=str)


def question_messages(
    state: str, question: Mapping[str, Any], choices: list[tuple[str, str]]
) -> list[dict[str, Any]]:
    """The chat of one question: the shared instructions and state, then this question."""
    lines = [f"- {name}: {text}" if text else f"- {name}" for name, text in choices]
    user = f"State:\n{state}\n\nQuestion: {question['instructions']}\nOptions:\n" + "\n".join(lines)
    return [
        {"role": "system", "content": EVALUATE_INSTRUCTIONS},
        {"role": "user", "content": user},
    ]


def distribution(logprobs: Sequence[float]) -> list[float]:
    """Probabilities over the options from their log probabilities (a stable softmax)."""
    top = max(logprobs)
    weights = [math.exp(value - top) for value in logprobs]
    total = math.fsum(weights)
    return [weight / total for weight in weights]


def answer(question: EvaluationQuestion, logprobs: list[float]) -> EvaluationAnswer:
    """A question's answer from its options' log probabilities."""
    probabilities = distribution(logprobs)
    if question["type"] == "noul":
        return NoulAnswer(noul=probabilities[0])
    if question["type"] == "choice":
        keys = list(question["criteria"])
        best = max(range(len(keys)), key=probabilities.__getitem__)
        return ChoiceAnswer(
            choice=keys[best], probabilities=dict(zip(keys, probabilities, strict=True))
        )
    expected = math.fsum(level * p for level, p in enumerate(probabilities))
    return ScoreAnswer(score=expected, probabilities=probabilities)


def build_queries(task: EvaluationTask) -> tuple[list[str], list[ScoreQuery]]:
    """Every question of a task as a scoring query, checked; with the question ids in order."""
    state = state_text(task.state)
    ids: list[str] = []
    queries: list[ScoreQuery] = []
    for question_id, question in task.questions.items():
        choices = options(question_id, question)
        ids.append(question_id)
        queries.append(
            ScoreQuery(
                messages=question_messages(state, question, choices),
                continuations=[name for name, _ in choices],
            )
        )
    return ids, queries


async def async_evaluate(
    hass: HomeAssistant, entry: PagedLLMConfigEntry, task: EvaluationTask, priority: str
) -> EvaluationTaskResult:
    """Answer every question of ``task`` at ``priority``: one scoring round for all of them."""
    ids, queries = build_queries(task)
    scores = await async_score(hass, entry, queries, priority)
    answers = {
        question_id: answer(task.questions[question_id], logprobs)
        for question_id, logprobs in zip(ids, scores, strict=True)
    }
    return EvaluationTaskResult(answers=answers)
