"""The integration against a real `paged-llm serve` process: flow, agents, actions, sensors."""

from __future__ import annotations

import contextlib
import logging
import sys
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from unittest.mock import patch

import aiohttp
import pytest
import pytest_socket
from aiohttp import web
from homeassistant import config_entries
from homeassistant.components import ai_task, conversation
from homeassistant.config_entries import ConfigEntryState
from homeassistant.const import CONF_LLM_HASS_API, CONF_PROMPT, STATE_UNAVAILABLE
from homeassistant.core import Context, HomeAssistant
from homeassistant.data_entry_flow import FlowResultType
from homeassistant.exceptions import HomeAssistantError, ServiceValidationError
from homeassistant.helpers import entity_registry as er
from homeassistant.helpers import issue_registry as ir
from homeassistant.helpers import llm
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.paged_llm.backend import ScoreQuery
from custom_components.paged_llm.const import DEFAULT_SUMMARY_REPETITION_PENALTY
from custom_components.paged_llm.diagnostics import async_get_config_entry_diagnostics
from custom_components.paged_llm.engine_install import extra_requirements
from custom_components.paged_llm.home_grammar import async_get_home
from paged_llm.protocol.tool_prompt import template_shows_tools, template_source, tools_as_text
from tests.components.paged_llm.test_evaluate import QUESTIONS, _evaluate
from tests.helpers.remote_server import ServerProcess, free_port
from tests.helpers.support import becomes_true

DOMAIN = "paged_llm"
API_KEY = "test-key-123"


@pytest.fixture(autouse=True)
def local_sockets(socket_enabled: None) -> None:
    """Let the tests reach the server process (the harness still allows only 127.0.0.1)."""


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path) -> Iterator[ServerProcess]:
    """One server for the module, with an API key."""
    # Module fixtures start before the function-scoped socket_enabled.
    pytest_socket.enable_socket()
    process = ServerProcess(tiny_model_dir, api_key=API_KEY)
    process.start()
    yield process
    process.stop()


def _remote_data(server: ServerProcess) -> dict[str, Any]:
    return {
        "backend": "remote",
        "url": server.url,
        "api_key": API_KEY,
        "timeout": 30,
        "model": server.served_name,
    }


def _entry(
    hass: HomeAssistant,
    server: ServerProcess,
    conversation_options: dict[str, Any],
    ai_task_options: dict[str, Any],
) -> MockConfigEntry:
    entry = MockConfigEntry(
        domain=DOMAIN,
        title=server.served_name,
        data=_remote_data(server),
        unique_id=f"{server.url}#{server.served_name}",
        subentries_data=[
            {
                "subentry_type": "conversation",
                "data": conversation_options,
                "title": "Remote conversation",
                "unique_id": None,
            },
            {
                "subentry_type": "ai_task_data",
                "data": ai_task_options,
                "title": "Remote AI task",
                "unique_id": None,
            },
        ],
    )
    entry.add_to_hass(hass)
    return entry


@pytest.fixture
async def remote_entry(
    hass: HomeAssistant,
    ha_core: None,
    server: ServerProcess,
    conversation_options: dict[str, Any],
    ai_task_options: dict[str, Any],
) -> AsyncGenerator[MockConfigEntry]:
    """An entry set up against the module's server; unloaded afterwards."""
    entry = _entry(hass, server, conversation_options, ai_task_options)
    assert await hass.config_entries.async_setup(entry.entry_id)
    await hass.async_block_till_done(wait_background_tasks=True)  # and the agent's warm-up
    assert entry.state is ConfigEntryState.LOADED
    yield entry
    if entry.state is ConfigEntryState.LOADED:
        assert await hass.config_entries.async_unload(entry.entry_id)
        await hass.async_block_till_done()


def _entity_id(hass: HomeAssistant, domain: str, unique_id: str) -> str:
    entity_id = er.async_get(hass).async_get_entity_id(domain, DOMAIN, unique_id)
    assert entity_id is not None, unique_id
    return entity_id


def _agent(hass: HomeAssistant, entry: MockConfigEntry, kind: str) -> str:
    subentry = next(s for s in entry.subentries.values() if s.subentry_type == kind)
    domain = "conversation" if kind == "conversation" else "ai_task"
    return _entity_id(hass, domain, subentry.subentry_id)


def _sensor(hass: HomeAssistant, entry: MockConfigEntry, key: str) -> str:
    state = hass.states.get(_entity_id(hass, "sensor", f"{entry.entry_id}_{key}"))
    assert state is not None
    return state.state


