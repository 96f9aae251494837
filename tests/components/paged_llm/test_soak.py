"""The soak's CI-sized subset through Home Assistant: agents and the summarize action at once."""

from __future__ import annotations

from homeassistant.core import HomeAssistant
from pytest_homeassistant_custom_component.common import MockConfigEntry

from benchmarks.soak import HassTarget, plan, soak, warm_up
from tests.helpers.home_assistant import agent_entity_id

REQUESTS = 100


async def test_mixed_requests_through_home_assistant_leave_no_fault_and_no_block(
    hass: HomeAssistant, init_integration: MockConfigEntry
) -> None:
    entry = init_integration
    target = HassTarget(
        hass,
        entry,
        agent_entity_id(hass, entry, "conversation", "conversation"),
        agent_entity_id(hass, entry, "ai_task", "ai_task_data"),
    )
    await warm_up(target)
    report = await soak(
        target, plan(REQUESTS, seed=2, summary_words=120, cancel_within_s=0.05), concurrency=8
    )
    figures = report.as_dict()
    print(report.text("hass"))
    assert report.not_run == 0, figures
    assert report.faults() == {}, figures
    assert report.leaked_blocks == 0, figures
    assert 0 < figures["cancelled"] < REQUESTS // 4, figures
    assert set(figures["latency_s"]) == {"interactive", "automation", "background"}, figures
    assert entry.runtime_data.backend.engine.is_running
