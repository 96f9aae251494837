"""The server through the official openai client: chat and completions, streaming and not."""

from __future__ import annotations

import json

import openai
import pytest

from tests.helpers.server_process import API_KEY, MODEL, ServerProcess

HELLO = [{"role": "user", "content": "Tell me about the kitchen lights."}]


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)


def _greedy(client: openai.OpenAI, max_tokens: int = 12) -> str:
    reply = client.chat.completions.create(
        model=MODEL, messages=HELLO, max_tokens=max_tokens, temperature=0
    )
    return reply.choices[0].message.content or ""


def test_models_lists_the_served_model(client: openai.OpenAI) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]


def test_chat_not_streaming_reports_usage(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=6, temperature=0)
    choice = reply.choices[0]
    assert reply.object == "chat.completion"
    assert reply.id.startswith("chatcmpl-")
    assert choice.message.role == "assistant"
    assert choice.message.content
    assert choice.finish_reason == "length"
    assert reply.usage is not None
    assert reply.usage.completion_tokens == 6
    assert reply.usage.prompt_tokens > 5
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + 6


def test_streaming_gives_the_same_greedy_text_and_usage(client: openai.OpenAI) -> None:
    expected = _greedy(client)
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=HELLO,
            max_tokens=12,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == expected
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "length"
    assert all(f is None for f in finishes[:-1])
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 12
    assert len({c.id for c in chunks}) == 1


def test_stop_string_ends_the_answer_before_it(client: openai.OpenAI) -> None:
    text = _greedy(client, max_tokens=16)
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    assert stop.strip(), text
    reply = client.chat.completions.create(
        model=MODEL, messages=HELLO, max_tokens=16, temperature=0, stop=[stop]
    )
    assert reply.choices[0].message.content == text[: text.find(stop)]
    assert reply.choices[0].finish_reason == "stop"


def test_seed_repeats_a_sampled_answer(client: openai.OpenAI) -> None:
    def sample(seed: int) -> str:
        reply = client.chat.completions.create(
            model=MODEL, messages=HELLO, max_tokens=10, temperature=1.0, seed=seed
        )
        return reply.choices[0].message.content or ""

    first = sample(1234)
    assert sample(1234) == first
    assert sample(4321) != first


def test_text_completions_streaming_and_not(client: openai.OpenAI) -> None:
    reply = client.completions.create(model=MODEL, prompt="The kitchen light", max_tokens=5)
    assert reply.object == "text_completion"
    assert reply.usage is not None
    assert reply.usage.completion_tokens == 5
    streamed = client.completions.create(
        model=MODEL, prompt="The kitchen light", max_tokens=5, temperature=0, stream=True
    )
    parts = list(streamed)
    assert parts[-1].choices[0].finish_reason == "length"
    greedy = client.completions.create(
        model=MODEL, prompt="The kitchen light", max_tokens=5, temperature=0
    )
    assert "".join(p.choices[0].text for p in parts) == greedy.choices[0].text


@pytest.mark.parametrize("priority", ["background", "Automation", 0, 1, 7, -3])
def test_priority_by_name_or_vllm_integer(client: openai.OpenAI, priority: object) -> None:
    reply = client.chat.completions.create(
        model=MODEL, messages=HELLO, max_tokens=2, extra_body={"priority": priority}
    )
    assert reply.usage is not None
    assert reply.usage.completion_tokens == 2


def test_min_p_is_accepted_as_vllm_accepts_it(client: openai.OpenAI) -> None:
    """min_p (vLLM's and llama.cpp's extra field) samples; at 1 it keeps only the top token."""
    reply = client.chat.completions.create(
        model=MODEL, messages=HELLO, max_tokens=8, seed=3, extra_body={"min_p": 1.0}
    )
    assert reply.choices[0].message.content == _greedy(client, 8)


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"temperature": 3.0}, "temperature"),
        ({"n": 2}, "n"),
        ({"top_p": 0}, "top_p"),
        ({"extra_body": {"min_p": 1.5}}, "min_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"stop": 5}, "stop"),
        ({"extra_body": {"priority": "urgent"}}, "priority"),
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
         "response_format.json_schema.schema"),
        ({"tools": [{"type": "function", "function": {}}]}, "tools[0]"),
        ({"messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role"),
        ({"messages": []}, "messages"),
        ({"max_tokens": 5000}, "max_tokens"),
    ],
)  # fmt: skip
def test_bad_field_is_a_400_naming_it(
    client: openai.OpenAI, extra: dict[str, object], param: str
) -> None:
    request: dict[str, object] = {"model": MODEL, "messages": HELLO, "max_tokens": 4, **extra}
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(**request)  # type: ignore[call-overload]
    error = caught.value.body
    assert isinstance(error, dict)
    assert error["param"] == param
    assert param.split("[")[0].split(".")[0] in error["message"]


ROOM_SCHEMA = {
    "type": "object",
    "properties": {"room": {"enum": ["kitchen", "hall"]}},
    "required": ["room"],
    "additionalProperties": False,
}


@pytest.mark.parametrize(
    "response_format",
    [
        {"type": "json_object"},
        {"type": "json_schema", "json_schema": {"name": "room", "schema": ROOM_SCHEMA}},
    ],
)
def test_response_format_is_enforced_or_refused_clearly(
    client: openai.OpenAI, response_format: dict[str, object]
) -> None:
    import dataclasses

    from paged_llm.engine.core.sequence import SamplingParams

    fields = {f.name for f in dataclasses.fields(SamplingParams)}
    request = {"model": MODEL, "messages": HELLO, "max_tokens": 64, "temperature": 0}
    if "json_object" not in fields:  # the engine has no constrained decoding yet
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(**request, response_format=response_format)  # type: ignore[call-overload]
        assert "not supported yet" in str(caught.value)
        return
    reply = client.chat.completions.create(**request, response_format=response_format)  # type: ignore[call-overload]
    content = reply.choices[0].message.content or ""
    if reply.choices[0].finish_reason == "stop":
        value = json.loads(content)
        assert isinstance(value, dict)
        if response_format["type"] == "json_schema":
            assert value in ({"room": "kitchen"}, {"room": "hall"})
    else:  # cut off by max_tokens: still a prefix of JSON
        assert content.lstrip().startswith("{")


def test_unknown_model_is_a_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="/etc/passwd", messages=HELLO, max_tokens=2)
    assert "does not exist" in str(caught.value)


def test_wrong_key_is_a_401(server: ServerProcess) -> None:
    other = openai.OpenAI(base_url=f"{server.url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        other.models.list()
