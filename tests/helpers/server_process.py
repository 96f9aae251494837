"""Starting and stopping a real ``paged-llm serve`` process on a free port."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest_socket

API_KEY = "test-key-0123456789"
MODEL = "tiny"
START_TIMEOUT_S = 180.0
ENGINE_ARGS = ("--device", "cpu", "--dtype", "float32", "--kv-budget", "8MiB")


@dataclass
class ServerProcess:
    """A running server: its process, address and log."""

    process: subprocess.Popen[bytes]
    url: str
    log: Path
    api_key: str | None

    @property
    def headers(self) -> dict[str, str]:
        """The authorization header for this server's key."""
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def log_text(self) -> str:
        """Everything the server wrote so far."""
        return self.log.read_text(errors="replace")

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM, wait, and return the exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(
                f"server did not stop in {timeout} s:\n{self.log_text()}"
            ) from None


def start_server(
    model: Path, log: Path, *args: str, api_key: str | None = API_KEY, ready: bool = True
) -> ServerProcess:
    """Start ``python -m paged_llm serve`` on port 0, wait for its address and readiness."""
    # Home Assistant's test plugin blocks sockets before each test; module fixtures run
    # before the per-test fixture below can allow them.
    pytest_socket.enable_socket()
    command = [sys.executable, "-m", "paged_llm", "serve", str(model), *ENGINE_ARGS, "--port", "0"]
    env = {k: v for k, v in os.environ.items() if k != "PAGED_LLM_API_KEY"}
    env["HF_HUB_OFFLINE"] = "1"
    if api_key:
        env["PAGED_LLM_API_KEY"] = api_key  # the key through the environment, as documented
    with log.open("wb") as out:
        process = subprocess.Popen([*command, *args], stdout=out, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + START_TIMEOUT_S
    url = None
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"server exited with {process.returncode}:\n{log.read_text()}")
        match = re.search(r"listening on (http://\S+)", log.read_text(errors="replace"))
        if match:
            url = match.group(1)
            if not ready:
                break
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
                    if response.status == 200:
                        break
            except OSError:  # not listening yet, or busy loading
                pass
        time.sleep(0.2)
    else:
        process.kill()
        raise AssertionError(f"server not ready in {START_TIMEOUT_S} s:\n{log.read_text()}")
    assert url is not None
    return ServerProcess(process, url, log, api_key)
