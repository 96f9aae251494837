"""A real Home Assistant serving a GGUF file in its own process never imports torch.

Home Assistant starts through a wrapper that makes torch, transformers, triton, xgrammar and
accelerate unimportable (an attempt fails loudly) and writes at exit which of them are in
``sys.modules`` anyway. The entry is set up over REST with every default (the bundled GGUF on
the CPU), then asked what a home asks: an Assist question with the home's tools offered, a
JSON-schema answer from the AI task, a summary, and a summary cut off by a reload (its
requests aborted); the next question still answers, and Home Assistant stops having
imported none of them.
"""

from __future__ import annotations

import json
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.home_assistant import (
    CONFIGURATION,
    HomeAssistantProcess,
    kill,
    make_home_assistant,
)
from tests.helpers.without_torch import blocking_entry_point

pytestmark = pytest.mark.slow

# A light the Assist question can turn on (input_boolean is exposed to Assist by default).
HOME = textwrap.dedent(
    """\
    input_boolean:
      kitchen_light:
        name: Kitchen light
    """
)
FLOW = "/api/config/config_entries/flow"
SUBFLOW = "/api/config/config_entries/subentries/flow"
LOAD_TIMEOUT_S = 300


def _wrapper(folder: Path) -> tuple[Path, Path]:
    """The ``hass`` stand-in that blocks torch's kin, and the file it reports into."""
    report = folder / "imported-at-exit.json"
    main = "from homeassistant.__main__ import main\n\nsys.exit(main())\n"
    return blocking_entry_point(folder / "hass", report, main), report


def _finish(hass: HomeAssistantProcess, path: str, result: dict[str, Any]) -> dict[str, Any]:
    """Wait out progress steps (installing, loading) until the flow shows its next step."""
    deadline = time.monotonic() + LOAD_TIMEOUT_S
    while result["type"] in ("progress", "progress_done"):
        assert time.monotonic() < deadline, (result, hass.log_tail())
        time.sleep(0.5)
        status, result = hass.request("GET", f"{path}/{result['flow_id']}")
        if result["type"] == "progress_done":
            status, result = hass.request("POST", f"{path}/{result['flow_id']}", {})
        assert status == 200, result
    return result


def _create_entry(hass: HomeAssistantProcess) -> str:
    """The engine on this Home Assistant with every default; returns the entry id."""
    status, result = hass.request("POST", FLOW, {"handler": "paged_llm"})
    assert status == 200, result
    flow_id = result["flow_id"]
    status, result = hass.request("POST", f"{FLOW}/{flow_id}", {"backend": "embedded"})
    assert status == 200, result
    result = _finish(hass, FLOW, result)
    assert result.get("step_id") == "embedded", result
    status, result = hass.request("POST", f"{FLOW}/{flow_id}", {})
    assert status == 200, result
    result = _finish(hass, FLOW, result)
    assert result["type"] == "create_entry", (result, hass.log_tail())
    assert result["result"]["state"] == "loaded", hass.log_tail()
    return str(result["result"]["entry_id"])


def _add_home_agent(hass: HomeAssistantProcess, entry_id: str) -> None:
    """A second conversation agent that may control the home (Assist's tools offered)."""
    status, result = hass.request("POST", SUBFLOW, {"handler": [entry_id, "conversation"]})
    assert status == 200, result
    status, result = hass.request(
        "POST",
        f"{SUBFLOW}/{result['flow_id']}",
        {"name": "Home agent", "llm_hass_api": ["assist"]},
    )
    assert status == 200, result
    assert result["type"] == "create_entry", result


def _ask(hass: HomeAssistantProcess, agent: str, text: str) -> tuple[int, Any]:
    """One Assist question through the REST API."""
    return hass.request(
        "POST",
        "/api/conversation/process",
        {"text": text, "agent_id": agent, "language": "en"},
        timeout=LOAD_TIMEOUT_S,
    )


def test_home_assistant_serves_a_gguf_without_importing_torch(
    tmp_path: Path, socket_enabled: None, make_long_text: Any
) -> None:
    wrapper, report = _wrapper(tmp_path)
    hass = make_home_assistant(tmp_path, wrapper, CONFIGURATION + HOME)
    hass.start()
    try:
        hass.wait_until_up()
        hass.onboard()
        entry_id = _create_entry(hass)
        _add_home_agent(hass, entry_id)
        states = hass.states()
        agents = sorted(e for e in states if e.startswith("conversation.") and "paged" not in e)
        home_agent = next(e for e in agents if "home_agent" in e)
        (task,) = [e for e in states if e.startswith("ai_task.")]

        # Assist with the home's tools: the tool grammar is compiled and decoding held to it.
        status, reply = _ask(hass, home_agent, "Turn on the kitchen light")
        assert status == 200, (reply, hass.log_tail())
        assert reply["response"]["response_type"] in ("action_done", "query_answer"), reply

        status, body = hass.request(
            "POST",
            "/api/services/ai_task/generate_data?return_response",
            {
                "entity_id": task,
                "task_name": "colour",
                "instructions": "Name a colour.",
                "structure": {"colour": {"selector": {"text": {}}, "required": True}},
            },
            timeout=LOAD_TIMEOUT_S,
        )
        assert status == 200, (body, hass.log_tail())
        assert isinstance(body["service_response"]["data"]["colour"], str), body

        status, body = hass.request(
            "POST",
            "/api/services/paged_llm/summarize?return_response",
            {"text": make_long_text(600), "max_tokens": 16},
            timeout=LOAD_TIMEOUT_S,
        )
        assert status == 200, (body, hass.log_tail())
        assert body["service_response"]["summary"], body

        # A summary cut off by a reload: its requests are aborted, the caller gets the
        # translated error, and the reloaded engine answers the next question.
        with ThreadPoolExecutor(max_workers=1) as pool:
            cut = pool.submit(
                hass.request,
                "POST",
                "/api/services/paged_llm/summarize?return_response",
                {"text": make_long_text(3000), "max_tokens": 64},
                timeout=LOAD_TIMEOUT_S,
            )
            time.sleep(2)
            status, body = hass.request(
                "POST", f"/api/config/config_entries/entry/{entry_id}/reload", {}
            )
            assert status == 200, body
            status, body = cut.result()
        if status != 200:
            assert "restart" in json.dumps(body), body
        status, reply = _ask(hass, agents[0], "Hello")
        assert status == 200, (reply, hass.log_tail())
        assert reply["response"]["speech"]["plain"]["speech"], reply

        assert hass.stop() == 0, hass.log_tail()
    finally:
        kill(hass)
    assert json.loads(report.read_text()) == [], "imported in Home Assistant's process"
    assert "is blocked in this test" not in hass.log.read_text(errors="replace"), hass.log_tail()
