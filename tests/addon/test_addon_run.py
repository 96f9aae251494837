"""The add-on's run script outside a container: downloads, the port, watching the server,
and a real `paged-llm serve` announced to a stand-in Supervisor."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from paged_llm_addon import run
from paged_llm_addon.command import Plan
from paged_llm_addon.model import DownloadProgress, Model, download
from paged_llm_addon.options import AddonError
from paged_llm_addon.supervisor import SERVICE, Supervisor, SupervisorError
from tests.helpers.remote_server import free_port

ROOT = Path(__file__).resolve().parents[2]
PLAN = Plan(["paged-llm", "serve"], {}, 8000, "tiny", "key", "serving tiny")


class FakeChild:
    """A server process that exits when told to, or with ``code`` after ``polls`` polls."""

    def __init__(self, code: int | None = None, polls: int = 0) -> None:
        self.code, self.polls = code, polls

    def poll(self) -> int | None:
        self.polls -= 1
        return self.code if self.polls < 0 else None

    def terminate(self) -> None:
        self.code, self.polls = -15, 0

    def wait(self, timeout: float | None = None) -> int:
        return self.code or 0


def watched(
    states: list[tuple[str | None, str]],
    child: FakeChild,
    monkeypatch: pytest.MonkeyPatch,
    stopping: bool = False,
) -> tuple[int, list[str], list[Plan]]:
    """Run watch() over /health answers in turn; its exit status, lines and announcements."""
    monkeypatch.setattr(run.time, "sleep", lambda seconds: None)
    lines: list[str] = []
    monkeypatch.setattr(run, "say", lines.append)
    answers = iter(states)
    announced: list[Plan] = []
    code = run.watch(
        child,  # type: ignore[arg-type]
        PLAN,
        announced.append,
        lambda: stopping,
        lambda port: next(answers),
    )
    return code, lines, announced


def test_the_server_is_announced_once_when_it_serves(monkeypatch: pytest.MonkeyPatch) -> None:
    states = [(None, ""), ("loading", "loading"), ("ok", ""), ("ok", ""), ("ok", "")]
    code, lines, announced = watched(states, FakeChild(0, polls=5), monkeypatch)
    assert code == 0
    assert announced == [PLAN]
    assert lines == ["ready: tiny answers on port 8000"]


def test_a_model_the_engine_refuses_ends_the_add_on_with_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    child = FakeChild(polls=10)
    states = [("loading", "loading"), ("failed", "ModelLoadError: not a GGUF file")]
    code, lines, announced = watched(states, child, monkeypatch)
    assert code == 1
    assert lines == ["error: the model could not be loaded: ModelLoadError: not a GGUF file"]
    assert child.code == -15  # stopped, not left running
    assert not announced


def test_an_engine_that_fails_while_serving_ends_the_add_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    states = [("ok", ""), ("failed", "RuntimeError: out of memory")]
    code, lines, announced = watched(states, FakeChild(polls=10), monkeypatch)
    assert code == 1
    assert lines[-1] == "error: the engine stopped: RuntimeError: out of memory"
    assert announced == [PLAN]


def test_a_server_that_exits_ends_the_add_on_with_its_status(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    code, lines, _ = watched([(None, "")], FakeChild(1, polls=1), monkeypatch)
    assert (code, lines) == (1, ["error: paged-llm serve stopped with exit status 1"])
    # Stopped by the Supervisor: the server drains and exits; no error.
    code, lines, _ = watched([("stopping", "")], FakeChild(0, polls=1), monkeypatch, True)
    assert (code, lines) == (0, [])


@pytest.mark.usefixtures("socket_enabled")
def test_a_port_another_program_holds_is_refused() -> None:
    with socket.socket() as holder:
        holder.bind(("0.0.0.0", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(AddonError) as err:
            run.check_port_free(port)
    assert str(err.value).startswith(f"port {port} is taken by another program (")
    run.check_port_free(port)  # free again


def _hub_folder(cache: Path, hub_id: str) -> Path:
    """A snapshot as huggingface_hub leaves one: config and weights in the cache."""
    folder = cache / f"models--{hub_id.replace('/', '--')}" / "snapshots" / "abc"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(bytes(3 * 2**20))
    return folder


def test_a_hub_model_is_downloaded_with_progress_then_served_by_its_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import huggingface_hub

    class Sibling:
        def __init__(self, name: str, size: int) -> None:
            self.rfilename, self.size = name, size

    class Api:
        def model_info(self, hub_id: str, files_metadata: bool) -> Any:
            names = [("config.json", 2), ("model.safetensors", 3 * 2**20), ("model.onnx", 9)]
            return type("Info", (), {"siblings": [Sibling(*n) for n in names]})

    def snapshot(hub_id: str, cache_dir: Path, allow_patterns: list[str], **kw: Any) -> str:
        assert "*.safetensors" in allow_patterns
        assert "*.onnx" not in allow_patterns
        return str(_hub_folder(cache_dir, hub_id))

    monkeypatch.setattr(huggingface_hub, "HfApi", Api)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot)
    lines: list[str] = []
    model = download(
        Model("Qwen/Qwen3-0.6B", "Qwen/Qwen3-0.6B", hub_id="Qwen/Qwen3-0.6B"),
        tmp_path,
        lines.append,
    )
    assert model.name == "Qwen/Qwen3-0.6B"
    assert model.source.endswith("snapshots/abc")
    assert model.size == 3 * 2**20
    assert model.hub_id is None
    assert lines == [
        "downloading Qwen/Qwen3-0.6B from Hugging Face: 2 files, 3 MiB",
        "downloaded Qwen/Qwen3-0.6B: 3 MiB",
    ]


def test_without_the_hub_a_copy_fetched_before_serves_or_one_line_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import huggingface_hub

    class Offline:
        def model_info(self, hub_id: str, files_metadata: bool) -> Any:
            raise OSError("Cannot reach https://huggingface.co\nRequest id: 42")

    copies: list[str] = []

    def snapshot(hub_id: str, cache_dir: Path, local_files_only: bool, **kw: Any) -> str:
        assert local_files_only
        if not copies:
            raise FileNotFoundError("no copy in the cache")
        return copies[0]

    monkeypatch.setattr(huggingface_hub, "HfApi", Offline)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot)
    wanted = Model("a/b", "a/b", hub_id="a/b")
    with pytest.raises(AddonError) as err:
        download(wanted, tmp_path, print)
    assert str(err.value) == (
        "model a/b could not be downloaded from Hugging Face: Cannot reach https://huggingface.co"
    )
    copies.append(str(_hub_folder(tmp_path, "a/b")))
    lines: list[str] = []
    assert download(wanted, tmp_path, lines.append).source == copies[0]
    assert lines == [
        "Hugging Face cannot be reached (Cannot reach https://huggingface.co): "
        "using the copy fetched before"
    ]


def test_download_progress_says_how_far_it_got(tmp_path: Path) -> None:
    lines: list[str] = []
    with DownloadProgress("a/b", tmp_path, 4 * 2**20, lines.append, every=0.05):
        (tmp_path / "blob.incomplete").write_bytes(bytes(2**20))
        deadline = time.monotonic() + 10
        while not lines and time.monotonic() < deadline:
            time.sleep(0.01)
    assert lines[0].startswith("downloading a/b: 1 MiB of 4 MiB (25%), ")
    assert lines[-1] == "downloaded a/b: 1 MiB"


class StandInSupervisor(BaseHTTPRequestHandler):
    """The Supervisor's two calls the add-on makes, recorded."""

    calls: ClassVar[list[tuple[str, str, str, Any]]] = []

    def _answer(self, data: dict[str, Any]) -> None:
        body = json.dumps({"result": "ok", "data": data}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self.calls.append(("GET", self.path, self.headers["Authorization"], None))
        self._answer({"hostname": "local-paged-llm"})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.calls.append(("POST", self.path, self.headers["Authorization"], body))
        self._answer({"uuid": "0" * 32})

    def log_message(self, *args: Any) -> None:
        """Quiet."""


@pytest.fixture
def supervisor(socket_enabled: None) -> Iterator[str]:
    """A stand-in Supervisor on a local port; its URL."""
    StandInSupervisor.calls = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), StandInSupervisor)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_the_discovery_message(supervisor: str) -> None:
    assert Supervisor(supervisor, "t").announce(8000, "key", "tiny") == (
        "http://local-paged-llm:8000"
    )
    assert StandInSupervisor.calls == [
        ("GET", "/addons/self/info", "Bearer t", None),
        (
            "POST",
            "/discovery",
            "Bearer t",
            {
                "service": SERVICE,
                "config": {
                    "host": "local-paged-llm",
                    "port": 8000,
                    "api_key": "key",
                    "model": "tiny",
                },
            },
        ),
    ]
    with pytest.raises(SupervisorError, match="/addons/self/info"):
        Supervisor(f"http://127.0.0.1:{free_port()}", "t").announce(8000, "key", "tiny")


