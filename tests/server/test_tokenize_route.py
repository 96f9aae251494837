"""``POST /tokenize`` (vLLM's): the count a chat completion's usage reports, before sending it."""

from __future__ import annotations

from pathlib import Path

from aiohttp.test_utils import TestClient, TestServer

from paged_llm.client.openai import OpenAIClient, chat_request
from paged_llm.engine.config import EngineConfig
from paged_llm.server.app import make_app
from paged_llm.server.host import EngineHost
from paged_llm.server.settings import ServerSettings

# A template that shows the tools, as real tool-calling models' templates do.
TOOL_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
    "{% if loop.first and tools %}\n# Tools\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}"
    "{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "HassTurnOn",
            "description": "Turns on a device or entity",
            "parameters": {"type": "object", "properties": {"name": {"type": "string"}}},
        },
    }
]
MESSAGES = [
    {"role": "system", "content": "You are a voice assistant for Home Assistant."},
    {"role": "user", "content": "Turn on the porch light"},
]


async def test_tokenize_counts_what_a_chat_completion_reads(
    tiny_model_dir: Path, socket_enabled: None
) -> None:
    config = EngineConfig(model=str(tiny_model_dir), device="cpu", dtype="float32", kv_budget=2**20)
    host = EngineHost(config)
    await host.start()
    host.engine.tokenizer.chat_template = TOOL_TEMPLATE
    client = TestClient(TestServer(make_app(host, ServerSettings(api_key="secret"))))
    await client.start_server()
    remote = OpenAIClient(client.session, str(client.make_url("/v1")), api_key="secret")
    try:
        response = await client.post("/tokenize", json={"prompt": "Hi"})
        assert response.status == 401

        counted = await remote.count_chat_tokens(host.model_name, MESSAGES, tools=TOOLS)
        without_tools = await remote.count_chat_tokens(host.model_name, MESSAGES)
        assert counted is not None
        assert without_tools is not None
        # The template renders the tools, and they are counted.
        assert counted > without_tools + 10
        usage = None
        body = chat_request(host.model_name, MESSAGES, max_tokens=1, tools=TOOLS)
        async for chunk in remote.stream_chat(body):
            usage = chunk.usage or usage
        assert usage is not None
        assert usage.prompt_tokens == counted

        # Text: with the tokenizer's special tokens by default, without when asked.
        text = "the kitchen light turned on at seven"
        tokenizer = host.engine.tokenizer
        response = await client.post(
            "/tokenize",
            json={"prompt": text},
            headers={"Authorization": "Bearer secret"},
        )
        assert response.status == 200
        data = await response.json()
        assert data["tokens"] == tokenizer(text, add_special_tokens=True)["input_ids"]
        assert data["count"] == len(data["tokens"])
        assert data["max_model_len"] == host.max_model_len
        plain = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert await remote.count_tokens(host.model_name, text) == len(plain)

        # Another model is a 404, which the client reads as "no count here".
        assert await remote.count_chat_tokens("other", MESSAGES) is None
    finally:
        await client.close()
        await host.stop()