async def _generate_a_token(hass: HomeAssistant) -> None:
    """Run the generate action once; the entry must answer with a token."""
    response = await hass.services.async_call(
        DOMAIN, "generate", {"prompt": "Hi", "max_tokens": 2}, blocking=True, return_response=True
    )
    assert response is not None
    assert response["completion_tokens"] >= 1


async def _start_server_flow(hass: HomeAssistant) -> dict[str, Any]:
    result = await hass.config_entries.flow.async_init(
        DOMAIN, context={"source": config_entries.SOURCE_USER}
    )
    assert result["step_id"] == "user"
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], {"backend": "remote"}
    )
    assert result["type"] is FlowResultType.FORM
    assert result["step_id"] == "server"
    return result


async def test_flow_to_a_server_names_each_error_then_creates_the_entry(
    hass: HomeAssistant, ha_core: None, server: ServerProcess
) -> None:
    result = await _start_server_flow(hass)
    flow_id = result["flow_id"]

    nobody = f"http://127.0.0.1:{free_port()}"
    result = await hass.config_entries.flow.async_configure(flow_id, {"url": nobody, "timeout": 5})
    assert result["errors"] == {"base": "cannot_connect"}
    assert nobody in result["description_placeholders"]["reason"]

    result = await hass.config_entries.flow.async_configure(
        flow_id, {"url": server.url, "api_key": "wrong", "timeout": 5}
    )
    assert result["errors"] == {"base": "invalid_auth"}

    # With /v1 or without: the same server.
    result = await hass.config_entries.flow.async_configure(
        flow_id, {"url": f"{server.url}/v1/", "api_key": API_KEY, "timeout": 30}
    )
    assert result["type"] is FlowResultType.FORM
    assert result["step_id"] == "server_model"
    assert result["data_schema"].schema["model"].config["options"] == [server.served_name]

    result = await hass.config_entries.flow.async_configure(flow_id, {"model": server.served_name})
    assert result["type"] is FlowResultType.CREATE_ENTRY
    assert result["data"] == _remote_data(server)
    assert result["title"] == server.served_name
    entry = result["result"]
    await hass.async_block_till_done()
    assert entry.state is ConfigEntryState.LOADED
    entities = er.async_entries_for_config_entry(er.async_get(hass), entry.entry_id)
    assert sorted({e.domain for e in entities}) == ["ai_task", "conversation", "sensor"]
    # No engine in this process: the backend is the server.
    assert type(entry.runtime_data.backend).__name__ == "RemoteBackend"

    # Reconfigure: a wrong key is refused, the right one saved.
    result = await hass.config_entries.flow.async_init(
        DOMAIN,
        context={"source": config_entries.SOURCE_RECONFIGURE, "entry_id": entry.entry_id},
    )
    assert result["step_id"] == "server"
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], {"url": server.url, "api_key": "nope", "timeout": 30}
    )
    assert result["errors"] == {"base": "invalid_auth"}
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], {"url": server.url, "api_key": API_KEY, "timeout": 12}
    )
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], {"model": server.served_name}
    )
    assert result["type"] is FlowResultType.ABORT
    assert result["reason"] == "reconfigure_successful"
    await hass.async_block_till_done()
    assert entry.data["timeout"] == 12
    assert entry.state is ConfigEntryState.LOADED
    assert await hass.config_entries.async_unload(entry.entry_id)


async def test_a_model_that_cannot_chat_is_a_form_error(
    hass: HomeAssistant, ha_core: None, tiny_model_dir: Path
) -> None:
    # A context too short for any chat request: the server refuses the one-token test.
    cramped = ServerProcess(tiny_model_dir, "--max-model-len", "4")
    cramped.start()
    try:
        result = await _start_server_flow(hass)
        result = await hass.config_entries.flow.async_configure(
            result["flow_id"], {"url": cramped.url, "timeout": 30}
        )
        assert result["step_id"] == "server_model"
        result = await hass.config_entries.flow.async_configure(
            result["flow_id"], {"model": cramped.served_name}
        )
    finally:
        cramped.stop()
    assert result["type"] is FlowResultType.FORM
    assert result["errors"] == {"base": "model_cannot_chat"}
    assert result["description_placeholders"]["reason"]


@contextlib.contextmanager
def _bodies_sent(entry: MockConfigEntry) -> Iterator[list[dict[str, Any]]]:
    """The chat request bodies the entry's client sends to the server, meanwhile."""
    client = entry.runtime_data.backend.client
    bodies: list[dict[str, Any]] = []
    real_stream = client.stream_chat

    def recorded(body: dict[str, Any]) -> Any:
        bodies.append(dict(body))
        return real_stream(body)

    with patch.object(client, "stream_chat", recorded):
        yield bodies


