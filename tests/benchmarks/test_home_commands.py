"""The home-command benchmark: its home and commands hold together, and it scores calls right."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from homeassistant.helpers import intent, llm

from benchmarks.home_commands import (
    ACT,
    AREAS,
    ASK,
    COMMANDS,
    HOME,
    NONE,
    Call,
    Command,
    Outcome,
    Settings,
    async_run,
    is_correct,
    judge_call,
    known_in,
    main,
    results,
    select,
    summarize,
    table,
)

KNOWN = known_in(HOME)
EXPOSED = {d.entity_id for d in HOME if d.exposed}


def _turn_on_tool() -> llm.Tool:
    """Assist's HassTurnOn as the agent offers it (namespaced)."""
    handler = intent.ServiceIntentHandler(intent.INTENT_TURN_ON, "homeassistant", "turn_on")
    return llm.NamespacedTool("homeassistant", llm.IntentTool(intent.INTENT_TURN_ON, handler))


def _outcome(services=(), calls=()) -> Outcome:
    return Outcome(0.1, 1.0, [], list(calls), list(services), "")


def test_the_home_and_commands_are_what_the_issue_asks_for() -> None:
    """About 40 entities in about 8 areas; at least 60 commands, all kinds; targets exist."""
    assert 38 <= len(HOME) <= 48
    assert 8 <= len(AREAS) <= 10
    assert len({d.entity_id for d in HOME}) == len(HOME)
    assert len(COMMANDS) >= 60
    assert len({c.text for c in COMMANDS}) == len(COMMANDS)
    kinds = Counter(c.kind for c in COMMANDS)
    assert kinds[ACT] >= 30, kinds
    assert kinds[ASK] >= 8, kinds
    assert kinds[NONE] >= 10, kinds
    for command in COMMANDS:
        # What a command acts on or asks about is exposed; NONE names nothing.
        assert bool(command.targets) == (command.kind != NONE), command
        assert set(command.targets) <= EXPOSED, command
    assert any(not d.exposed for d in HOME)
    assert any(not d.name.isascii() for d in HOME)
    # A quick run still has every kind of command.
    assert {c.kind for c in select(COMMANDS, 6)} == {ACT, ASK, NONE}
    assert select(COMMANDS, None) == list(COMMANDS)


def test_targets_are_matched_as_home_assistant_matches_them() -> None:
    """Case and outer spaces do not matter; hidden entities and made-up rooms are missing."""
    assert KNOWN.missing({"name": " living ROOM floor lamp", "area": "lounge"}) == []
    assert KNOWN.missing({"name": "Nachtlicht 🌙", "floor": "upstairs"}) == []
    assert KNOWN.missing({"area": "Büro", "domain": ["light"]}) == []
    assert KNOWN.missing({"name": "Garage door"}) == ["name='Garage door'"]  # not exposed
    assert KNOWN.missing({"name": "living room lamp"}) == ["name='living room lamp'"]
    assert KNOWN.missing({"area": ["Kitchen", "Garden"], "floor": "Attic"}) == [
        "area='Garden'",
        "floor='Attic'",
    ]


def test_a_call_is_judged_by_the_offered_tools_and_the_home() -> None:
    tools = [_turn_on_tool()]
    name = "homeassistant__HassTurnOn"
    good = judge_call(llm.ToolInput(name, {"name": "Printer"}), tools, KNOWN)
    assert good.valid
    assert good.missing == []
    missing = judge_call(llm.ToolInput(name, {"name": "Porch light"}), tools, KNOWN)
    assert missing.valid
    assert missing.missing == ["name='Porch light'"]
    wrong_args = judge_call(llm.ToolInput(name, {"brightness": "very"}), tools, KNOWN)
    assert not wrong_args.valid
    unknown = judge_call(llm.ToolInput("HassTeleport", {"name": "Printer"}), tools, KNOWN)
    assert not unknown.valid


def test_correct_target_by_kind() -> None:
    kitchen = ("light.kitchen_ceiling", "light.kitchen_under_cabinet", "light.kitchen_pendant")
    act = Command("turn off the kitchen lights", ACT, kitchen)
    assert is_correct(act, _outcome([("light.turn_off", kitchen)]))
    assert not is_correct(act, _outcome([("light.turn_off", kitchen[:1])]))
    assert not is_correct(act, _outcome([("light.turn_off", (*kitchen, "light.garage"))]))
    assert not is_correct(act, _outcome())
    none = Command("open the garage", NONE)
    assert is_correct(none, _outcome())
    assert not is_correct(none, _outcome([("light.turn_on", ("light.garage",))]))
    ask = Command("is the front door locked", ASK, ("lock.front_door",))
    read = Call("GetLiveContext", {}, True, [], result='{"result": "- names: Front door"}')
    failed = Call("GetLiveContext", {}, True, [], error="x", result='{"error": "Front door"}')
    assert is_correct(ask, _outcome(calls=[read]))
    assert not is_correct(ask, _outcome(calls=[failed]))
    assert not is_correct(ask, _outcome([("lock.lock", ("lock.front_door",))], [read]))


def test_summary_and_table_count_calls_and_targets() -> None:
    commands = [Command("a", ACT, ("switch.printer",)), Command("b", NONE)]
    missing = Call("t", {"name": "Porch"}, True, ["name='Porch'"], error="MatchFailedError")
    # GetLiveContext says so in words; a call it cannot run at all is not a failed match.
    live = Call("GetLiveContext", {"area": "lounge"}, True, [], error="No exposed entities found")
    broken = Call("t", {}, False, [], error="InvalidSlotInfo")
    outcomes = [
        _outcome([("switch.turn_off", ("switch.printer",))], [Call("t", {}, True, []), live]),
        _outcome(calls=[missing, broken]),
    ]
    outcomes[0].correct, outcomes[1].correct = True, True
    summary = summarize(commands, outcomes)
    assert summary["calls"] == 4
    assert summary["valid_calls"] == 3
    assert summary["calls_naming_a_missing_target"] == 1
    assert summary["calls_not_matched"] == 2
    assert summary["calls_failed_otherwise"] == 1
    assert summary["correct_rate"] == 1.0
    assert summary["by_kind"][ACT] == {"commands": 1, "correct": 1}
    assert "| on | 2 | 2 | 4 | 3 | 1 | 2 | 2 (100%) |" in table("m", {"on": summary})


async def test_a_quick_run_goes_through_home_assistant(tiny_model_dir: Path, tmp_path) -> None:
    """Three commands, grammar on and off, on a tiny random model: every figure is there."""
    settings = Settings(model=str(tiny_model_dir), max_tokens=8)
    commands = select(COMMANDS, 3)
    outcomes = await async_run(settings, commands, ["on", "off"], progress=False)
    for mode in ("on", "off"):
        assert len(outcomes[mode]) == 3
        for outcome in outcomes[mode]:
            assert outcome.turns, "the model was asked"
            assert outcome.first_token_s is not None
            assert outcome.first_token_s > 0
            assert outcome.turns[0].prompt_tokens > 1000  # Assist's prompt and tools
            assert all(len(c.tool) > 0 for c in outcome.calls)
    data = results(settings, commands, outcomes)
    json.dumps(data, default=str)
    assert data["summary"]["on"]["commands"] == 3


def test_the_command_line_refuses_a_bad_grammar_mode(capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--grammar", "maybe"])
    assert exit_.value.code == 2
    assert "--grammar" in capsys.readouterr().err
