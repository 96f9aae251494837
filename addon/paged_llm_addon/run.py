"""The add-on's main program: check everything, fetch the model, run and watch the server.

Whatever cannot work (a model that is not there, a KV budget beyond the memory, a port
another program holds, a GGUF file the engine refuses) ends the add-on with one line
saying why and a non-zero exit status, so the Supervisor shows it stopped and the log's
last line is the reason.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from types import FrameType

from .command import Plan, api_key, build_plan
from .gguf_download import download_gguf
from .model import download, locate_model
from .options import AddonError, Folders, Machine, read_options
from .supervisor import Supervisor, SupervisorError

# How often the server's /health is asked while it loads, and once it serves.
LOADING_POLL_S = 1.0
SERVING_POLL_S = 5.0
# What a stopped server gets to finish its requests before it is killed.
STOP_WAIT_S = 60.0


def say(message: str) -> None:
    """One line in the add-on's log."""
    print(f"paged-llm-addon: {message}", file=sys.stderr, flush=True)


def prepare(folders: Folders, machine: Machine) -> Plan:
    """Check the options, the port and the memory; fetch a Hub model; return the command."""
    options = read_options(folders.data / "options.json")
    model = locate_model(options.model, folders.models)
    build_plan(options, model, machine, folders, "")  # every check before a long download
    check_port_free(options.port)
    if model.hub_id is not None:
        model = download(model, folders.cache / "huggingface" / "hub", say)
    if model.gguf is not None:
        model = download_gguf(model, folders.models, say)
    return build_plan(options, model, machine, folders, api_key(options, folders.data))


def check_port_free(port: int) -> None:
    """Refuse a port another program listens on, before the model spends minutes loading."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # As the server binds: a port left in TIME_WAIT by the last run counts as free.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("0.0.0.0", port))
        except OSError as err:
            raise AddonError(
                f"port {port} is taken by another program ({err.strerror}); "
                "stop it or set the port option to a free port"
            ) from err


def health(port: int) -> tuple[str | None, str]:
    """The server's /health: ("ok", ""), (state, detail) while it cannot serve, or (None, "")."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as response:
            response.read()
            return "ok", ""
    except urllib.error.HTTPError as err:
        try:
            body = json.loads(err.read())
        except ValueError:
            body = {}
        detail = str(body.get("detail", ""))
        return str(body.get("status", err.code)), detail.removeprefix("failed: ")
    except OSError:
        return None, ""


def watch(
    child: subprocess.Popen[bytes],
    plan: Plan,
    announce: Callable[[Plan], None],
    stopping: Callable[[], bool],
    ask: Callable[[int], tuple[str | None, str]] = health,
) -> int:
    """Follow the server: announce it once it serves; end the add-on when it fails or exits."""
    announced = False
    while True:
        code = child.poll()
        if code is not None:
            if code and not stopping():
                say(f"error: paged-llm serve stopped with exit status {code}")
            return code
        state, detail = ask(plan.port)
        if state == "failed" and not stopping():
            stop(child)  # first: the reason is then the log's last line
            what = "the engine stopped" if announced else "the model could not be loaded"
            say(f"error: {what}: {detail}")
            return 1
        if state == "ok" and not announced:
            announced = True
            say(f"ready: {plan.model} answers on port {plan.port}")
            announce(plan)
        time.sleep(SERVING_POLL_S if announced else LOADING_POLL_S)


def stop(child: subprocess.Popen[bytes]) -> None:
    """Stop the server gracefully, or kill it when it does not end in time."""
    child.terminate()
    try:
        child.wait(STOP_WAIT_S)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


def announce_to(supervisor: Supervisor | None, folders: Folders) -> Callable[[Plan], None]:
    """Tell Home Assistant where the server is (through the Supervisor), or the log outside one."""

    def announce(plan: Plan) -> None:
        """Send the discovery message; a failure is logged, the server keeps serving."""
        if supervisor is None:
            say(
                f"no Supervisor to announce the server to: connect to port {plan.port} of this "
                f"host with the api_key option's key, or the one kept in {folders.data}/api_key"
            )
            return
        try:
            url = supervisor.announce(plan.port, plan.api_key, plan.model)
        except SupervisorError as err:
            say(f"warning: Home Assistant was not told about the server: {err}")
            return
        say(f"announced to Home Assistant as {url}")

    return announce


def forward_signals(child: subprocess.Popen[bytes]) -> Callable[[], bool]:
    """Pass SIGTERM and SIGINT on to the server; returns whether one came."""
    stopping: list[int] = []

    def forward(number: int, frame: FrameType | None) -> None:
        """Let the server finish its requests and stop."""
        stopping.append(number)
        child.send_signal(number)

    for number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(number, forward)
    return lambda: bool(stopping)


def main() -> int:
    """Run the add-on; its exit status is the server's, 1 for a failed load, 2 for a refusal."""
    folders = Folders.from_env()
    try:
        plan = prepare(folders, Machine.here())
    except AddonError as err:
        say(f"error: {err}")
        return 2
    say(plan.summary)
    child = subprocess.Popen(plan.argv, env={**os.environ, **plan.env})
    stopping = forward_signals(child)
    return watch(child, plan, announce_to(Supervisor.from_env(), folders), stopping)
