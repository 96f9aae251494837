"""The server passes OpenAI's and vLLM's penalty fields to the engine's sampler."""

from __future__ import annotations

import pytest

from paged_llm.protocol.errors import ApiError
from paged_llm.protocol.requests import parse_chat_request
from paged_llm.server.generation import sampling_params


def _body(**fields: object) -> dict[str, object]:
    return {"messages": [{"role": "user", "content": "hi"}], **fields}


def test_penalties_reach_the_engine() -> None:
    request = parse_chat_request(
        _body(repetition_penalty=1.2, frequency_penalty=0.5, presence_penalty=-0.25)
    )
    params = sampling_params(request, prompt_len=10, limit=100, default_max=16)
    assert params.repetition_penalty == 1.2
    assert params.frequency_penalty == 0.5
    assert params.presence_penalty == -0.25


def test_absent_penalties_are_off_but_the_models_own_repetition_penalty() -> None:
    params = sampling_params(parse_chat_request(_body()), 10, 100, 16)
    # None: the engine applies the model's generation_config value (vLLM does the same).
    assert (params.repetition_penalty, params.frequency_penalty, params.presence_penalty) == (
        None,
        0.0,
        0.0,
    )


@pytest.mark.parametrize(("field", "value"), [("frequency_penalty", 3), ("presence_penalty", -2.5)])
def test_out_of_range_penalties_are_a_400_naming_the_field(field: str, value: float) -> None:
    with pytest.raises(ApiError) as err:
        parse_chat_request(_body(**{field: value}))
    assert err.value.status == 400
    assert field in str(err.value)


def test_the_client_sends_a_repetition_penalty_only_when_one_is_chosen() -> None:
    from paged_llm.client.openai import chat_request

    messages = [{"role": "user", "content": "hi"}]
    assert "repetition_penalty" not in chat_request("m", messages)  # the model's own
    # 1 is sent too: it turns off a model's own penalty.
    assert chat_request("m", messages, repetition_penalty=1.0)["repetition_penalty"] == 1.0
