"""No request can hang or kill the engine: failures, aborts, duplicates, stop, bad inputs."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from paged_llm.engine.async_engine import AsyncEngine
from paged_llm.engine.core.sequence import FinishReason, SamplingParams
from paged_llm.engine.detokenizer import Detokenizer
from paged_llm.engine.errors import (
    EngineDeadError,
    InvalidArgument,
    InvalidSamplingParams,
    RequestRejected,
)
from tests.helpers.support import make_engine, make_loaded

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


def _fail_for(engine: Any, request_id: str, message: str) -> None:
    """Make sampling raise for one request only (a fault no valid input reaches any more)."""
    sampler = engine.runner.sampler
    real = sampler._generator

    def generator(seq: Any) -> Any:
        if seq.request_id == request_id:
            raise RuntimeError(message)
        return real(seq)

    sampler._generator = generator


def _drain(engine: Any) -> dict[str, list[Any]]:
    """Step until idle; every output per request."""
    outs: dict[str, list[Any]] = {}
    while engine.has_unfinished():
        for out in engine.step():
            outs.setdefault(out.request_id, []).append(out)
    return outs


def test_a_sampling_failure_fails_only_its_request() -> None:
    engine = make_engine()
    _fail_for(engine, "bad", "sampler fault")
    seeded = SamplingParams(temperature=1.0, seed=1, max_tokens=6, ignore_eos=True)
    for i in range(4):
        engine.add_request([5 + i, 6, 7], GREEDY, request_id=f"ok{i}")
    engine.add_request([9, 9, 9], seeded, request_id="bad")
    engine.add_request([8, 8], seeded, request_id="ok-seeded")
    outs = _drain(engine)
    bad = outs["bad"][-1]
    assert bad.finished
    assert bad.finish_reason is FinishReason.ERROR
    assert str(bad.error) == "sampler fault"
    for rid in ("ok0", "ok1", "ok2", "ok3", "ok-seeded"):
        assert outs[rid][-1].finish_reason is FinishReason.LENGTH
        assert outs[rid][-1].completion_tokens == 6
    assert engine.kv_manager.num_used_blocks == 0
    engine.add_request([3, 4], GREEDY, request_id="after")
    assert _drain(engine)["after"][-1].completion_tokens == 6


def test_a_detokenizer_failure_fails_only_its_request() -> None:
    engine = make_engine()
    engine.add_request([5, 6, 7], GREEDY, request_id="ok")
    engine.add_request([9, 9, 9], GREEDY, request_id="bad")

    class Broken(Detokenizer):
        """A detokenizer that fails on its first token."""

        def add(self, token_ids: list[int], base: int) -> tuple[str, bool]:
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "simulated")

    engine._detokenizers["bad"] = Broken(engine.tokenizer, ())
    outs = _drain(engine)
    assert outs["bad"][-1].finish_reason is FinishReason.ERROR
    assert isinstance(outs["bad"][-1].error, UnicodeDecodeError)
    assert outs["ok"][-1].completion_tokens == 6
    assert engine.kv_manager.num_used_blocks == 0


def test_a_closed_engine_refuses_requests_clearly() -> None:
    engine = make_engine()
    engine.close()
    with pytest.raises(EngineDeadError, match="stopped"):
        engine.add_request([5, 6], GREEDY)
    with pytest.raises(EngineDeadError, match="stopped"):
        engine.step()


async def started(**overrides: Any) -> AsyncEngine:
    loaded, config = make_loaded(vocab_size=49152, **overrides)
    engine = AsyncEngine(config, loaded=loaded)
    await engine.start()
    return engine


async def _idle(engine: AsyncEngine) -> None:
    """Wait until the engine thread has nothing left (aborts are applied asynchronously)."""
    for _ in range(200):
        if not engine._llm.has_unfinished():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the engine did not go idle")


async def test_abort_while_streaming_ends_the_stream_at_once() -> None:
    engine = await started()
    try:
        params = SamplingParams(max_tokens=500, ignore_eos=True)
        outs = []
        async with asyncio.timeout(10):
            async for out in engine.generate("tell a story", params, request_id="r1"):
                outs.append(out)
                if len(outs) == 3:
                    engine.abort("r1")
        assert len(outs) == 4
        assert outs[-1].finished
        assert outs[-1].finish_reason is FinishReason.ABORT
        assert outs[-1].completion_tokens == 3
        await _idle(engine)
        assert engine._llm.kv_manager.num_used_blocks == 0
        assert engine.is_running
    finally:
        await engine.stop()


async def test_a_duplicate_live_id_is_refused_and_the_live_request_goes_on() -> None:
    engine = await started()
    try:
        params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
        first = engine.generate("first request", params, request_id="same")
        head = await anext(first)
        with pytest.raises(RequestRejected, match="already in use") as info:
            await anext(engine.generate("second", params, request_id="same"))
        assert info.value.code == "duplicate_id"
        async with asyncio.timeout(10):
            rest = [out async for out in first]
        assert rest[-1].finish_reason is FinishReason.LENGTH
        assert len(head.token_ids) + sum(len(o.token_ids) for o in rest) == 30
        # Once it has ended, its id is free again.
        again = [out async for out in engine.generate("third", params, request_id="same")]
        assert again[-1].completion_tokens == 30
    finally:
        await engine.stop()


async def test_requests_after_stop_get_an_engine_stopped_error() -> None:
    engine = await started()
    await engine.stop()
    with pytest.raises(EngineDeadError, match="stopped"):
        await anext(engine.generate("hi", GREEDY))


async def test_bad_requests_among_twenty_good_ones_fail_alone() -> None:
    engine = await started(max_num_seqs=32)
    try:
        _fail_for(engine._llm, "faulty", "sampler fault")
        params = SamplingParams(temperature=0.8, seed=3, max_tokens=12, ignore_eos=True)

        async def run(i: int) -> Any:
            return [o async for o in engine.generate(f"request {i}", params, request_id=str(i))]

        async def faulty() -> None:
            async for _ in engine.generate("faulty", params, request_id="faulty"):
                pass

        tasks = [asyncio.create_task(run(i)) for i in range(20)]
        with pytest.raises(InvalidSamplingParams, match="seed"):
            SamplingParams(seed=2**64)
        with pytest.raises(RuntimeError, match="sampler fault"):
            await faulty()
        results = await asyncio.gather(*tasks)
        assert all(outs[-1].completion_tokens == 12 for outs in results)
        assert engine.is_running
        await _idle(engine)
        assert engine._llm.kv_manager.num_used_blocks == 0
    finally:
        await engine.stop()


MESSAGE = {"role": "user", "content": "hi"}
# (generate arguments, error type, text the error must contain)
BAD_INPUTS: list[tuple[dict[str, Any], type[Exception], str]] = [
    ({"prompt": 5}, InvalidArgument, "prompt"),
    ({"prompt": None}, InvalidArgument, "prompt"),
    ({"prompt": b"bytes"}, InvalidArgument, "prompt"),
    ({"prompt": [1, True, 3]}, InvalidArgument, "prompt token ids"),
    ({"prompt": [1, 2.5]}, InvalidArgument, "prompt token ids"),
    ({"prompt": [1, "2"]}, InvalidArgument, "prompt token ids"),
    ({"prompt": [{"content": "hi"}]}, InvalidArgument, "prompt message 0"),
    ({"prompt": [{"role": "user", "content": 5}]}, InvalidArgument, "prompt message 0"),
    ({"prompt": [MESSAGE, "text"]}, InvalidArgument, "prompt message 1"),
    ({"prompt": ""}, RequestRejected, "prompt is empty"),
    ({"prompt": []}, RequestRejected, "prompt is empty"),
    ({"prompt": [10**9]}, RequestRejected, "prompt has token ids"),
    ({"params": {"temperature": 0}}, InvalidArgument, "params"),
    ({"params": "greedy"}, InvalidArgument, "params"),
    ({"priority": "urgent"}, InvalidArgument, "priority"),
    ({"priority": None}, InvalidArgument, "priority"),
    ({"priority": 1.5}, InvalidArgument, "priority"),
    ({"priority": True}, InvalidArgument, "priority"),
    ({"tools": "lights"}, InvalidArgument, "tools"),
    ({"tools": ["lights"]}, InvalidArgument, "tools"),
    ({"request_id": 5}, InvalidArgument, "request_id"),
    ({"request_id": ""}, InvalidArgument, "request_id"),
]
# (SamplingParams arguments, text the error must contain): refused when built.
BAD_PARAMS: list[dict[str, Any]] = [
    {"stop": [1]},
    {"stop": [""]},
    {"stop": 5},
    {"stop": "END"},
    {"seed": 2**64},
    {"seed": -(2**63) - 1},
    {"seed": "1"},
    {"seed": 1.0},
    {"temperature": "hot"},
    {"temperature": float("nan")},
    {"top_p": 0},
    {"top_k": True},
    {"max_tokens": 0},
    {"stop_token_ids": [-1]},
    {"stop_token_ids": 3},
    {"ignore_eos": "yes"},
]


async def test_every_bad_input_names_its_argument_and_the_engine_serves_on() -> None:
    engine = await started(max_model_len=256)
    try:
        for kwargs, error, text in BAD_INPUTS:
            call = {"prompt": "hello", "params": GREEDY, **kwargs}
            with pytest.raises(error, match=text):
                await anext(engine.generate(**call))
        for kwargs in BAD_PARAMS:
            (name,) = kwargs
            with pytest.raises(InvalidSamplingParams, match=name):
                SamplingParams(**kwargs)
        # stop=None means no stop strings, as OpenAI's null does.
        assert SamplingParams(stop=None).stop == ()
        outs = [o async for o in engine.generate("hello", GREEDY)]
        assert outs[-1].completion_tokens == 6
        assert engine.is_running
        await _idle(engine)
        assert engine._llm.kv_manager.num_used_blocks == 0
    finally:
        await engine.stop()


def test_the_synchronous_entry_points_name_their_arguments() -> None:
    engine = make_engine()
    cases: list[tuple[Any, str]] = [
        (lambda: engine.add_request("text"), "prompt_token_ids"),
        (lambda: engine.add_request([1, True]), "prompt_token_ids"),
        (lambda: engine.add_request([1], {"temperature": 0}), "params"),
        (lambda: engine.add_request([1], GREEDY, "urgent"), "priority"),
        (lambda: engine.add_request([1], GREEDY, request_id=3), "request_id"),
        (lambda: engine.add_request([1], GREEDY, arrival_time="now"), "arrival_time"),
        (lambda: engine.tokenize(7), "prompt"),
        (lambda: engine.tokenize("hi", tools="x"), "tools"),
    ]
    for call, name in cases:
        with pytest.raises(InvalidArgument, match=name) as info:
            call()
        assert info.value.argument in (name, "prompt")
    engine.add_request([5, 6], GREEDY, request_id="fine")
    assert _drain(engine)["fine"][-1].completion_tokens == 6
    assert engine.kv_manager.num_used_blocks == 0


def test_a_grammar_failure_fails_only_its_request() -> None:
    engine = make_engine()
    structured = engine.runner.structured
    real = structured.sync

    def sync(seq: Any) -> bool:
        if seq.request_id == "bad":
            raise RuntimeError("grammar fault")
        return real(seq)

    structured.sync = sync
    engine.add_request([5, 6, 7], GREEDY, request_id="free")
    engine.add_request([8, 8], SamplingParams(max_tokens=6, json_object=True), request_id="json")
    engine.add_request([9, 9, 9], SamplingParams(max_tokens=6, json_object=True), request_id="bad")
    outs = _drain(engine)
    assert outs["bad"][-1].finish_reason is FinishReason.ERROR
    assert str(outs["bad"][-1].error) == "grammar fault"
    assert outs["free"][-1].completion_tokens == 6
    assert outs["json"][-1].finish_reason is not FinishReason.ERROR
    assert engine.kv_manager.num_used_blocks == 0
