"""The add-on's options as the Supervisor writes them, checked; and what the box offers."""

from __future__ import annotations

import json
import os
from argparse import ArgumentTypeError
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from paged_llm.defaults import WEIGHT_CHOICES
from paged_llm.server.cli import parse_size
from paged_llm.server.settings import DEFAULT_PORT

# "auto": this share of the memory free once the weights are loaded becomes the KV pool;
# Home Assistant and the other add-ons on the box keep the rest.
AUTO_KV_FRACTION = 0.25
# A budget above 1 is bytes; below this it is a slip (1.5 meant as a fraction, 512 as MiB).
MIN_KV_BYTES = 2**20
# The add-on's own data (options.json, the API key, caches) and where its models go.
DATA_DIR = Path("/data")
MODELS_DIR = Path("/share/paged_llm")


class AddonError(Exception):
    """The add-on cannot start as configured; the message is the one line its log shows."""


@dataclass(frozen=True, slots=True)
class Options:
    """The add-on's options, checked; the defaults are config.yaml's."""

    model: str = "bundled"
    weights: str = "auto"
    kv_budget: str = "auto"
    context_length: int = 0
    threads: int = 0
    api_key: str = ""
    port: int = DEFAULT_PORT


@dataclass(frozen=True, slots=True)
class Machine:
    """What the box gives the add-on: CPUs it may run on and memory free now."""

    cpus: int
    memory_free: int

    @classmethod
    def here(cls) -> Machine:
        """The machine as the add-on's container sees it."""
        return cls(cpus=len(os.sched_getaffinity(0)), memory_free=memory_available())


@dataclass(frozen=True, slots=True)
class Folders:
    """Where the add-on keeps its data and finds models (other places for tests and Docker)."""

    data: Path = DATA_DIR
    models: Path = MODELS_DIR

    @property
    def cache(self) -> Path:
        """Downloads, converted models and built kernels: kept across restarts, not backed up."""
        return self.data / "cache"

    @classmethod
    def from_env(cls) -> Folders:
        """The Supervisor's folders, unless PAGED_LLM_ADDON_DATA or _MODELS say otherwise."""
        env = os.environ
        return cls(
            Path(env.get("PAGED_LLM_ADDON_DATA", DATA_DIR)),
            Path(env.get("PAGED_LLM_ADDON_MODELS", MODELS_DIR)),
        )


def memory_available() -> int:
    """Bytes of memory free for new work (the kernel's MemAvailable estimate)."""
    with open("/proc/meminfo", encoding="ascii") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise AddonError("/proc/meminfo does not say how much memory is available")


def human(num_bytes: float) -> str:
    """Bytes for a log line: MiB below a GiB, else GiB with one decimal."""
    if abs(num_bytes) < 2**30:
        return f"{num_bytes / 2**20:.0f} MiB"
    return f"{num_bytes / 2**30:.1f} GiB"


def read_options(path: Path) -> Options:
    """The options file; without one (the image run by plain Docker) the defaults."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return Options()
    except (OSError, ValueError) as err:
        raise AddonError(f"cannot read the options in {path}: {err}") from err
    if not isinstance(raw, dict):
        raise AddonError(f"the options in {path} are not a JSON object")
    return parse_options(raw)


def parse_options(raw: Mapping[str, Any]) -> Options:
    """Options from their JSON; a wrong type, range or name is an AddonError naming it."""
    names = [field.name for field in fields(Options)]
    if unknown := sorted(set(raw) - set(names)):
        raise AddonError(f"unknown option {unknown[0]!r}; the options are {', '.join(names)}")
    defaults = Options()
    weights = _text(raw, "weights", defaults.weights)
    if weights not in WEIGHT_CHOICES:
        raise AddonError(f"weights must be one of {', '.join(WEIGHT_CHOICES)}, got {weights!r}")
    options = Options(
        model=_text(raw, "model", defaults.model),
        weights=weights,
        kv_budget=_text(raw, "kv_budget", defaults.kv_budget),
        context_length=_number(raw, "context_length", defaults.context_length, 0, 2**24),
        threads=_number(raw, "threads", defaults.threads, 0, 1024),
        api_key=_text(raw, "api_key", defaults.api_key),
        port=_number(raw, "port", defaults.port, 1, 65535),
    )
    kv_budget(options.kv_budget)  # its form, before anything is downloaded
    return options


def kv_budget(text: str) -> float:
    """The budget as `paged-llm serve --kv-budget` reads it: a fraction of free memory or bytes."""
    if text == "auto":
        return AUTO_KV_FRACTION
    try:
        value = parse_size(text)
    except ArgumentTypeError:
        value = 0.0
    if value <= 0 or 1 < value < MIN_KV_BYTES:
        raise AddonError(
            f"kv_budget {text!r} is not 'auto', a size such as 512MiB or 2GiB, "
            "or a share of the free memory such as 0.5"
        )
    return value


def _text(raw: Mapping[str, Any], name: str, default: str) -> str:
    """A text option, stripped."""
    value = raw.get(name, default)
    if not isinstance(value, str):
        raise AddonError(f"{name} must be text, got {value!r}")
    return value.strip()


def _number(raw: Mapping[str, Any], name: str, default: int, low: int, high: int) -> int:
    """A whole-number option within low..high."""
    value = raw.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise AddonError(f"{name} must be a whole number from {low} to {high}, got {value!r}")
    return value
