"""A server subprocess a benchmark talks to over HTTP: started, timed until it serves, stopped.

``llama-server`` (:class:`benchmarks.llama_cpp.LlamaServer`) and ``paged-llm serve``
(:class:`benchmarks.gguf.PagedServer`, and the home benchmark's ``--server`` run) are each
one :class:`ServerProcess`: the same start, health wait, stop and memory figure, so the
two sides of a comparison are measured alike.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO, Self

# Servers between start and stop, for :func:`stop_all`; a lock, as phases run on threads.
_RUNNING: set[ServerProcess] = set()
_RUNNING_LOCK = threading.Lock()


def free_port() -> int:
    """A TCP port nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def peak_rss(pid: int) -> int:
    """A process's peak resident memory (VmHWM) in bytes, 0 when it is gone."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def wait_healthy(process: subprocess.Popen[bytes], url: str, timeout: float) -> None:
    """Poll ``/health`` every 50 ms until it answers 200 (503 means still loading).

    paged-llm keeps serving after its engine failed to start, answering 503 with status
    "failed": that ends the wait at once.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with status {process.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as reply:
                if reply.status == 200:
                    return
        except urllib.error.HTTPError as err:
            body = err.read().decode(errors="replace")
            if '"failed"' in body:
                raise RuntimeError(f"the server failed to load: {body[:1000]}") from None
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"the server was not healthy within {timeout:.0f} s")


class ServerProcess:
    """One server process on ``127.0.0.1:port``, as a context manager.

    Entering starts it and waits for ``/health`` 200, timing that as :attr:`load_s`;
    leaving (on any exception, Ctrl-C included, and when the start itself fails or is
    interrupted) sends SIGTERM and kills it if it has not ended ``stop_seconds`` later.
    Its output goes to ``log_path``, or to a temporary file when none is given: a pipe
    nobody reads fills up (64 KiB) and stalls the server.
    """

    def __init__(
        self,
        name: str,
        command: list[str],
        port: int,
        *,
        env: dict[str, str] | None = None,
        log_path: Path | None = None,
        timeout: float = 600.0,
        stop_seconds: float = 30.0,
    ) -> None:
        """Remember how to start it; :meth:`__enter__` starts it."""
        self.name = name
        self.command = command
        self.port = port
        self.env = env
        self.log_path = log_path
        self.timeout = timeout
        self.stop_seconds = stop_seconds
        self.process: subprocess.Popen[bytes] | None = None
        self.load_s = 0.0
        self._log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        """Base URL of the running server."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def peak_rss(self) -> int:
        """The server's peak resident memory so far."""
        return peak_rss(self.process.pid) if self.process else 0

    def __enter__(self) -> Self:
        """Start the server and time it to its first /health 200, at 50 ms resolution."""
        started = time.monotonic()
        try:
            if self.log_path is not None:
                with self.log_path.open("wb") as log:
                    self.process = self._popen(log)
            else:
                self._log = tempfile.TemporaryFile()  # closed in stop
                self.process = self._popen(self._log)
            with _RUNNING_LOCK:
                _RUNNING.add(self)
            wait_healthy(self.process, self.url, self.timeout)
        except RuntimeError as err:
            tail = self.log_tail()  # read before stop closes a temporary log
            self.stop()
            raise RuntimeError(f"{self.name}: {err}: {tail}") from err
        except BaseException:
            # Ctrl-C while it loads: __exit__ will not run for a failed __enter__.
            self.stop()
            raise
        self.load_s = time.monotonic() - started
        return self

    def _popen(self, log: IO[bytes]) -> subprocess.Popen[bytes]:
        """The process, its output and errors into ``log``."""
        return subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT, env=self.env)

    def __exit__(self, *exc: object) -> None:
        """Stop the server; a failure inside shows the end of a temporary log."""
        if exc[0] is not None and exc[0] is not KeyboardInterrupt and self.log_path is None:
            # A log file stays for reading; a temporary one is gone once stopped.
            print(f"{self.name} log, last lines:\n{self.log_tail()}", file=sys.stderr)
        self.stop()

    def stop(self) -> None:
        """SIGTERM (no request is running, so it stops at once), then kill after a while."""
        with _RUNNING_LOCK:
            _RUNNING.discard(self)
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=self.stop_seconds)
            except subprocess.TimeoutExpired:
                # Seen once: a llama-server that ignored SIGTERM after its last request.
                print(
                    f"{self.name} ignored SIGTERM for {self.stop_seconds:.0f} s: killed",
                    file=sys.stderr,
                )
                self.process.kill()
                self.process.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def log_text(self) -> str:
        """The server's output so far (also after it stopped, when it went to ``log_path``)."""
        if self.log_path is not None:
            return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        if self._log is None:
            return ""
        self._log.seek(0)
        return self._log.read().decode(errors="replace")

    def log_tail(self, size: int = 2000) -> str:
        """The last ``size`` characters of the server's output."""
        return self.log_text()[-size:]


def stop_all() -> None:
    """Stop every server still running.

    A Ctrl-C reaches the main thread only; a server that a phase's own thread started
    (:func:`benchmarks.machine.in_own_thread`) would run on until that phase ended.
    """
    with _RUNNING_LOCK:
        running = list(_RUNNING)
    for server in running:
        server.stop()
