"""From checked options to the exact `paged-llm serve` command, its environment and its key."""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from paged_llm.server.settings import API_KEY_ENV

from .model import Model
from .options import AUTO_KV_FRACTION, AddonError, Folders, Machine, Options, human, kv_budget

# Every address of the container: Home Assistant reaches it over the Supervisor's network.
LISTEN_HOST = "0.0.0.0"


@dataclass(frozen=True, slots=True)
class Plan:
    """How the add-on runs the server, and what it tells the log and Home Assistant."""

    argv: list[str]
    env: dict[str, str]
    port: int
    model: str
    api_key: str
    summary: str


def build_plan(
    options: Options, model: Model, machine: Machine, folders: Folders, api_key: str
) -> Plan:
    """The command for these options on this machine; one that cannot work is an AddonError."""
    threads = options.threads or machine.cpus
    if threads > machine.cpus:
        raise AddonError(
            f"threads {threads} is more than the {machine.cpus} CPUs this add-on can use"
        )
    budget = kv_budget(options.kv_budget)
    room = machine.memory_free - model.size
    if budget > 1 and budget > room:
        raise AddonError(
            f"kv_budget {options.kv_budget} is more than the {human(room)} of memory free "
            f"beside the model ({human(machine.memory_free)} free, the model takes "
            f"{human(model.size)}); lower it or use 'auto'"
        )
    argv = ["paged-llm", "serve", model.source, "--served-model-name", model.name]
    argv += ["--weights", options.weights]
    auto = options.kv_budget == "auto"
    argv += ["--kv-budget", str(AUTO_KV_FRACTION) if auto else options.kv_budget]
    if options.context_length:
        argv += ["--max-model-len", str(options.context_length)]
    argv += ["--host", LISTEN_HOST, "--port", str(options.port)]
    env = {
        API_KEY_ENV: api_key,  # not on the command line, which every process can read
        # torch's threads and the C kernels' (OpenMP) alike.
        "OMP_NUM_THREADS": str(threads),
        # Converted models and the kernels built for this CPU; Hugging Face downloads.
        "XDG_CACHE_HOME": str(folders.cache),
        "HF_HOME": str(folders.cache / "huggingface"),
    }
    kv = f"{AUTO_KV_FRACTION:.0%} of the memory free after the model" if auto else options.kv_budget
    context = options.context_length or "the model's"
    summary = (
        f"serving {model.name} on port {options.port}: {threads} threads of "
        f"{machine.cpus} CPUs, KV budget {kv} ({human(machine.memory_free)} free now), "
        f"context {context}, weights {options.weights}"
    )
    return Plan(argv, env, options.port, model.name, api_key, summary)


def api_key(options: Options, data: Path) -> str:
    """The option's key; without one, a key generated once and kept in the add-on's data."""
    if options.api_key:
        return options.api_key
    path = data / "api_key"
    try:
        key = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        key = ""
    if not key:
        key = secrets.token_urlsafe(32)
        path.parent.mkdir(parents=True, exist_ok=True)
        # Only the add-on reads it.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(key + "\n")
    return key
