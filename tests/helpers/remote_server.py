"""A real `paged-llm serve` process for tests: started on a fixed port, stopped, restarted."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    """A TCP port nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ServerProcess:
    """``paged-llm serve`` over a model, on 127.0.0.1 and one port across restarts."""

    def __init__(self, model: Path, *args: str, api_key: str | None = None) -> None:
        self.model = model
        self.args = args
        self.api_key = api_key
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.served_name = "tiny"
        self.process: subprocess.Popen[str] | None = None
        self.log: list[str] = []

    def start(self, timeout: float = 120.0) -> None:
        """Start the server and wait until /health answers 200."""
        self.launch()
        self.wait_until_healthy(timeout)

    def launch(self) -> None:
        """Start the process without waiting, so its load can overlap other setup work."""
        command = [
            sys.executable,
            "-m",
            "paged_llm",
            "serve",
            str(self.model),
            "--served-model-name",
            self.served_name,
            "--device",
            "cpu",
            "--dtype",
            "float32",
            "--kv-budget",
            "8MiB",
            "--port",
            str(self.port),
            *self.args,
        ]
        if self.api_key:
            command += ["--api-key", self.api_key]
        env = {**os.environ, "PAGED_LLM_API_KEY": ""}
        self.process = subprocess.Popen(
            command,
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        threading.Thread(target=self._read, args=(self.process,), daemon=True).start()

    def wait_until_healthy(self, timeout: float = 120.0) -> None:
        """Wait until the launched server's /health answers 200; stop it if it never does."""
        assert self.process is not None, "launch() first"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError("paged-llm serve exited:\n" + "\n".join(self.log[-30:]))
            if self.health_status() == 200:
                return
            time.sleep(0.2)
        self.stop()
        raise TimeoutError("paged-llm serve did not become healthy:\n" + "\n".join(self.log))

    def health_status(self) -> int | None:
        """The status /health answers now (None: nothing answers)."""
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as err:
            return int(err.code)
        except OSError:
            return None

    def _read(self, process: subprocess.Popen[str]) -> None:
        """Keep the server's output for failure messages."""
        assert process.stdout is not None
        for line in process.stdout:
            self.log.append(line.rstrip())

    def stop(self) -> None:
        """SIGTERM, as a service manager stops it; SIGKILL if it does not exit."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@contextmanager
def serving(model: Path, api_key: str | None = None) -> Iterator[ServerProcess]:
    """A server over ``model``, healthy when the block starts and stopped when it ends."""
    server = ServerProcess(model, api_key=api_key)
    server.start()
    try:
        yield server
    finally:
        server.stop()
