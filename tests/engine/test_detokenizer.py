"""Incremental detokenization: streamed deltas add up to the full decode, stop strings held."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from paged_llm.engine.detokenizer import Detokenizer
from tests.helpers.support import tokenizer_dir


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(tokenizer_dir())


@pytest.mark.parametrize(
    "text",
    [
        "Turn on the kitchen lights.",
        "Temperature: 21.5 °C — comfortable 😀 and ☕",
        "台所の電気をつけてください。",
        "  leading spaces and\nnew lines\t tabs",
    ],
)
def test_deltas_add_up_to_the_full_decode(tok, text: str) -> None:
    prompt = tok("prompt")["input_ids"]
    ids = tok(text, add_special_tokens=False)["input_ids"]
    detok = Detokenizer(tok, ())
    all_ids = list(prompt)
    deltas = []
    for token in ids:
        all_ids.append(token)
        delta, hit = detok.add(all_ids, len(prompt))
        assert not hit
        assert "\ufffd" not in delta
        deltas.append(delta)
    deltas.append(detok.flush())
    assert "".join(deltas) == tok.decode(ids, skip_special_tokens=True)


def test_stop_string_is_never_streamed(tok) -> None:
    ids = tok("The answer is 42. STOP and more text", add_special_tokens=False)["input_ids"]
    detok = Detokenizer(tok, ("STOP",))
    streamed, all_ids, hit = "", [], False
    for token in ids:
        all_ids.append(token)
        delta, hit = detok.add(all_ids, 0)
        streamed += delta
        if hit:
            break
    assert hit
    streamed += detok.flush()
    assert streamed == "The answer is 42. "
    assert "ST" not in streamed
