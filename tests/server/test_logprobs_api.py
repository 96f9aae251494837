"""Log probabilities through the official openai client against a real ``paged-llm serve``.

Chat's logprobs/top_logprobs and the legacy completions' logprobs, echo and vLLM's
prompt_logprobs, streaming and not; bad values are 400s naming the field. The values
themselves are checked against transformers in tests/engine/test_logprobs.py.
"""

from __future__ import annotations

from typing import Any

import openai
import pytest

from tests.helpers.server_process import API_KEY, MODEL, ServerProcess

HELLO = [{"role": "user", "content": "Tell me about the kitchen lights."}]


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)


def _check_sorted(values: list[float]) -> None:
    assert values == sorted(values, reverse=True)


def test_chat_logprobs_streaming_and_not(client: openai.OpenAI) -> None:
    request: dict[str, Any] = {
        "model": MODEL, "messages": HELLO, "max_tokens": 8, "temperature": 0,
        "logprobs": True, "top_logprobs": 3,
    }  # fmt: skip
    reply = client.chat.completions.create(**request)
    choice = reply.choices[0]
    assert choice.logprobs is not None
    content = choice.logprobs.content
    assert content is not None
    assert reply.usage is not None
    assert len(content) == reply.usage.completion_tokens == 8
    for entry in content:
        assert entry.logprob <= 0
        assert entry.bytes == list(entry.token.encode())
        assert len(entry.top_logprobs) == 3
        _check_sorted([t.logprob for t in entry.top_logprobs])
        # Greedy: the chosen token is the most likely one.
        assert entry.top_logprobs[0].token == entry.token
        assert entry.top_logprobs[0].logprob == entry.logprob
    streamed = []
    for chunk in client.chat.completions.create(**request, stream=True):
        if chunk.choices and chunk.choices[0].logprobs is not None:
            streamed.extend(chunk.choices[0].logprobs.content or [])
    assert [(e.token, round(e.logprob, 5)) for e in streamed] == [
        (e.token, round(e.logprob, 5)) for e in content
    ]
    plain = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=4)
    assert plain.choices[0].logprobs is None


def test_chat_logprobs_without_alternatives(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=MODEL, messages=HELLO, max_tokens=3, logprobs=True, seed=1
    )
    content = reply.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None
    assert len(content) == 3
    assert all(entry.top_logprobs == [] for entry in content)


def test_completion_logprobs_streaming_and_not(client: openai.OpenAI) -> None:
    request: dict[str, Any] = {
        "model": MODEL, "prompt": "The kitchen light is", "max_tokens": 6, "temperature": 0,
        "logprobs": 2,
    }  # fmt: skip
    reply = client.completions.create(**request)
    logprobs = reply.choices[0].logprobs
    assert logprobs is not None
    assert logprobs.tokens is not None
    assert logprobs.token_logprobs is not None
    assert logprobs.top_logprobs is not None
    assert logprobs.text_offset is not None
    assert len(logprobs.tokens) == 6
    assert all(v is not None and v <= 0 for v in logprobs.token_logprobs)
    for token, value, top in zip(
        logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs, strict=True
    ):
        assert top is not None
        assert token in top  # the chosen token, as vLLM adds it
        assert top[token] == value
        assert max(top.values()) == value  # greedy
        assert len(top) <= 3
    assert logprobs.text_offset == sorted(logprobs.text_offset)
    assert logprobs.text_offset[0] == 0
    streamed: list[str] = []
    offsets: list[int] = []
    for chunk in client.completions.create(**request, stream=True):
        if chunk.choices and chunk.choices[0].logprobs is not None:
            streamed.extend(chunk.choices[0].logprobs.tokens or [])
            offsets.extend(chunk.choices[0].logprobs.text_offset or [])
    assert streamed == logprobs.tokens
    assert offsets == logprobs.text_offset


def test_completion_echo_scores_the_prompt(client: openai.OpenAI) -> None:
    prompt = "The kitchen light is"
    reply = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=2, temperature=0, logprobs=1, echo=True
    )
    choice = reply.choices[0]
    assert choice.text.startswith(prompt)
    assert reply.usage is not None
    logprobs = choice.logprobs
    assert logprobs is not None
    assert logprobs.tokens is not None
    assert logprobs.token_logprobs is not None
    assert len(logprobs.tokens) == reply.usage.prompt_tokens + 2
    assert logprobs.token_logprobs[0] is None  # the first token has no context
    assert all(v is not None for v in logprobs.token_logprobs[1:])
    # Streamed: the echo and the prompt's logprobs come with the first chunk, the same lists.
    text, tokens, offsets = "", [], []
    for chunk in client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=2, temperature=0, logprobs=1, echo=True,
        stream=True,
    ):  # fmt: skip
        if chunk.choices:
            text += chunk.choices[0].text
            part = chunk.choices[0].logprobs
            if part is not None:
                tokens += part.tokens or []
                offsets += part.text_offset or []
    assert text == choice.text
    assert tokens == logprobs.tokens
    assert offsets == logprobs.text_offset