def _start(data: Path, options: dict[str, Any], env: dict[str, str]) -> subprocess.Popen[str]:
    """The run script's program over these options, as a process."""
    data.mkdir(parents=True, exist_ok=True)
    (data / "options.json").write_text(json.dumps(options))
    return subprocess.Popen(
        [sys.executable, "-m", "paged_llm_addon"],
        env={
            **os.environ,
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
            "PYTHONPATH": str(ROOT / "addon"),
            "PAGED_LLM_ADDON_DATA": str(data),
            "PAGED_LLM_ADDON_MODELS": str(data / "models"),
            **env,
        },
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_missing_model_stops_the_add_on_with_one_line(tmp_path: Path) -> None:
    process = _start(tmp_path / "data", {"model": "/share/paged_llm/gone.gguf"}, {})
    _, err = process.communicate(timeout=60)
    assert process.returncode == 2
    assert err.splitlines() == [
        f"paged-llm-addon: error: model /share/paged_llm/gone.gguf does not exist "
        f"(put .gguf files in {tmp_path / 'data' / 'models'} or /media)"
    ]


@pytest.mark.usefixtures("socket_enabled")
def test_a_gguf_file_the_engine_refuses_stops_the_add_on(tmp_path: Path) -> None:
    models = tmp_path / "data" / "models"
    models.mkdir(parents=True)
    (models / "broken.gguf").write_bytes(b"not a gguf file at all")
    options = {"model": "broken.gguf", "kv_budget": "8MiB", "port": free_port()}
    process = _start(tmp_path / "data", options, {})
    _, err = process.communicate(timeout=300)
    assert process.returncode == 1, err
    # The reason is the log's last line (this venv's Triton may end a line before it early).
    last = err[err.rindex("paged-llm-addon: error: ") :]
    assert last.startswith("paged-llm-addon: error: the model could not be loaded: GGUF file")
    assert last.endswith(
        "broken.gguf cannot be read: not a GGUF file (no GGUF magic at its start)\n"
    )
    assert last.count("\n") == 1


@pytest.mark.usefixtures("socket_enabled")
def test_without_prebuilt_kernels_or_a_compiler_the_add_on_stops_with_the_reason(
    tmp_path: Path,
) -> None:
    """As in the image when no prebuilt build can be used: there is no compiler to fall back
    on, so the add-on stops with one line naming both instead of serving."""
    # A Python where torch and the kernels wheel are not installed (the image has neither
    # torch nor, in this case, a usable wheel), and a PATH with no C compiler on it.
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    (hidden / "sitecustomize.py").write_text(
        "import sys\nsys.modules.update(torch=None, paged_llm_kernels=None)\n"
    )
    env = {
        "PATH": str(Path(sys.executable).parent),
        "PYTHONPATH": f"{ROOT / 'addon'}{os.pathsep}{hidden}",
        "CC": "",
    }
    process = _start(tmp_path / "data", {"port": free_port()}, env)
    _, err = process.communicate(timeout=300)
    assert process.returncode == 1, err
    last = err.splitlines()[-1]
    assert last.startswith("paged-llm-addon: error: the model could not be loaded: "), err
    assert "the engine's C kernels cannot run here (no prebuilt kernels fit (the " in last
    assert "paged-llm-kernels package is not installed) and there is no C compiler" in last


def test_the_add_on_serves_and_announces_itself_then_stops_cleanly(
    tmp_path: Path, tiny_model_dir: Path, supervisor: str
) -> None:
    port = free_port()
    options = {"model": str(tiny_model_dir), "kv_budget": "8MiB", "threads": 1, "port": port}
    env = {"SUPERVISOR_TOKEN": "token", "PAGED_LLM_ADDON_SUPERVISOR": supervisor}
    process = _start(tmp_path / "data", options, env)
    lines: list[str] = []
    assert process.stderr is not None
    for line in process.stderr:
        lines.append(line.rstrip())
        if line.startswith("paged-llm-addon: announced"):
            break
    assert lines[
        -1
    ] == "paged-llm-addon: announced to Home Assistant as http://local-paged-llm:" + str(port), (
        lines
    )
    assert lines[0].startswith(
        f"paged-llm-addon: serving {tiny_model_dir.name} on port {port}: 1 threads"
    )
    assert any(f"Model {tiny_model_dir.name} ready in" in line for line in lines), lines
    key = (tmp_path / "data" / "api_key").read_text().strip()
    ((_, _, token, body),) = [call for call in StandInSupervisor.calls if call[0] == "POST"]
    assert token == "Bearer token"
    assert body == {
        "service": "paged_llm",
        "config": {
            "host": "local-paged-llm",
            "port": port,
            "api_key": key,
            "model": tiny_model_dir.name,
        },
    }
    process.send_signal(signal.SIGTERM)
    _, rest = process.communicate(timeout=60)
    assert process.returncode == 0, rest
    assert "error" not in rest
