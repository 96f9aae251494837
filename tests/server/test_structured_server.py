"""The server's response_format and tool_choice, spoken to with the official OpenAI client."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import pytest
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


@pytest.fixture
async def client(tiny_model_dir: Path, socket_enabled: None) -> AsyncIterator[openai.AsyncOpenAI]:
    """A real server on a loopback port over the tiny model, and an OpenAI client for it."""
    config = EngineConfig(
        model=str(tiny_model_dir), device="cpu", dtype="float32", kv_budget=8 * 2**20
    )
    host = EngineHost(config, served_name="tiny")
    await host.start()
    runner = web.AppRunner(make_app(host, ServerSettings(host="127.0.0.1", port=0)))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        async with openai.AsyncOpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key="-", max_retries=0
        ) as oa:
            yield oa
    finally:
        await runner.cleanup()
        await host.stop()


async def test_structured_output_over_the_openai_api(client) -> None:
    """One server for every check: starting the engine dominates the cost."""
    await check_json_schema(client)
    await check_json_object(client)
    await check_tool_choice(client, "required", {"set_light", "fan_on"})
    named = {"type": "function", "function": {"name": "set_light"}}
    await check_tool_choice(client, named, {"set_light"})
    await check_tool_grammar(client)
    await check_bad_schema(client)


async def check_json_schema(client) -> None:
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


async def check_json_object(client) -> None:
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


async def check_tool_choice(client, tool_choice, names) -> None:
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


async def check_tool_grammar(client) -> None:
    """``tool_grammar`` narrows what decoding allows; the prompt's ``tools`` stay as sent."""
    free = {
        "type": "function",
        "function": {
            "name": "set_light",
            "parameters": {
                "type": "object",
                "properties": {"room": {"type": "string"}},
                "required": ["room"],
            },
        },
    }
    room = 'Küche "Ost" ✨ 寝室'
    narrow = {
        "type": "function",
        "function": {
            "name": "set_light",
            "parameters": {
                "type": "object",
                "properties": {"room": {"type": "string", "enum": [room]}},
                "required": ["room"],
            },
        },
    }

    async def forced_arguments(grammar: dict[str, Any]) -> list[dict[str, Any]]:
        """The arguments of set_light's forced calls, shown ``free``, held to ``grammar``."""
        response = await client.chat.completions.create(
            model="tiny",
            messages=MESSAGES,
            max_tokens=128,
            temperature=0,
            tools=[free],
            tool_choice={"type": "function", "function": {"name": "set_light"}},
            extra_body={"tool_grammar": [grammar]},
        )
        calls = response.choices[0].message.tool_calls
        assert calls
        return [json.loads(c.function.arguments) for c in calls]

    assert await forced_arguments(narrow) == [{"room": room}]
    with pytest.raises(openai.BadRequestError) as err:
        await client.chat.completions.create(
            model="tiny",
            messages=MESSAGES,
            max_tokens=8,
            tools=[free],
            extra_body={"tool_grammar": [FAN_TOOL]},
        )
    assert err.value.body["param"] == "tool_grammar"  # type: ignore[index]
    # Narrowed schemas the grammar library refuses fall back to the tools as sent.
    refused = {"type": "function", "function": {**narrow["function"], "parameters": BAD_SCHEMA}}
    assert all(isinstance(args["room"], str) for args in await forced_arguments(refused))


BAD_SCHEMA = {"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}


async def check_bad_schema(client) -> None:
    bad = BAD_SCHEMA
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
