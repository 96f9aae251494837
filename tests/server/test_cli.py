"""The ``paged-llm`` command's chat and generate, run for real over a scripted tiny model."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.scripted_model import build_scripted_model

ANSWER = "The answer is 42. Done now!"
COMMAND = Path(sys.executable).parent / "paged-llm"
ENGINE = ("--device", "cpu", "--dtype", "float32", "--kv-budget", "8MiB")


@pytest.fixture(scope="module")
def model(scripted_dir: Path) -> Path:
    return build_scripted_model(scripted_dir / "answer-42", ANSWER)


def _run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [str(COMMAND), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "HOME": str(Path.home())},
    )
    assert result.returncode == 0, result.stderr
    return result


def test_chat_streams_one_answer(model: Path) -> None:
    result = _run("chat", "What is the answer?", "--model", str(model), *ENGINE)
    assert result.stdout == ANSWER + "\n"
    assert "loaded" in result.stderr


def test_chat_without_a_prompt_holds_a_conversation(model: Path) -> None:
    result = _run(
        "chat", "--model", str(model), *ENGINE, "--system", "Be brief.", stdin="hi\nagain\n/exit\n"
    )
    assert result.stdout == f"{ANSWER}\n{ANSWER}\n"


def test_generate_runs_prompts_at_once_and_prints_metrics(model: Path) -> None:
    result = _run("generate", "--concurrency", "6", "--model", str(model), *ENGINE)
    lines = result.stdout.splitlines()
    assert [line for line in lines if line.startswith("[")] == [f"[{i}] {ANSWER}" for i in range(6)]
    summary = "\n".join(lines)
    tokens = 10  # the script's tokens in the SmolLM2 tokenizer
    assert re.search(r"6 requests in [0-9.]+ s: (\d+) tokens generated", summary)
    generated = int(re.search(r"(\d+) tokens generated", summary).group(1))  # type: ignore[union-attr]
    assert generated == 6 * (tokens + 1)  # each answer ends with its end-of-sequence token
    assert "time to first token p50" in summary
    assert "6/6 done" in result.stderr


def test_weights_option_reaches_the_engine_config() -> None:
    from paged_llm.server.cli import build_parser, engine_config

    parser = build_parser()
    assert engine_config(parser.parse_args(["serve", "--weights", "q8"])).weights == "q8"
    assert engine_config(parser.parse_args(["serve"])).weights == "auto"
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--weights", "q3"])


def test_the_json_string_cap_reaches_the_engine_config() -> None:
    """--json-string-chars sets the engine's cap on free JSON strings; a cap below 1 is refused."""
    from paged_llm.server.cli import build_parser, engine_config

    parser = build_parser()
    config = engine_config(parser.parse_args(["serve", "--json-string-chars", "200"]))
    assert config.json_bounds.string_chars == 200
    assert engine_config(parser.parse_args(["serve"])).json_bounds.string_chars == 1000
    with pytest.raises(ValueError, match="string_chars must be at least 1"):
        engine_config(parser.parse_args(["serve", "--json-string-chars", "0"]))


@pytest.mark.parametrize(
    ("runner", "blocked", "extra"),
    [("numpy", "llguidance", "paged-llm[cpu]"), ("torch", "transformers", "paged-llm[engine]")],
)
def test_a_missing_extra_is_named_before_anything_loads(
    runner: str,
    blocked: str,
    extra: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The runner the settings take decides which extra to name: the light one for the
    # numpy runner (no torch needed), the torch path's for the torch runner.
    from paged_llm.server.cli import main

    monkeypatch.setitem(sys.modules, blocked, None)
    assert main(["chat", "Hi", "--runner", runner, "--device", "cpu"]) == 1
    message = capsys.readouterr().err
    assert repr(blocked) in message
    assert f"pip install '{extra}'" in message
