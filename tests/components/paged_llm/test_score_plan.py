"""The scoring plan: end-of-turn tokens, the shared trunk and branches, refusals before running."""

from __future__ import annotations

import asyncio

import pytest

from custom_components.paged_llm.backend import BackendError, ScoreQuery
from custom_components.paged_llm.score_plan import (
    MIN_TRUNK_TOKENS,
    QueryTokens,
    build_plan,
    end_of_turn,
    run_plan,
)

STATE = list(range(100, 100 + 3 * MIN_TRUNK_TOKENS))
END = 2


def _tokens(question: list[int], options: list[list[int]]) -> QueryTokens:
    """A query whose template writes END after a reply."""
    prompt = STATE + question
    return QueryTokens(prompt, [*prompt, *options[0], END, 9], options)


def test_the_end_of_turn_is_the_token_after_the_reply_or_none_where_renderings_differ() -> None:
    tokens = _tokens([7] * 20, [[50], [51, 52]])
    assert end_of_turn(tokens) == [END]
    tokens.answered[len(STATE)] = 0  # the template rendered the prompt differently
    assert end_of_turn(tokens) == []


def test_one_trunk_for_all_questions_and_one_branch_per_question() -> None:
    queries = [ScoreQuery([], ["a", "b"]), ScoreQuery([], ["c", "d", "e"])]
    tokens = [
        _tokens([7] * 20, [[50], [51, 52]]),
        _tokens([8] * 20, [[60], [61], [62, 63, 64]]),
    ]
    plan = build_plan(queries, tokens, context=4096)
    assert plan.trunk == STATE
    assert plan.branches == [STATE + [7] * 20, STATE + [8] * 20]
    assert [[row.tail for row in rows] for rows in plan.requests] == [[2, 3], [2, 2, 4]]
    assert plan.requests[1][2].ids == [*STATE, *[8] * 20, 62, 63, 64, END]

    # A branch that adds less than a block to the trunk is not worth a request.
    short = [_tokens([7], [[50], [51]]), _tokens([8], [[60], [61]])]
    assert build_plan(queries[:1] * 2, short, context=4096).branches == [[], []]


def test_refusals_come_before_anything_runs() -> None:
    same = ScoreQuery([], ["kitchen", " kitchen"])
    with pytest.raises(BackendError) as caught:
        build_plan([same], [_tokens([7], [[50], [50]])], context=4096)
    assert caught.value.key == "evaluate_same_tokens"
    assert caught.value.caller
    query = ScoreQuery([], ["a", "b"])
    tokens = _tokens([7], [[50], [51]])
    fits = len(STATE) + 1 + 2
    assert build_plan([query], [tokens], context=fits).requests
    with pytest.raises(BackendError) as caught:
        build_plan([query], [tokens], context=fits, generated=1)
    assert caught.value.key == "evaluate_context_too_long"
    assert caught.value.placeholders == {"tokens": str(fits + 1), "context": str(fits)}


async def test_a_failing_request_is_one_error_and_its_siblings_are_cancelled() -> None:
    queries = [ScoreQuery([], ["a", "b", "c"])]
    plan = build_plan(queries, [_tokens([7] * 20, [[50], [51], [52]])], context=4096)
    cancelled: list[int] = []

    async def score(ids: list[int], tail: int) -> float:
        if ids[-2] == 51:
            raise BackendError("generation_failed", "boom")
        try:
            await asyncio.sleep(10 if tail > 1 else 0)
        except asyncio.CancelledError:
            cancelled.append(ids[-2])
            raise
        return -1.0

    with pytest.raises(BackendError, match="boom"):
        await run_plan(plan, score)
    assert sorted(cancelled) == [50, 52]