async def test_conversation_task_actions_and_sensors_through_the_server(
    hass: HomeAssistant, remote_entry: MockConfigEntry
) -> None:
    entry = remote_entry
    agent = _agent(hass, entry, "conversation")
    result = await conversation.async_converse(hass, "Hello there", None, Context(), agent_id=agent)
    assert result.response.response_type is not conversation.intent.IntentResponseType.ERROR
    speech = result.response.speech["plain"]["speech"]
    assert speech.strip()

    task = await ai_task.async_generate_data(
        hass, task_name="hi", entity_id=_agent(hass, entry, "ai_task_data"), instructions="Hi"
    )
    assert isinstance(task.data, str)
    assert task.data.strip()

    response = await hass.services.async_call(
        DOMAIN,
        "generate",
        {"prompt": "Name a colour", "priority": "background", "max_tokens": 4},
        blocking=True,
        return_response=True,
    )
    assert response is not None
    assert 1 <= response["completion_tokens"] <= 4
    assert response["prompt_tokens"] > 3
    assert response["text"]

    with _bodies_sent(entry) as bodies:
        summary = await hass.services.async_call(
            DOMAIN,
            "summarize",
            {"text": "The heating ran all night. " * 20, "max_tokens": 6},
            blocking=True,
            return_response=True,
        )
    assert summary is not None
    assert summary["chunks"] == 1
    assert summary["requests"] == 1
    # The summary's repetition penalty reaches the server, as vLLM names it.
    assert [body.get("repetition_penalty") for body in bodies] == [
        DEFAULT_SUMMARY_REPETITION_PENALTY
    ]

    # The server refuses what the engine refuses, and the error says so.
    with pytest.raises(ServiceValidationError) as err:
        await hass.services.async_call(
            DOMAIN,
            "generate",
            {"prompt": "word " * 5000, "max_tokens": 4},
            blocking=True,
            return_response=True,
        )
    assert err.value.translation_key == "server_rejected"

    # Sensors: the server's /metrics (vLLM's names) and this side's own timings.
    await entry.runtime_data.coordinator.async_refresh()
    await hass.async_block_till_done()
    assert _sensor(hass, entry, "running_requests") == "0"
    assert _sensor(hass, entry, "waiting_requests") == "0"
    assert _sensor(hass, entry, "kv_blocks_used") == "0"
    assert float(_sensor(hass, entry, "kv_cache_usage")) == 0.0
    assert float(_sensor(hass, entry, "time_to_first_token_p95")) > 0
    assert float(_sensor(hass, entry, "queue_wait_p95")) >= 0
    assert float(_sensor(hass, entry, "prefix_cache_hit_rate")) >= 0
    snapshot = entry.runtime_data.backend.metrics()
    assert snapshot.generation_tokens_total >= 4

    # Diagnostics: the server's figures and metrics, never its key.
    diagnostics = await async_get_config_entry_diagnostics(hass, entry)
    assert diagnostics["entry"]["data"]["api_key"] == "**REDACTED**"
    assert API_KEY not in str(diagnostics)
    assert diagnostics["engine"]["backend"] == "remote"
    assert diagnostics["engine"]["reachable"] is True
    assert diagnostics["engine"]["server_metrics"] is True
    assert diagnostics["engine"]["metrics"]["generation_tokens_total"] >= 4
    assert snapshot.kv_blocks_total > 0
    assert snapshot.prompt_tokens_total > 0