def test_prompt_logprobs_extra(client: openai.OpenAI) -> None:
    """vLLM's prompt_logprobs: one entry per prompt token, None first, the token's own kept."""
    ids = [1, 450, 2143, 3578, 338]
    reply = client.completions.create(
        model=MODEL, prompt=ids, max_tokens=1, extra_body={"prompt_logprobs": 2}
    )
    entries = reply.choices[0].model_extra["prompt_logprobs"]  # type: ignore[index]
    assert len(entries) == len(ids)
    assert entries[0] is None
    for token, entry in zip(ids[1:], entries[1:], strict=True):
        assert str(token) in entry
        assert 2 <= len(entry) <= 3
        assert all(value["logprob"] <= 0 for value in entry.values())
    chat = client.chat.completions.create(
        model=MODEL, messages=HELLO, max_tokens=1, extra_body={"prompt_logprobs": 0}
    )
    assert reply.usage is not None
    prompt = chat.model_extra["prompt_logprobs"]  # type: ignore[index]
    assert chat.usage is not None
    assert len(prompt) == chat.usage.prompt_tokens


def test_prompt_logprobs_from_scores_only_the_tail_with_the_same_values(
    client: openai.OpenAI,
) -> None:
    """This server's prompt_logprobs_from: the tail's values equal a whole-prompt scoring's.

    vLLM ignores the field and scores the whole prompt; the numbers asked for agree.
    """
    ids = [1, 450, 2143, 3578, 338, 2211, 7010]
    whole, tail = (
        client.completions.create(
            model=MODEL, prompt=ids, max_tokens=1, temperature=0, extra_body=extra
        )
        .choices[0]
        .model_extra["prompt_logprobs"]  # type: ignore[index]
        for extra in ({"prompt_logprobs": 0}, {"prompt_logprobs": 0, "prompt_logprobs_from": -3})
    )
    assert tail[:-3] == [None] * (len(ids) - 3)
    for token, full, scored in zip(ids[-3:], whole[-3:], tail[-3:], strict=True):
        assert scored[str(token)]["logprob"] == pytest.approx(full[str(token)]["logprob"], abs=1e-4)


@pytest.mark.parametrize(
    ("endpoint", "extra", "param"),
    [
        ("chat", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ("chat", {"top_logprobs": 2}, "top_logprobs"),
        ("chat", {"logprobs": "yes"}, "logprobs"),
        ("chat", {"extra_body": {"prompt_logprobs": -1}}, "prompt_logprobs"),
        ("text", {"logprobs": 21}, "logprobs"),
        ("text", {"logprobs": -1}, "logprobs"),
        ("text", {"extra_body": {"echo": "yes"}}, "echo"),
        ("text", {"extra_body": {"prompt_logprobs_from": "end"}}, "prompt_logprobs_from"),
    ],
)  # fmt: skip
def test_bad_logprob_values_are_a_400_naming_the_field(
    client: openai.OpenAI, endpoint: str, extra: dict[str, Any], param: str
) -> None:
    create: Any = client.chat.completions.create
    body: dict[str, Any] = {"messages": HELLO}
    if endpoint == "text":
        create, body = client.completions.create, {"prompt": "hi"}
    with pytest.raises(openai.BadRequestError) as caught:
        create(model=MODEL, max_tokens=2, **body, **extra)
    error = caught.value.body
    assert isinstance(error, dict)
    assert error["param"] == param
    assert param in error["message"]


async def test_the_integrations_client_parses_streamed_logprobs(
    server: ServerProcess, client: openai.OpenAI
) -> None:
    """client/openai.py asks with chat_request and gets each token's logprobs back."""
    import aiohttp

    from paged_llm.client.openai import OpenAIClient, chat_request

    body = chat_request(MODEL, HELLO, max_tokens=5, temperature=0, logprobs=True, top_logprobs=2)
    assert (body["logprobs"], body["top_logprobs"]) == (True, 2)
    assert "logprobs" not in chat_request(MODEL, HELLO)
    async with aiohttp.ClientSession() as session:
        ours = OpenAIClient(session, server.url, api_key=API_KEY)
        chunks = [chunk async for chunk in ours.stream_chat(body)]
    got = [rec for chunk in chunks for rec in chunk.logprobs]
    assert len(got) == 5
    reply = client.chat.completions.create(
        model=MODEL, messages=HELLO, max_tokens=5, temperature=0, logprobs=True, top_logprobs=2
    )
    want = reply.choices[0].logprobs.content  # type: ignore[union-attr]
    assert want is not None
    for rec, entry in zip(got, want, strict=True):
        assert rec.token == entry.token
        assert abs(rec.logprob - entry.logprob) <= 1e-5
        assert rec.bytes == tuple(entry.bytes or ())
        assert [t for t, _ in rec.top] == [t.token for t in entry.top_logprobs]
