"""Strings: every flow step, error, entity, action and exception the code uses is translated.

Each shipped language holds exactly English's keys, with the same placeholders.
"""

from __future__ import annotations

import json
import re
import string
from pathlib import Path
from typing import Any

import pytest
import yaml
from homeassistant.util.package import is_installed, parse_requirement_safe

from custom_components.paged_llm.addon import ISSUE_UNREACHABLE
from custom_components.paged_llm.const import SERVICE_GENERATE, SERVICE_SUMMARIZE
from custom_components.paged_llm.prompt_budget import ISSUES
from custom_components.paged_llm.runtime import PromptBudget
from custom_components.paged_llm.sensor import PROMPT_SENSOR_KEY, SENSORS

INTEGRATION = Path(__file__).resolve().parents[3] / "custom_components" / "paged_llm"
STRINGS = json.loads((INTEGRATION / "strings.json").read_text(encoding="utf-8"))
SOURCES = {path.name: path.read_text(encoding="utf-8") for path in INTEGRATION.glob("*.py")}
LANGUAGES = sorted(path.stem for path in (INTEGRATION / "translations").glob("*.json"))


def _placeholders(message: str) -> set[str]:
    """The named placeholders of a translated message."""
    return {field for _, field, _, _ in string.Formatter().parse(message) if field}