@pytest.fixture
def own_server(tiny_model_dir: Path, request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
    """A server for one test, which may stop it, restart it or change its key.

    Parametrized indirectly, its value is more arguments for ``paged-llm serve``.
    """
    server = ServerProcess(tiny_model_dir, *getattr(request, "param", ()), api_key=API_KEY)
    server.start()
    yield server
    server.stop()


@pytest.fixture
async def own_entry(
    hass: HomeAssistant,
    ha_core: None,
    own_server: ServerProcess,
    conversation_options: dict[str, Any],
    ai_task_options: dict[str, Any],
) -> AsyncGenerator[MockConfigEntry]:
    """An entry set up against the test's own server; unloaded afterwards if still loaded."""
    entry = _entry(hass, own_server, conversation_options, ai_task_options)
    assert await hass.config_entries.async_setup(entry.entry_id)
    await hass.async_block_till_done(wait_background_tasks=True)  # and the agent's warm-up
    yield entry
    if entry.state is ConfigEntryState.LOADED:
        assert await hass.config_entries.async_unload(entry.entry_id)
        await hass.async_block_till_done()


def _ours(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    """This integration's log lines at ``level`` and above."""
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= level and r.name.startswith("custom_components.paged_llm")
    ]


async def test_assist_tools_reach_the_server_with_the_home_grammar_beside_them(
    hass: HomeAssistant, small_home: None, remote_entry: MockConfigEntry
) -> None:
    """The model is shown Home Assistant's tools; tool_grammar holds them to the home."""
    entry = remote_entry
    subentry = next(s for s in entry.subentries.values() if s.subentry_type == "conversation")
    hass.config_entries.async_update_subentry(
        entry, subentry, data={**subentry.data, CONF_LLM_HASS_API: [llm.LLM_API_ASSIST]}
    )
    await hass.async_block_till_done()
    with _bodies_sent(entry) as bodies:
        result = await conversation.async_converse(
            hass,
            "Turn on the desk lamp",
            None,
            Context(),
            agent_id=_agent(hass, entry, "conversation"),
        )
    assert result.response.response_type is not conversation.intent.IntentResponseType.ERROR
    # The conversation's own request (the agent's prefix warm-up may be among them).
    body = next(b for b in bodies if b["messages"][-1]["content"] == "Turn on the desk lamp")
    shown = {tool["function"]["name"]: tool["function"] for tool in body["tools"]}
    held = {tool["function"]["name"]: tool["function"] for tool in body["tool_grammar"]}
    assert held.keys() == shown.keys()
    turn_on = next(name for name in held if name.endswith("HassTurnOn"))
    names = list(async_get_home(hass, "conversation").names)
    assert held[turn_on]["parameters"]["properties"]["name"]["enum"] == names
    assert "enum" not in shown[turn_on]["parameters"]["properties"]["name"]
    # A voice agent asks a template with a reasoning switch not to think.
    assert body["chat_template_kwargs"] == {"enable_thinking": False}


async def test_the_prompt_budget_is_the_servers_count_of_the_prompt(
    hass: HomeAssistant, small_home: None, remote_entry: MockConfigEntry, tiny_model_dir: Path
) -> None:
    """The agent's prompt sensor shows the server's usage.prompt_tokens, which is the model's
    tokenizer's count of the prompt sent; this server cuts nothing, so nothing is flagged."""
    from transformers import AutoTokenizer

    entry = remote_entry
    subentry = next(s for s in entry.subentries.values() if s.subentry_type == "conversation")
    # Instructions no earlier test sent: the server reads the prompt cold, giving a speed.
    options = {
        CONF_LLM_HASS_API: [llm.LLM_API_ASSIST],
        CONF_PROMPT: f"Session {uuid.uuid4().hex}. {llm.DEFAULT_INSTRUCTIONS_PROMPT}",
    }
    with _bodies_sent(entry) as bodies:
        hass.config_entries.async_update_subentry(
            entry, subentry, data={**subentry.data, **options}
        )
        await hass.async_block_till_done(wait_background_tasks=True)
    # The warm-up, cold and then cached: one token each, the same prompt.
    assert [body["max_tokens"] for body in bodies] == [1, 1]
    assert bodies[0]["messages"] == bodies[1]["messages"]
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    # The model's template shows no tools, so the server writes Assist's into the prompt.
    assert not template_shows_tools(template_source(tokenizer.chat_template))
    assert bodies[0]["tools"]
    prompt_ids = tokenizer.apply_chat_template(
        tools_as_text(bodies[0]["messages"], bodies[0]["tools"]),
        add_generation_prompt=True,
        tokenize=True,
        return_dict=True,
        **bodies[0]["chat_template_kwargs"],
    )["input_ids"]

    state = hass.states.get(_entity_id(hass, "sensor", f"{subentry.subentry_id}_prompt_tokens"))
    assert state is not None
    assert int(state.state) == len(prompt_ids)
    attributes = state.attributes
    assert attributes["server_prompt_tokens"] == len(prompt_ids)
    # Counted before sending through the server's /tokenize, which renders the same way.
    assert attributes["counted_exactly"] is True
    assert attributes["counted_tokens"] == len(prompt_ids)
    assert attributes["truncated"] is False
    assert attributes["context_size"] == entry.runtime_data.backend.context_size
    assert attributes["exposed_entities"] == 3
    assert attributes["first_token_uncached_s"] > 0
    assert attributes["first_token_cached_s"] > 0
    issues = ir.async_get(hass).issues
    assert not [key for key in issues if key[0] == DOMAIN]


@pytest.mark.parametrize("own_server", [("--max-model-len", "256")], indirect=True)
async def test_a_prompt_beyond_the_servers_context_is_a_repair_and_is_not_sent(
    hass: HomeAssistant, small_home: None, own_entry: MockConfigEntry
) -> None:
    """Counted exactly through the server's /tokenize, a prompt over its 256-token context
    is never sent (the server would refuse it); the repair says so, and goes with the entry."""
    entry = own_entry
    subentry = next(s for s in entry.subentries.values() if s.subentry_type == "conversation")
    issue_id = f"prompt_too_long_{subentry.subentry_id}"
    assert ir.async_get(hass).async_get_issue(DOMAIN, issue_id) is None  # no tools yet: fits
    with _bodies_sent(entry) as bodies:
        hass.config_entries.async_update_subentry(
            entry, subentry, data={**subentry.data, CONF_LLM_HASS_API: [llm.LLM_API_ASSIST]}
        )
        await hass.async_block_till_done(wait_background_tasks=True)
    assert bodies == []
    state = hass.states.get(_entity_id(hass, "sensor", f"{subentry.subentry_id}_prompt_tokens"))
    assert state is not None
    assert state.attributes["counted_exactly"] is True
    assert state.attributes["context_size"] == 256
    assert state.attributes["server_prompt_tokens"] is None  # nothing was sent
    assert int(state.state) > 256
    issue = ir.async_get(hass).async_get_issue(DOMAIN, issue_id)
    assert issue is not None
    assert issue.translation_placeholders is not None
    assert issue.translation_placeholders["tokens"] == state.state
    assert issue.translation_placeholders["context"] == "256"
    assert issue.translation_placeholders["entities"] == "3"
    assert await hass.config_entries.async_unload(entry.entry_id)
    await hass.async_block_till_done()
    assert ir.async_get(hass).async_get_issue(DOMAIN, issue_id) is None


async def test_server_stopped_and_restarted_under_home_assistant(
    hass: HomeAssistant,
    own_server: ServerProcess,
    own_entry: MockConfigEntry,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An outage, the restarted server's loading window, and the recovery, as a user sees
    them: the entities follow the server's /health, Assist names the cause in plain words,
    and the log has one warning per outage and one info line when it serves again."""
    server, entry = own_server, own_entry
    coordinator = entry.runtime_data.coordinator
    agent = _agent(hass, entry, "conversation")
    assert hass.states.get(agent).state != STATE_UNAVAILABLE

    # The outage: unavailable entities, the state sensor reads "unloaded", one warning.
    server.stop()
    caplog.clear()
    for _ in range(3):
        await coordinator.async_refresh()
    await hass.async_block_till_done()
    assert _sensor(hass, entry, "running_requests") == STATE_UNAVAILABLE
    assert _sensor(hass, entry, "engine_state") == "unloaded"
    assert hass.states.get(agent).state == STATE_UNAVAILABLE
    assert len(_ours(caplog, logging.WARNING)) == 1, _ours(caplog, logging.WARNING)
    assert not _ours(caplog, logging.ERROR)
    with pytest.raises(HomeAssistantError) as err:
        await hass.services.async_call(
            DOMAIN, "generate", {"prompt": "Hi"}, blocking=True, return_response=True
        )
    assert err.value.translation_key == "server_unreachable"
    spoken = str(err.value)
    assert server.url in spoken
    assert "is it running?" in spoken
    assert "ssl" not in spoken
    assert "Connect call failed" not in spoken

    # The restart: the server answers while it loads, and says so; nothing is available
    # until its /health says ready, and the error says loading, not a full queue.
    server.launch()
    assert await becomes_true(lambda: server.health_status() == 503, 60)
    caplog.clear()
    await coordinator.async_refresh()
    await hass.async_block_till_done()
    assert _sensor(hass, entry, "engine_state") == "loading"
    assert _sensor(hass, entry, "running_requests") == STATE_UNAVAILABLE
    assert hass.states.get(agent).state == STATE_UNAVAILABLE
    with pytest.raises(HomeAssistantError) as err:
        await hass.services.async_call(
            DOMAIN, "generate", {"prompt": "Hi"}, blocking=True, return_response=True
        )
    assert err.value.translation_key == "server_loading", str(err.value)
    assert "loading its model" in str(err.value)
    assert "queue" not in str(err.value)
    assert not _ours(caplog, logging.WARNING)  # still the same outage

    # The recovery: one info line, everything available again, requests answered.
    server.wait_until_healthy()
    await coordinator.async_refresh()
    await hass.async_block_till_done()
    assert _sensor(hass, entry, "running_requests") == "0"
    assert _sensor(hass, entry, "engine_state") == "idle"
    assert hass.states.get(agent).state != STATE_UNAVAILABLE
    assert [m for m in _ours(caplog, logging.INFO) if "serves again" in m]
    assert not _ours(caplog, logging.WARNING)
    await _generate_a_token(hass)
    assert await hass.config_entries.async_unload(entry.entry_id)


async def test_without_torch_the_server_choice_still_works(
    hass: HomeAssistant, ha_core: None, server: ServerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    # torch cannot be imported at all. The engine is offered (it needs no torch for a GGUF
    # model on the CPU); the server is chosen instead and works.
    monkeypatch.setitem(sys.modules, "torch", None)
    assert {"torch>=2.9", "transformers<6,>=5.0"} <= set(extra_requirements("engine"))
    result = await hass.config_entries.flow.async_init(
        DOMAIN, context={"source": config_entries.SOURCE_USER}
    )
    assert result["errors"] == {}
    assert result["data_schema"].schema["backend"].config["options"] == ["embedded", "remote"]
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], {"backend": "remote"}
    )
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], {"url": server.url, "api_key": API_KEY, "timeout": 30}
    )
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], {"model": server.served_name}
    )
    assert result["type"] is FlowResultType.CREATE_ENTRY
    entry = result["result"]
    await hass.async_block_till_done()
    assert entry.state is ConfigEntryState.LOADED
    answer = await conversation.async_converse(
        hass, "Hello", None, Context(), agent_id=_agent(hass, entry, "conversation")
    )
    assert answer.response.speech["plain"]["speech"].strip()
    assert await hass.config_entries.async_unload(entry.entry_id)


async def test_a_server_that_offers_no_models_is_a_form_error(
    hass: HomeAssistant, ha_core: None
) -> None:
    # A real HTTP server that speaks the models endpoint but lists nothing (what an
    # Ollama with no model pulled answers).
    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": []})

    app = web.Application()
    app.router.add_get("/v1/models", models)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    try:
        result = await _start_server_flow(hass)
        result = await hass.config_entries.flow.async_configure(
            result["flow_id"], {"url": f"http://127.0.0.1:{port}", "timeout": 5}
        )
        assert result["type"] is FlowResultType.FORM
        assert result["step_id"] == "server"
        assert result["errors"] == {"base": "no_models"}
        assert str(port) in result["description_placeholders"]["reason"]
    finally:
        await runner.cleanup()


async def test_a_key_the_server_no_longer_takes_is_asked_for_again(
    hass: HomeAssistant, own_server: ServerProcess, own_entry: MockConfigEntry
) -> None:
    """The server's key changes while the entry runs, then at a restart: reauth both times."""
    server, entry = own_server, own_entry
    server.stop()
    server.api_key = "rotated-key"
    server.start()
    await entry.runtime_data.coordinator.async_refresh()
    await hass.async_block_till_done()
    flows = hass.config_entries.flow.async_progress_by_handler(DOMAIN)
    assert [flow["context"]["source"] for flow in flows] == ["reauth"]
    flow_id = flows[0]["flow_id"]
    result = await hass.config_entries.flow.async_configure(flow_id, {"api_key": API_KEY})
    assert result["type"] is FlowResultType.FORM
    assert result["step_id"] == "reauth_confirm"
    assert result["errors"] == {"base": "invalid_auth"}
    result = await hass.config_entries.flow.async_configure(flow_id, {"api_key": " rotated-key "})
    assert result["type"] is FlowResultType.ABORT
    assert result["reason"] == "reauth_successful"
    await hass.async_block_till_done()
    assert entry.data["api_key"] == "rotated-key"
    assert entry.state is ConfigEntryState.LOADED
    await _generate_a_token(hass)

    # A key refused at setup fails the entry and asks as well.
    assert await hass.config_entries.async_unload(entry.entry_id)
    hass.config_entries.async_update_entry(entry, data={**entry.data, "api_key": "old"})
    assert not await hass.config_entries.async_setup(entry.entry_id)
    await hass.async_block_till_done()
    assert entry.state is ConfigEntryState.SETUP_ERROR
    flows = hass.config_entries.flow.async_progress_by_handler(DOMAIN)
    assert [flow["context"]["source"] for flow in flows] == ["reauth"]
    result = await hass.config_entries.flow.async_configure(
        flows[0]["flow_id"], {"api_key": "rotated-key"}
    )
    assert result["reason"] == "reauth_successful"
    await hass.async_block_till_done()
    assert entry.state is ConfigEntryState.LOADED
    assert await hass.config_entries.async_unload(entry.entry_id)


async def test_a_listening_satellite_is_announced_to_the_server(
    hass: HomeAssistant, remote_entry: MockConfigEntry
) -> None:
    """In remote mode the wake word reaches the server's engine as POST /expect_interactive."""
    backend = remote_entry.runtime_data.backend
    assert backend.diagnostics()["takes_voice_announcements"] is None  # not asked yet
    hass.states.async_set("assist_satellite.kitchen", "listening")
    await hass.async_block_till_done()
    # The POST runs in the background.
    await becomes_true(lambda: backend.diagnostics()["takes_voice_announcements"] is not None, 5.0)
    # The server answered 204: a Paged LLM server takes them (vLLM's would not: False).
    assert backend.diagnostics()["takes_voice_announcements"] is True


# ai_task.evaluate through the server: the embedded engine's answers, remotely.


async def test_remote_answers_equal_the_embedded_engines_on_the_same_model(
    hass: HomeAssistant,
    init_integration: MockConfigEntry,
    remote_entry: MockConfigEntry,
    server: ServerProcess,
) -> None:
    embedded = await _evaluate(hass, _agent(hass, init_integration, "ai_task_data"), QUESTIONS)
    remote = await _evaluate(hass, _agent(hass, remote_entry, "ai_task_data"), QUESTIONS)
    for question_id in QUESTIONS:
        here, there = embedded["answers"][question_id], remote["answers"][question_id]
        assert here.keys() == there.keys()
        for key, value in here.items():
            if isinstance(value, dict):
                assert list(value) == list(there[key])
                assert list(value.values()) == pytest.approx(list(there[key].values()), abs=1e-4)
            elif isinstance(value, float | list):
                assert value == pytest.approx(there[key], abs=1e-4), (question_id, key)
            else:
                assert value == there[key]
    # The server read each alternative's tail only: the state came from its prefix cache.
    async with aiohttp.ClientSession() as session:
        headers = {"Authorization": f"Bearer {API_KEY}"}
        async with session.get(f"{server.url}/metrics", headers=headers) as resp:
            metrics = await resp.text()
    hits = [
        float(line.split()[-1])
        for line in metrics.splitlines()
        if line.startswith("vllm:prefix_cache_hits")
    ]
    assert hits
    assert hits[0] > 0


class LogprobsProxy:
    """A server in front of ``target`` whose completions carry no prompt_logprobs.

    It stands for a server that ignores the field (llama.cpp's, Ollama's): everything else
    is the real server's answer. ``strip`` off, it passes them on (a server that can
    evaluate); stopped and started again, it is a server that was away and came back.
    """

    def __init__(self, target: str) -> None:
        """Stand in front of the server at ``target``, on a port of its own."""
        self.target = target
        self.strip = True
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None

    async def _forward(self, request: web.Request) -> web.Response:
        """The target's answer, its prompt log probabilities dropped while ``strip``."""
        assert self._session is not None
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() != "host"}
        async with self._session.request(
            request.method, f"{self.target}{request.path_qs}", data=body, headers=headers
        ) as resp:
            payload = await resp.read()
            if self.strip and request.path == "/v1/completions" and resp.status == 200:
                data = await resp.json()
                for choice in data.get("choices", []):
                    choice.pop("prompt_logprobs", None)
                return web.json_response(data)
            return web.Response(body=payload, status=resp.status, content_type=resp.content_type)

    async def start(self) -> None:
        """Listen (again) on the proxy's port."""
        if self._session is None:
            self._session = aiohttp.ClientSession()
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def stop(self, *, close: bool = False) -> None:
        """Stop listening: the server is away (``close``: for good, the session too)."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if close and self._session is not None:
            await self._session.close()
            self._session = None


async def _proxy_without_prompt_logprobs(target: str) -> AsyncIterator[str]:
    """A :class:`LogprobsProxy` for the time of one ``async for``; yields its URL."""
    proxy = LogprobsProxy(target)
    await proxy.start()
    try:
        yield proxy.url
    finally:
        await proxy.stop(close=True)


async def test_a_server_without_prompt_logprobs_cannot_evaluate_and_says_so(
    hass: HomeAssistant, remote_entry: MockConfigEntry, server: ServerProcess
) -> None:
    backend = remote_entry.runtime_data.backend
    real_root, real_api = backend.client.root, backend.client.api
    async for url in _proxy_without_prompt_logprobs(server.url):
        backend.client.root, backend.client.api = url, f"{url}/v1"
        try:
            with pytest.raises(HomeAssistantError) as caught:
                await _evaluate(hass, _agent(hass, remote_entry, "ai_task_data"), QUESTIONS)
        finally:
            backend.client.root, backend.client.api = real_root, real_api
    assert caught.value.translation_key == "evaluate_unsupported"
    assert "prompt_logprobs" in str(caught.value)
    # The server itself still evaluates.
    query = ScoreQuery([{"role": "user", "content": "Is it on?"}], ["yes", "no"])
    scores = await backend.async_score([query], "automation")
    assert len(scores[0]) == 2
    assert all(score < 0 for score in scores[0])


def _features(hass: HomeAssistant, entity_id: str) -> ai_task.AITaskEntityFeature:
    """The AI task entity's supported features, as its state shows them."""
    state = hass.states.get(entity_id)
    assert state is not None
    return ai_task.AITaskEntityFeature(state.attributes["supported_features"])


def _cannot_evaluate_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The log's lines that say a server cannot evaluate."""
    return [r.getMessage() for r in caplog.records if "cannot evaluate" in r.getMessage()]


async def test_a_server_that_can_evaluate_is_found_so_at_setup(
    hass: HomeAssistant, remote_entry: MockConfigEntry, caplog: pytest.LogCaptureFixture
) -> None:
    """paged-llm serve gives /tokenize's ids and prompt_logprobs: evaluate is offered."""
    entity_id = _agent(hass, remote_entry, "ai_task_data")
    features = _features(hass, entity_id)
    assert ai_task.AITaskEntityFeature.GENERATE_DATA in features
    assert ai_task.AITaskEntityFeature.EVALUATE in features
    diagnostics = remote_entry.runtime_data.backend.diagnostics()
    assert diagnostics["evaluates"] is True
    assert diagnostics["cannot_evaluate_because"] is None
    assert not _cannot_evaluate_lines(caplog)


async def test_a_server_without_prompt_logprobs_is_found_at_setup_and_not_offered_evaluate(
    hass: HomeAssistant,
    ha_core: None,
    server: ServerProcess,
    conversation_options: dict[str, Any],
    ai_task_options: dict[str, Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Asked at setup: no EVALUATE feature, one log line naming the server and why.

    Home Assistant's action refuses it (the feature is missing), the entity itself answers
    with its clear key; after the server was away it is asked again, and one that can
    evaluate now is offered it.
    """
    proxy = LogprobsProxy(server.url)
    await proxy.start()
    entry = _entry(hass, server, conversation_options, ai_task_options)
    hass.config_entries.async_update_entry(entry, data={**entry.data, "url": proxy.url})
    try:
        assert await hass.config_entries.async_setup(entry.entry_id)
        await hass.async_block_till_done(wait_background_tasks=True)
        entity_id = _agent(hass, entry, "ai_task_data")
        features = _features(hass, entity_id)
        assert ai_task.AITaskEntityFeature.GENERATE_DATA in features
        assert ai_task.AITaskEntityFeature.EVALUATE not in features
        lines = _cannot_evaluate_lines(caplog)
        assert len(lines) == 1
        assert proxy.url in lines[0]
        assert "prompt_logprobs" in lines[0]
        diagnostics = entry.runtime_data.backend.diagnostics()
        assert diagnostics["evaluates"] is False
        assert "prompt_logprobs" in diagnostics["cannot_evaluate_because"]

        # The action: Home Assistant refuses an entity without the feature.
        with pytest.raises(ServiceValidationError) as caught:
            await _evaluate(hass, entity_id, QUESTIONS)
        assert caught.value.translation_domain == "ai_task"
        assert caught.value.translation_key == "evaluate_not_supported"
        # Called directly, the entity says this server cannot evaluate.
        entity = hass.data[ai_task.DOMAIN].get_entity(entity_id)
        task = ai_task.EvaluationTask(name="night", questions=QUESTIONS, state={"time": "23:40"})
        with pytest.raises(HomeAssistantError) as caught_here:
            await entity.internal_async_evaluate(task)
        assert caught_here.value.translation_key == "evaluate_unsupported"
        # Polls ask again only after an outage; nothing more is logged.
        coordinator = entry.runtime_data.coordinator
        await coordinator.async_refresh()
        await hass.async_block_till_done()
        assert len(_cannot_evaluate_lines(caplog)) == 1

        # The server goes away and comes back as one that gives prompt log probabilities.
        await proxy.stop()
        await coordinator.async_refresh()
        await hass.async_block_till_done()
        assert hass.states.get(entity_id).state == STATE_UNAVAILABLE
        proxy.strip = False
        await proxy.start()
        await coordinator.async_refresh()
        await hass.async_block_till_done()
        assert ai_task.AITaskEntityFeature.EVALUATE in _features(hass, entity_id)
        result = await _evaluate(hass, entity_id, {"awake": QUESTIONS["awake"]})
        assert 0.0 < result["answers"]["awake"]["noul"] < 1.0
        assert len(_cannot_evaluate_lines(caplog)) == 1
    finally:
        if entry.state is ConfigEntryState.LOADED:
            assert await hass.config_entries.async_unload(entry.entry_id)
            await hass.async_block_till_done()
        await proxy.stop(close=True)
