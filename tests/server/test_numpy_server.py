"""A real ``paged-llm serve`` on the bundled model, on the numpy runner, with torch blocked.

The server process starts through a wrapper that makes torch, transformers, triton,
xgrammar and accelerate unimportable before the command line runs, and writes at exit
which of them were imported anyway. It answers a chat, a tool call, a JSON-schema answer
and a summary-sized prompt, and a client that disconnects mid-stream leaves no KV block in
use; then it stops cleanly having imported none of them.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_socket

from tests.helpers.without_torch import ROOT, blocking_entry_point

pytestmark = pytest.mark.slow

# The server's own entry point, run with torch's kin blocked (tests/helpers/without_torch.py).
MAIN = "from paged_llm.server.cli import main\n\nsys.exit(main(sys.argv[1:]))\n"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "turn_on_light",
            "description": "Turn on the light in an area",
            "parameters": {
                "type": "object",
                "properties": {"area": {"type": "string"}},
                "required": ["area"],
            },
        },
    }
]


class Server:
    """The wrapped server process and its address."""

    def __init__(self, process: subprocess.Popen[bytes], url: str, log: Path) -> None:
        """Keep what the test talks to."""
        self.process, self.url, self.log = process, url, log

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST JSON, return the JSON answer."""
        request = urllib.request.Request(
            self.url + path,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=300) as response:
            answer: dict[str, Any] = json.loads(response.read())
            return answer

    def metric(self, name: str) -> float:
        """One unlabelled Prometheus figure."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=30) as response:
            text = response.read().decode()
        match = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.MULTILINE)
        assert match, f"{name} not in /metrics"
        return float(match.group(1))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The wrapped server on the numpy runner, stopped with SIGTERM afterwards."""
    pytest_socket.enable_socket()
    folder = tmp_path_factory.mktemp("numpy-server")
    log = folder / "server.log"
    entry = blocking_entry_point(folder / "paged-llm", folder / "imported-at-exit.json", MAIN)
    command = [
        str(entry), "serve", "--device", "cpu",
        "--runner", "numpy", "--kv-budget", "64MiB", "--port", "0", "--no-auth",
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "PAGED_LLM_API_KEY"}
    env["HF_HUB_OFFLINE"] = "1"
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    deadline = time.monotonic() + 180
    url = None
    while time.monotonic() < deadline:
        assert process.poll() is None, log.read_text()
        match = re.search(r"listening on (http://\S+)", log.read_text(errors="replace"))
        if match:
            url = match.group(1)
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
        time.sleep(0.2)
    else:
        process.kill()
        raise AssertionError(log.read_text())
    assert url is not None
    yield Server(process, url, log)
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        process.wait(60)


def test_chat_tools_schema_summary_and_abort_without_torch(server: Server) -> None:
    chat = server.post(
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 16},
    )
    assert chat["choices"][0]["message"]["content"]

    tool = server.post(
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "Turn on the kitchen light."}],
            "tools": TOOLS,
            "tool_choice": "required",
            "max_tokens": 64,
        },
    )
    calls = tool["choices"][0]["message"]["tool_calls"]
    assert calls[0]["function"]["name"] == "turn_on_light"
    assert "area" in json.loads(calls[0]["function"]["arguments"])

    schema = {"type": "object", "properties": {"on": {"type": "boolean"}}, "required": ["on"]}
    structured = server.post(
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "Is the heating on?"}],
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "answer", "schema": schema},
            },
            "max_tokens": 32,
        },
    )
    assert isinstance(json.loads(structured["choices"][0]["message"]["content"])["on"], bool)

    document = " ".join(
        f"Day {i}: the heating ran for {i % 7 + 1} hours and the lights were on in the "
        f"kitchen and the living room."
        for i in range(60)
    )
    summary = server.post(
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": f"Summarize this log:\n{document}"}],
            "max_tokens": 32,
            "priority": 10,
        },
    )
    assert summary["usage"]["prompt_tokens"] > 1000
    assert summary["choices"][0]["message"]["content"]

    # A streaming client that goes away after its first event: its request is aborted.
    parts = urllib.parse.urlsplit(server.url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    body = {
        "messages": [{"role": "user", "content": "Write a long story about a robot."}],
        "max_tokens": 400,
        "stream": True,
    }
    connection.request(
        "POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"}
    )
    response = connection.getresponse()
    assert response.status == 200
    assert response.readline()  # the first event
    connection.close()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if server.metric("paged_llm:kv_blocks_used") == 0 and (
            server.metric("vllm:num_requests_running") == 0
        ):
            break
        time.sleep(0.2)
    else:
        raise AssertionError("the aborted request's blocks are still in use")

    server.process.send_signal(signal.SIGTERM)
    assert server.process.wait(60) == 0
    log = server.log.read_text(errors="replace")
    assert json.loads(server.log.with_name("imported-at-exit.json").read_text()) == [], log[-3000:]
