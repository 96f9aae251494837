"""The server's response_format and tool_choice, spoken to with the official OpenAI client."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import pytest_asyncio
from aiohttp import web

from paged_llm.engine.config import EngineConfig
from paged_llm.server.app import make_app
from paged_llm.server.host import EngineHost
from paged_llm.server.settings import ServerSettings

SCHEMA = {
    "type": "object",
    "properties": {
        "on": {"type": "boolean"},
        "mode": {"enum": ["heat", "cool"]},
        "level": {"type": "integer", "minimum": 0, "maximum": 9},
    },
    "required": ["on", "mode", "level"],
}
LIGHT_TOOL = {
    "type": "function",
    "function": {
        "name": "set_light",
        "description": "Sets a light's brightness",
        "parameters": {
            "type": "object",
            "properties": {
                "room": {"enum": ["hall", "kitchen"]},
                "level": {"type": "integer", "minimum": 0, "maximum": 9},
            },
            "required": ["room", "level"],
        },
    },
}
FAN_TOOL = {
    "type": "function",
    "function": {
        "name": "fan_on",
        "parameters": {"type": "object", "properties": {"fast": {"type": "boolean"}}},
    },
}
MESSAGES: Any = [{"role": "user", "content": "Set things up for the evening"}]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[openai.AsyncOpenAI]:
    """A real server over the tiny model, and an OpenAI client for it.

    It listens on a Unix socket: the Home Assistant test plugin blocks TCP sockets.
    """
    config = EngineConfig(
        model=str(tiny_model_dir), device="cpu", dtype="float32", kv_budget=8 * 2**20
    )
    host = EngineHost(config, served_name="tiny")
    await host.start()
    runner = web.AppRunner(make_app(host, ServerSettings(host="127.0.0.1", port=0)))
    await runner.setup()
    path = str(tmp_path_factory.mktemp("server") / "api.sock")
    await web.UnixSite(runner, path).start()
    transport = httpx.AsyncHTTPTransport(uds=path)
    async with openai.AsyncOpenAI(
        base_url="http://localhost/v1",
        api_key="-",
        http_client=httpx.AsyncClient(transport=transport),
    ) as oa:
        yield oa
    await runner.cleanup()
    await host.stop()


pytestmark = pytest.mark.asyncio(loop_scope="module")


async def test_response_format_json_schema_gives_json_that_fits(client) -> None:
    response = await client.chat.completions.create(
        model="tiny",
        messages=MESSAGES,
        max_tokens=40,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA}},
    )
    choice = response.choices[0]
    data = json.loads(choice.message.content or "")
    assert isinstance(data["on"], bool)
    assert data["mode"] in {"heat", "cool"}
    assert 0 <= data["level"] <= 9
    assert choice.finish_reason == "stop"


async def test_response_format_json_object_starts_an_object(client) -> None:
    response = await client.chat.completions.create(
        model="tiny",
        messages=MESSAGES,
        max_tokens=24,
        temperature=0,
        response_format={"type": "json_object"},
    )
    choice = response.choices[0]
    text = choice.message.content or ""
    assert text.startswith("{")
    if choice.finish_reason == "stop":
        assert isinstance(json.loads(text), dict)


@pytest.mark.parametrize(
    ("tool_choice", "names"),
    [
        ("required", {"set_light", "fan_on"}),
        ({"type": "function", "function": {"name": "set_light"}}, {"set_light"}),
    ],
)
async def test_tool_choice_forces_a_call_of_an_offered_tool_with_fitting_arguments(
    client, tool_choice, names
) -> None:
    response = await client.chat.completions.create(
        model="tiny",
        messages=MESSAGES,
        max_tokens=64,
        temperature=0,
        tools=[LIGHT_TOOL, FAN_TOOL],
        tool_choice=tool_choice,
    )
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls
    for call in choice.message.tool_calls:
        assert call.function.name in names
        args = json.loads(call.function.arguments)
        if call.function.name == "set_light":
            assert args["room"] in {"hall", "kitchen"}
            assert 0 <= args["level"] <= 9
        else:
            assert set(args) <= {"fast"}


async def test_a_schema_the_engine_cannot_enforce_is_a_400_naming_response_format(
    client,
) -> None:
    bad = {"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}
    with pytest.raises(openai.BadRequestError) as err:
        await client.chat.completions.create(
            model="tiny",
            messages=MESSAGES,
            max_tokens=8,
            response_format={"type": "json_schema", "json_schema": {"name": "b", "schema": bad}},
        )
    assert err.value.body["param"] == "response_format"  # type: ignore[index]
    assert "json_schema cannot be enforced" in str(err.value)
    # The server keeps serving.
    ok = await client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=3)
    assert ok.choices[0].finish_reason in {"stop", "length"}