def _leaves(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Every value of a translation file by its dotted key path."""
    leaves: dict[str, Any] = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            leaves |= _leaves(value, f"{path}.")
        else:
            leaves[path] = value
    return leaves


def test_english_translation_equals_strings() -> None:
    english = json.loads((INTEGRATION / "translations" / "en.json").read_text(encoding="utf-8"))
    assert english == STRINGS
    # Custom integrations get no build step that resolves references.
    assert "[%key:" not in json.dumps(STRINGS)


def test_every_translation_key_in_the_code_has_a_message() -> None:
    used = {
        key
        for name, source in SOURCES.items()
        if name != "sensor.py"  # entity names, checked below
        for key in re.findall(r'(?:translation_key=|BackendError\(\s*)"([a-z0-9_]+)"', source)
    }
    exceptions = STRINGS["exceptions"]
    assert used <= set(exceptions), used - set(exceptions)
    # Keys built at run time: load failures and engine rejections.
    for key in (
        "torch_unavailable",
        "engine_unavailable",
        "kv_budget_too_small",
        "model_load_failed",
        "unsupported_model",
        "engine_start_failed",
        "rejected",
        "rejected_context_too_long",
        "rejected_exceeds_kv_pool",
        "rejected_queue_full",
        "rejected_empty_prompt",
        "rejected_invalid_token",
    ):
        assert key in exceptions, key


def test_every_flow_error_and_step_is_translated() -> None:
    config = STRINGS["config"]
    flow = SOURCES["config_flow.py"] + SOURCES["schemas.py"] + SOURCES["errors.py"]
    errors = set(re.findall(r'errors\["base"\](?:, reason)? = "([a-z_]+)"', flow))
    errors |= set(re.findall(r'\{"base": "([a-z_]+)"\}', flow))
    errors |= {
        "torch_unavailable",
        "engine_unavailable",
        "kv_budget_too_small",
        "model_load_failed",
        "unsupported_model",
        "engine_start_failed",
    }
    assert errors <= set(config["error"]), errors - set(config["error"])
    steps = set(re.findall(r'(?<![a-z_])step_id="([a-z_]+)"', flow)) - {"set_options"}
    assert steps <= set(config["step"]), steps - set(config["step"])
    assert set(re.findall(r'progress_action="([a-z_]+)"', flow)) <= set(config["progress"])
    for kind in ("conversation", "ai_task_data"):
        sub = STRINGS["config_subentries"][kind]
        assert {"user", "reconfigure"} <= set(sub["initiate_flow"])
        assert "set_options" in sub["step"]


def test_error_messages_only_use_placeholders_the_code_fills() -> None:
    filled = {"reason", "code", "model", "path", "size", "limit", "priority", "priorities"}
    filled |= {"error", "output", "max_tokens", "context", "longest", "most", "rounds"}
    filled |= {"url", "seconds"}
    # ai_task.evaluate's (evaluate.py, score_plan.py).
    filled |= {"question", "type", "types", "count", "first", "second", "tokens"}
    for entry in STRINGS["exceptions"].values():
        assert _placeholders(entry["message"]) <= filled, entry
    for message in STRINGS["config"]["error"].values():
        assert _placeholders(message) <= {"reason"}


def test_entities_and_icons_cover_every_sensor() -> None:
    icons = json.loads((INTEGRATION / "icons.json").read_text(encoding="utf-8"))
    keys = [d.translation_key for d in SENSORS] + [PROMPT_SENSOR_KEY]
    for key in keys:
        assert key in STRINGS["entity"]["sensor"]
        assert key in icons["entity"]["sensor"]
    # Every attribute the prompt sensor can show has a name.
    budget = PromptBudget(
        prompt_tokens=1,
        context_size=2,
        answer_tokens=1,
        exposed_entities=0,
        counted_tokens=1,
        counted_exactly=True,
        remote=True,
    )
    named = STRINGS["entity"]["sensor"]["prompt_tokens"]["state_attributes"]
    assert set(budget.attributes()) == set(named)


def test_each_repair_is_translated_with_the_placeholders_the_code_fills() -> None:
    common = {"agent", "tokens", "entities"}
    filled = {
        "prompt_too_long": common | {"context", "answer"},
        "prompt_slow": common | {"seconds", "threshold"},
        "prompt_truncated": common | {"reported", "counted"},
        # The add-on's server does not answer (addon.py).
        ISSUE_UNREACHABLE: {"entry", "url"},
    }
    assert set(STRINGS["issues"]) == {*ISSUES, ISSUE_UNREACHABLE} == set(filled)
    for key, issue in STRINGS["issues"].items():
        assert _placeholders(issue["title"]) <= filled[key], key
        assert _placeholders(issue["description"]) <= filled[key], key
        assert key == ISSUE_UNREACHABLE or "{entities}" in issue["description"], key


def test_actions_are_described_and_translated() -> None:
    services: dict[str, Any] = yaml.safe_load(
        (INTEGRATION / "services.yaml").read_text(encoding="utf-8")
    )
    assert set(services) == {SERVICE_GENERATE, SERVICE_SUMMARIZE}
    icons = json.loads((INTEGRATION / "icons.json").read_text(encoding="utf-8"))
    for name, spec in services.items():
        strings = STRINGS["services"][name]
        assert strings["name"]
        assert strings["description"]
        assert set(spec["fields"]) == set(strings["fields"]), name
        assert name in icons["services"]
    options = services[SERVICE_GENERATE]["fields"]["priority"]["selector"]["select"]["options"]
    assert set(options) == set(STRINGS["selector"]["priority"]["options"])


def test_manifest_requires_the_pinned_library() -> None:
    manifest = json.loads((INTEGRATION / "manifest.json").read_text(encoding="utf-8"))
    (requirement,) = manifest["requirements"]
    version = manifest["version"]
    # The PyPI name, pinned: Home Assistant upgrades the library when the pin changes and
    # does not fetch an installed one again at each start (offline restarts work).
    assert requirement == f"paged-llm=={version}"
    assert is_installed(requirement)
    assert parse_requirement_safe(requirement).name == "paged-llm"
    assert manifest["iot_class"] == "local_push"
    assert set(manifest["dependencies"]) == {"ai_task", "conversation"}


def test_the_promised_languages_are_shipped() -> None:
    """German, Dutch, French, Spanish and Italian ship beside English."""
    assert {"en", "de", "nl", "fr", "es", "it"} <= set(LANGUAGES)


@pytest.mark.parametrize("language", LANGUAGES)
def test_each_language_has_englishs_keys_and_placeholders(language: str) -> None:
    """A language file has exactly English's keys, each a text with English's placeholders."""
    english = _leaves(STRINGS)
    translated = _leaves(
        json.loads((INTEGRATION / "translations" / f"{language}.json").read_text(encoding="utf-8"))
    )
    assert set(translated) == set(english), {
        "missing": sorted(set(english) - set(translated)),
        "extra": sorted(set(translated) - set(english)),
    }
    for path, message in translated.items():
        assert isinstance(message, str), path
        assert message.strip(), path
        assert "[%key:" not in message, path
        assert _placeholders(message) == _placeholders(english[path]), path
