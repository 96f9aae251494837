"""How answers are scored, whichever backend runs them: the token sequences and their order.

Each alternative is scored as the assistant's whole reply: its own tokens, then the token
the chat template writes to end the turn, so an alternative that is the start of another
("kitchen", "kitchen_upstairs") is not counted for the longer one. The tokens every
request starts with (the state prompt) form one trunk, read first on its own so the prefix
cache holds it; then each question's own prompt (its branch: the question and its options),
all questions at once; then every alternative of every question at once, each reading only
its own tokens (and the part of a KV block the cache cannot share).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

from .backend import BackendError, ScoreQuery
from .errors import first_failure

# A trunk shorter than this is not worth a request of its own (one KV block of most pools).
MIN_TRUNK_TOKENS = 16


@dataclass(slots=True)
class ScoreRequest:
    """One alternative to score: the prompt's tokens with it, and how many at the end it has."""

    ids: list[int]
    tail: int


@dataclass(slots=True)
class ScorePlan:
    """Every request of an evaluation, per query, and the prefixes read before them.

    ``trunk``: the tokens every request starts with ([]: none worth a request);
    ``branches``: each query's own prefix, read after the trunk ([] where none is worth it).
    """

    requests: list[list[ScoreRequest]]
    trunk: list[int]
    branches: list[list[int]]


@dataclass(slots=True)
class QueryTokens:
    """A query's tokens as the backend's tokenizer and chat template give them.

    ``prompt``: the messages with the generation prompt; ``answered``: the messages with
    the first continuation as the assistant's reply (to find the end of turn);
    ``continuations``: each continuation's own tokens.
    """

    prompt: list[int]
    answered: list[int]
    continuations: list[list[int]]


def end_of_turn(tokens: QueryTokens) -> list[int]:
    """The token the template writes after a reply, or none where the rendering disagrees.

    The reply rendered in the conversation must start with the generation prompt's tokens
    and the first continuation's own; the token after them ends the turn.
    """
    prompt, answered, first = tokens.prompt, tokens.answered, tokens.continuations[0]
    end = len(prompt) + len(first)
    if answered[: len(prompt)] != prompt or answered[len(prompt) : end] != first:
        return []
    return answered[end : end + 1]


def _check_distinct(query: ScoreQuery, continuations: list[list[int]]) -> None:
    """Raise when two continuations are the same tokens: no probability tells them apart."""
    seen: dict[tuple[int, ...], str] = {}
    for text, ids in zip(query.continuations, continuations, strict=True):
        if (other := seen.setdefault(tuple(ids), text)) is not text:
            raise BackendError(
                "evaluate_same_tokens",
                f"{other!r} and {text!r} are the same tokens",
                caller=True,
                placeholders={"first": other, "second": text},
            )


def _common_prefix(sequences: Sequence[list[int]]) -> list[int]:
    """The tokens every sequence starts with."""
    first = min(sequences, key=len)
    for index, token in enumerate(first):
        if any(seq[index] != token for seq in sequences):
            return first[:index]
    return list(first)


def build_plan(
    queries: Sequence[ScoreQuery],
    tokens: Sequence[QueryTokens],
    context: int,
    generated: int = 0,
) -> ScorePlan:
    """The requests that score every continuation; ``generated``: tokens a request adds.

    Raises BackendError (the caller's) for continuations that are the same tokens and
    for a request beyond the context, before anything runs.
    """
    requests: list[list[ScoreRequest]] = []
    for query, query_tokens in zip(queries, tokens, strict=True):
        _check_distinct(query, query_tokens.continuations)
        end = end_of_turn(query_tokens)
        rows = [
            ScoreRequest(query_tokens.prompt + ids + end, len(ids) + len(end))
            for ids in query_tokens.continuations
        ]
        longest = max(len(row.ids) for row in rows) + generated
        if longest > context:
            raise BackendError(
                "evaluate_context_too_long",
                f"{longest} tokens, the context holds {context}",
                caller=True,
                placeholders={"tokens": str(longest), "context": str(context)},
            )
        requests.append(rows)
    flat = [row.ids for rows in requests for row in rows]
    trunk = _common_prefix(flat) if len(flat) > 1 else []
    trunk = trunk if len(trunk) >= MIN_TRUNK_TOKENS else []
    branches = []
    for rows in requests:
        branch = _common_prefix([row.ids for row in rows]) if len(rows) > 1 else []
        # Worth a request where it adds a KV block's worth to the trunk.
        branches.append(branch if len(branch) >= len(trunk) + MIN_TRUNK_TOKENS else [])
    return ScorePlan(requests, trunk, branches)


async def run_plan(
    plan: ScorePlan, score: Callable[[list[int], int], Coroutine[Any, Any, float]]
) -> list[list[float]]:
    """Run a plan with ``score(ids, tail)`` (the tail's summed log probability).

    A tail of 0 only reads ``ids`` into the prefix cache (no log probabilities: those
    would cost the model's head on every row of the prompt's chunks).

    The trunk first, alone; then the branches at once; then every request at once, each
    stage in one task group so a failure cancels (and so aborts) the rest.
    """
    if plan.trunk:
        await score(plan.trunk, 0)
    try:
        async with asyncio.TaskGroup() as group:
            for branch in plan.branches:
                if branch:
                    group.create_task(score(branch, 0))
        async with asyncio.TaskGroup() as group:
            tasks: list[list[asyncio.Task[float]]] = [
                [group.create_task(score(row.ids, row.tail)) for row in rows]
                for rows in plan.requests
            ]
    except BaseExceptionGroup as failures:
        # One error for the caller: the siblings failed with it or were cancelled for it.
        raise first_failure(failures) from failures
    return [[task.result() for task in row] for row in tasks]
