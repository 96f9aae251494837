"""What a person watching the engine sees: state, throughputs, one log line per request."""

from __future__ import annotations

import logging

import pytest

from paged_llm.engine.core.sequence import Priority, SamplingParams
from paged_llm.engine.metrics import EngineState
from tests.helpers.support import make_engine


def test_state_reads_prompts_then_generates_then_idles() -> None:
    engine = make_engine(max_num_batched_tokens=64)
    assert engine.metrics().engine_state is EngineState.IDLE
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    engine.add_request(list(range(3, 203)), params)
    engine.step()  # the first 64 of 200 prompt tokens
    snap = engine.metrics()
    assert snap.engine_state is EngineState.READING_PROMPTS
    assert snap.prompt_throughput > 0
    assert snap.generation_throughput == 0
    states = []
    while engine.has_unfinished():
        engine.step()
        states.append(engine.metrics().engine_state)
    assert EngineState.GENERATING in states
    snap = engine.metrics()
    assert snap.engine_state is EngineState.IDLE
    # A recent average: still there right after the request, not 0 between steps.
    assert snap.generation_throughput > 0


def test_one_debug_line_per_request_and_none_per_token(caplog: pytest.LogCaptureFixture) -> None:
    engine = make_engine()
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    with caplog.at_level(logging.DEBUG, logger="paged_llm.engine"):
        engine.add_request([5, 6, 7, 8], params, Priority.BACKGROUND, request_id="a")
        engine.add_request([9, 10, 11], params, Priority.INTERACTIVE, request_id="b")
        while engine.has_unfinished():
            engine.step()
    lines = sorted(r.getMessage() for r in caplog.records if r.name.startswith("paged_llm.engine"))
    assert len(lines) == 2
    assert lines[0].startswith("Request a (background) length: 4 prompt tokens")
    assert "12 generated" in lines[0]
    assert "queue wait " in lines[1]
    assert "first token " in lines[1]
