"""The prompt budget: each agent's prompt counted and timed, shown by a sensor, and Repairs
issues when it does not fit the context, is slow to read, or a server cuts it short."""

from __future__ import annotations

import json
import logging
import math
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from contextlib import contextmanager
from types import MappingProxyType
from typing import Any
from unittest.mock import patch

import pytest
from aiohttp import web
from homeassistant.config_entries import ConfigEntryState, ConfigSubentry
from homeassistant.const import CONF_LLM_HASS_API, EntityCategory
from homeassistant.core import HomeAssistant
from homeassistant.helpers import device_registry as dr
from homeassistant.helpers import entity_registry as er
from homeassistant.helpers import issue_registry as ir
from homeassistant.helpers import llm
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.paged_llm import prompt_budget, runtime
from custom_components.paged_llm.const import DOMAIN
from paged_llm.engine.async_engine import AsyncEngine
from paged_llm.engine.llm_engine import LLMEngine
from tests.helpers.remote_server import free_port

ASSIST = {CONF_LLM_HASS_API: [llm.LLM_API_ASSIST]}
# small_home exposes two lights and a temperature sensor; the lock is hidden.
SMALL_HOME_EXPOSED = 3


def _conversation(entry: MockConfigEntry) -> Any:
    """The entry's conversation subentry."""
    return next(s for s in entry.subentries.values() if s.subentry_type == "conversation")


def _prompt_sensor(hass: HomeAssistant, entry: MockConfigEntry) -> str:
    """The entity id of the conversation agent's prompt-size sensor."""
    unique_id = f"{_conversation(entry).subentry_id}_prompt_tokens"
    entity_id = er.async_get(hass).async_get_entity_id("sensor", DOMAIN, unique_id)
    assert entity_id is not None
    return entity_id


@contextmanager
def _slow_threshold(seconds: float) -> Iterator[None]:
    """The slow-prompt threshold lowered where it is read: the budget's test, the repair's text."""
    with (
        patch.object(runtime, "PROMPT_SLOW_S", seconds),
        patch.object(prompt_budget, "PROMPT_SLOW_S", seconds),
    ):
        yield


def _issue(hass: HomeAssistant, kind: str, entry: MockConfigEntry) -> ir.IssueEntry | None:
    """The conversation agent's issue of this kind, if raised."""
    issue_id = prompt_budget.issue_id(kind, _conversation(entry).subentry_id)
    return ir.async_get(hass).async_get_issue(DOMAIN, issue_id)


async def _update_agent(hass: HomeAssistant, entry: MockConfigEntry, **options: Any) -> None:
    """Change the conversation agent's options; wait for its reload and its warm-up."""
    subentry = _conversation(entry)
    hass.config_entries.async_update_subentry(entry, subentry, data={**subentry.data, **options})
    await hass.async_block_till_done(wait_background_tasks=True)


class _Recorder:
    """The engine's one-token requests (the warm-ups) and the threads that tokenized."""

    def __init__(self) -> None:
        self.warmups: list[Any] = []
        self.tokenize_threads: set[int] = set()

    def patches(self) -> tuple[Any, Any]:
        """Patches on the engine's classes, so an engine started later is watched too."""
        real_generate = AsyncEngine.generate
        real_tokenize = LLMEngine.tokenize
        recorder = self

        async def generate(
            engine: AsyncEngine, prompt: Any, params: Any, *args: Any, **kwargs: Any
        ) -> AsyncIterator[Any]:
            async for out in real_generate(engine, prompt, params, *args, **kwargs):
                if out.finished and params.max_tokens == 1:
                    recorder.warmups.append(out)
                yield out

        def tokenize(engine: LLMEngine, *args: Any, **kwargs: Any) -> list[int]:
            recorder.tokenize_threads.add(threading.get_ident())
            return real_tokenize(engine, *args, **kwargs)

        return (
            patch.object(AsyncEngine, "generate", generate),
            patch.object(LLMEngine, "tokenize", tokenize),
        )


@pytest.fixture
def conversation_options(conversation_options: dict[str, Any]) -> dict[str, Any]:
    """An agent that controls the home: Assist's tools and the exposed entities in its prompt."""
    return {**conversation_options, **ASSIST}


@pytest.fixture
async def entry(
    hass: HomeAssistant, ha_core: None, mock_config_entry: MockConfigEntry
) -> AsyncGenerator[MockConfigEntry]:
    """The entry, set up by the test itself; unloaded afterwards so no engine thread is left."""
    yield mock_config_entry
    if mock_config_entry.state is ConfigEntryState.LOADED:
        assert await hass.config_entries.async_unload(mock_config_entry.entry_id)
        await hass.async_block_till_done()


async def _set_up(hass: HomeAssistant, entry: MockConfigEntry, recorder: _Recorder) -> None:
    """Set the entry up under the recorder's patches and let the agent's warm-up finish."""
    generate, tokenize = recorder.patches()
    with generate, tokenize:
        assert await hass.config_entries.async_setup(entry.entry_id)
        await hass.async_block_till_done(wait_background_tasks=True)
    assert entry.state is ConfigEntryState.LOADED


def _our_complaints(caplog: pytest.LogCaptureFixture) -> list[str]:
    """Warnings and errors this integration or the engine logged."""
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING and r.name.startswith(("custom_components.paged", "paged"))
    ]


async def test_the_sensor_shows_the_prompt_the_engine_reads(
    hass: HomeAssistant, small_home: None, entry: MockConfigEntry
) -> None:
    """The count equals the engine's own prompt tokens; the times are measured, off the loop."""
    recorder = _Recorder()
    await _set_up(hass, entry, recorder)
    engine = entry.runtime_data.backend.engine
    # The cold warm-up and the same request again, cached.
    assert len(recorder.warmups) == 2
    cold, cached = recorder.warmups
    assert cold.prompt_tokens == cached.prompt_tokens
    assert cached.cached_tokens > cold.cached_tokens

    state = hass.states.get(_prompt_sensor(hass, entry))
    assert state is not None
    assert int(state.state) == cold.prompt_tokens
    attributes = state.attributes
    assert attributes["unit_of_measurement"] == "tokens"
    context = min(engine.info.max_model_len, engine.info.pool_tokens)
    assert attributes["context_size"] == context
    assert attributes["context_share"] == round(100 * cold.prompt_tokens / context, 1)
    assert attributes["exposed_entities"] == SMALL_HOME_EXPOSED
    # The cold read gave the speed, and the prediction is the whole prompt at that speed.
    rate = attributes["prefill_tokens_per_s"]
    assert rate > 0
    # Both attributes are rounded (the time to 0.01 s), so a fast read is within that.
    predicted = cold.prompt_tokens / rate
    assert attributes["first_token_uncached_s"] == pytest.approx(predicted, rel=0.02, abs=0.006)
    assert attributes["first_token_cached_s"] > 0
    assert "truncated" not in attributes  # the engine never cuts a prompt
    # Counting tokenized on a worker thread, never on the event loop's.
    assert recorder.tokenize_threads
    assert threading.get_ident() not in recorder.tokenize_threads

    # A diagnostic entity of the agent's own device, not the engine's.
    registry_entry = er.async_get(hass).async_get(_prompt_sensor(hass, entry))
    assert registry_entry is not None
    assert registry_entry.entity_category is EntityCategory.DIAGNOSTIC
    assert registry_entry.config_subentry_id == _conversation(entry).subentry_id
    device = dr.async_get(hass).async_get(registry_entry.device_id or "")
    assert device is not None
    assert (DOMAIN, _conversation(entry).subentry_id) in device.identifiers

    # One more exposed entity: the prompt lists it, the count follows.
    hass.states.async_set("light.porch", "off", {"friendly_name": "Porch light"})
    before = int(state.state)
    with recorder.patches()[0]:
        await _update_agent(hass, entry, temperature=0.1)
    state = hass.states.get(_prompt_sensor(hass, entry))
    assert state is not None
    assert state.attributes["exposed_entities"] == SMALL_HOME_EXPOSED + 1
    assert int(state.state) > before
    assert int(state.state) == recorder.warmups[-1].prompt_tokens
    assert _issue(hass, prompt_budget.ISSUE_TOO_LONG, entry) is None
    assert _issue(hass, prompt_budget.ISSUE_SLOW, entry) is None


async def test_a_prompt_beyond_the_context_is_a_repair_until_it_fits(
    hass: HomeAssistant,
    small_home: None,
    entry: MockConfigEntry,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Assist's tools and the home do not fit a 512-token context: a repair names the
    counts and nothing is sent; without the tools the prompt fits and the repair goes."""
    hass.config_entries.async_update_entry(entry, data={**entry.data, "max_model_len": 512})
    recorder = _Recorder()
    await _set_up(hass, entry, recorder)

    issue = _issue(hass, prompt_budget.ISSUE_TOO_LONG, entry)
    assert issue is not None
    assert issue.severity is ir.IssueSeverity.WARNING
    assert not issue.is_fixable
    assert issue.translation_key == prompt_budget.ISSUE_TOO_LONG
    placeholders = issue.translation_placeholders or {}
    state = hass.states.get(_prompt_sensor(hass, entry))
    assert state is not None
    tokens = int(state.state)
    assert tokens + 8 > 512  # 8: the agent's max_tokens, the answer's room
    assert placeholders["tokens"] == str(tokens)
    assert placeholders["context"] == "512"
    assert placeholders["answer"] == "8"
    assert placeholders["entities"] == str(SMALL_HOME_EXPOSED)
    assert placeholders["agent"] == _conversation(entry).title
    assert state.attributes["context_share"] > 90
    # The engine would have refused it: the warm-up sent nothing, and nothing failed.
    assert recorder.warmups == []
    assert _our_complaints(caplog) == []

    # Without the LLM API the prompt has no tools and no home: it fits, the repair goes.
    with recorder.patches()[0]:
        await _update_agent(hass, entry, **{CONF_LLM_HASS_API: []})
    assert _issue(hass, prompt_budget.ISSUE_TOO_LONG, entry) is None
    state = hass.states.get(_prompt_sensor(hass, entry))
    assert state is not None
    assert int(state.state) + 8 <= 512
    assert state.attributes["exposed_entities"] == 0
    assert recorder.warmups
    assert int(state.state) == recorder.warmups[-1].prompt_tokens


async def test_a_slow_prompt_is_a_repair_until_it_is_fast_enough(
    hass: HomeAssistant, small_home: None, entry: MockConfigEntry
) -> None:
    """Above the threshold a repair gives the predicted seconds; below, and after the
    entry unloads, there is none."""
    with _slow_threshold(1e-4):
        await _set_up(hass, entry, _Recorder())
        issue = _issue(hass, prompt_budget.ISSUE_SLOW, entry)
    assert issue is not None
    placeholders = issue.translation_placeholders or {}
    state = hass.states.get(_prompt_sensor(hass, entry))
    assert state is not None
    # The same prediction, in tenths; the sensor may have refreshed it from a later step's
    # measured prefill speed since.
    predicted = state.attributes["first_token_uncached_s"]
    assert abs(float(placeholders["seconds"]) - predicted) <= 0.1
    assert placeholders["threshold"] == "0.0001"
    assert placeholders["entities"] == str(SMALL_HOME_EXPOSED)
    assert placeholders["tokens"] == state.state
    assert _issue(hass, prompt_budget.ISSUE_TOO_LONG, entry) is None

    # The default threshold: a tiny model reads its prompt in well under 10 s.
    await _update_agent(hass, entry, temperature=0.2)
    assert _issue(hass, prompt_budget.ISSUE_SLOW, entry) is None
    # The prompt was cached already: the speed measured before still predicts.
    state = hass.states.get(_prompt_sensor(hass, entry))
    assert state is not None
    assert state.attributes["first_token_uncached_s"] is not None

    # Issues go with the entry.
    with _slow_threshold(1e-4):
        await _update_agent(hass, entry, temperature=0.3)
        assert _issue(hass, prompt_budget.ISSUE_SLOW, entry) is not None
    assert await hass.config_entries.async_unload(entry.entry_id)
    await hass.async_block_till_done()
    assert _issue(hass, prompt_budget.ISSUE_SLOW, entry) is None


class _OtherServer:
    """An OpenAI-compatible server of another make, as small as the client needs.

    Its "tokenizer" counts 4 bytes of the request's JSON as a token. It reads at most
    ``window`` tokens of a prompt, or only the ``keep`` share of it, and reports what it
    read as usage.prompt_tokens, as Ollama's OpenAI endpoint does past its context. With
    ``tokenize`` it answers vLLM's /tokenize with the whole prompt's count.
    """

    def __init__(self, *, window: int | None, keep: float = 1.0, tokenize: bool) -> None:
        self.window, self.keep = window, keep
        self.bodies: list[dict[str, Any]] = []
        self.app = web.Application()
        self.app.router.add_get("/v1/models", self._models)
        self.app.router.add_post("/v1/chat/completions", self._chat)
        if tokenize:
            self.app.router.add_post("/tokenize", self._tokenize)
        self.runner = web.AppRunner(self.app)
        self.url = ""

    async def __aenter__(self) -> _OtherServer:
        await self.runner.setup()
        port = free_port()
        await web.TCPSite(self.runner, "127.0.0.1", port).start()
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.runner.cleanup()

    @staticmethod
    def tokens(body: dict[str, Any]) -> int:
        """The whole prompt's tokens, by this server's count."""
        shown = json.dumps([body["messages"], body.get("tools")], ensure_ascii=False)
        return math.ceil(len(shown.encode()) / 4)

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "stub", "object": "model"}]})

    async def _tokenize(self, request: web.Request) -> web.Response:
        return web.json_response({"count": self.tokens(await request.json())})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        read = int(self.tokens(body) * self.keep)
        if self.window is not None:
            read = min(read, self.window)
        stream = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await stream.prepare(request)
        events = [
            {"choices": [{"index": 0, "delta": {"content": "Hi"}, "finish_reason": None}]},
            {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]},
            {"choices": [], "usage": {"prompt_tokens": read, "completion_tokens": 1}},
        ]
        for event in events:
            await stream.write(f"data: {json.dumps(event)}\n\n".encode())
        await stream.write(b"data: [DONE]\n\n")
        await stream.write_eof()
        return stream


async def _other_server_entry(
    hass: HomeAssistant, server: _OtherServer, instructions: str
) -> MockConfigEntry:
    """A remote entry for ``server`` whose agent has these instructions; set up."""
    entry = MockConfigEntry(
        domain=DOMAIN,
        title="stub",
        data={"backend": "remote", "url": server.url, "model": "stub", "timeout": 10},
        unique_id=f"{server.url}#stub",
        subentries_data=[
            {
                "subentry_type": "conversation",
                "data": {"prompt": instructions, "max_tokens": 8, "temperature": 0.0},
                "title": "Stub conversation",
                "unique_id": None,
            }
        ],
    )
    entry.add_to_hass(hass)
    assert await hass.config_entries.async_setup(entry.entry_id)
    await hass.async_block_till_done(wait_background_tasks=True)
    assert entry.state is ConfigEntryState.LOADED
    return entry


async def test_a_server_that_cuts_the_prompt_is_a_repair(
    hass: HomeAssistant, ha_core: None, socket_enabled: None, caplog: pytest.LogCaptureFixture
) -> None:
    """Ollama-like: no /tokenize, no context length, and a prompt cut at 4,096 tokens. The
    estimate is far above the report: the repair names both; a short prompt clears it."""
    long_instructions = "Keep every answer short and kind to the household. " * 800
    async with _OtherServer(window=4096, tokenize=False) as server:
        entry = await _other_server_entry(hass, server, long_instructions)
        try:
            # The warm-up went out, cold and cached, though the estimate exceeds the context.
            assert [body["max_tokens"] for body in server.bodies] == [1, 1]
            state = hass.states.get(_prompt_sensor(hass, entry))
            assert state is not None
            attributes = state.attributes
            assert attributes["server_prompt_tokens"] == 4096
            assert attributes["counted_exactly"] is False
            assert attributes["truncated"] is True
            counted = attributes["counted_tokens"]
            assert counted > 2 * 4096
            assert int(state.state) == counted  # the prompt's size, not what was read of it
            issue = _issue(hass, prompt_budget.ISSUE_TRUNCATED, entry)
            assert issue is not None
            assert issue.severity is ir.IssueSeverity.WARNING
            assert issue.translation_placeholders == {
                "agent": "Stub conversation",
                "tokens": str(counted),
                "entities": "0",
                "reported": "4096",
                "counted": str(counted),
            }
            # The server does not say its context: no fit is judged against a guess.
            assert attributes["context_size"] is None
            assert attributes["context_share"] is None
            assert _issue(hass, prompt_budget.ISSUE_TOO_LONG, entry) is None

            await _update_agent(hass, entry, prompt="Answer briefly.")
            assert _issue(hass, prompt_budget.ISSUE_TRUNCATED, entry) is None
            state = hass.states.get(_prompt_sensor(hass, entry))
            assert state is not None
            assert state.attributes["truncated"] is False
            assert int(state.state) == state.attributes["server_prompt_tokens"]
            # Only the line of the setup that says this server cannot evaluate (no token
            # ids from its /tokenize): once, not per request.
            complaints = _our_complaints(caplog)
            assert len(complaints) == 1
            assert "cannot evaluate" in complaints[0]
        finally:
            assert await hass.config_entries.async_unload(entry.entry_id)
            await hass.async_block_till_done()


@pytest.mark.parametrize(("tokenize", "flagged"), [(True, True), (False, False)])
async def test_an_exact_count_is_held_to_a_closer_tolerance(
    hass: HomeAssistant, ha_core: None, socket_enabled: None, tokenize: bool, flagged: bool
) -> None:
    """A server that reads 90% of the prompt: caught against its own /tokenize count, but
    within the margin of the bytes estimate, which a real tokenizer may fall that far under."""
    async with _OtherServer(window=None, keep=0.9, tokenize=tokenize) as server:
        entry = await _other_server_entry(hass, server, "Answer in one sentence. " * 40)
        try:
            state = hass.states.get(_prompt_sensor(hass, entry))
            assert state is not None
            attributes = state.attributes
            whole = _OtherServer.tokens(server.bodies[0])
            assert attributes["server_prompt_tokens"] == int(whole * 0.9)
            assert attributes["counted_exactly"] is tokenize
            if tokenize:
                assert attributes["counted_tokens"] == whole
            assert attributes["truncated"] is flagged
            issue = _issue(hass, prompt_budget.ISSUE_TRUNCATED, entry)
            assert (issue is not None) is flagged
        finally:
            assert await hass.config_entries.async_unload(entry.entry_id)
            await hass.async_block_till_done()


async def test_an_agent_added_later_gets_a_sensor_and_its_issues_go_with_it(
    hass: HomeAssistant, small_home: None, entry: MockConfigEntry
) -> None:
    await _set_up(hass, entry, _Recorder())
    options = {"prompt": "Answer briefly.", "max_tokens": 8, "temperature": 0.0}
    added = ConfigSubentry(
        data=MappingProxyType(options),
        subentry_type="conversation",
        title="Second agent",
        unique_id=None,
    )
    with _slow_threshold(1e-4):
        hass.config_entries.async_add_subentry(entry, added)
        await hass.async_block_till_done(wait_background_tasks=True)
    registry = er.async_get(hass)
    sensor_id = registry.async_get_entity_id("sensor", DOMAIN, f"{added.subentry_id}_prompt_tokens")
    assert sensor_id is not None
    state = hass.states.get(sensor_id)
    assert state is not None
    assert int(state.state) > 0
    slow_id = prompt_budget.issue_id(prompt_budget.ISSUE_SLOW, added.subentry_id)
    issue = ir.async_get(hass).async_get_issue(DOMAIN, slow_id)
    assert issue is not None
    assert (issue.translation_placeholders or {})["agent"] == "Second agent"

    hass.config_entries.async_remove_subentry(entry, added.subentry_id)
    await hass.async_block_till_done(wait_background_tasks=True)
    assert registry.async_get(sensor_id) is None
    assert hass.states.get(sensor_id) is None
    assert ir.async_get(hass).async_get_issue(DOMAIN, slow_id) is None
    # The first agent keeps its sensor.
    state = hass.states.get(_prompt_sensor(hass, entry))
    assert state is not None
    assert int(state.state) > 0
