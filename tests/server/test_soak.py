"""The soak's CI-sized subset through a real ``paged-llm serve`` and the official openai client."""

from __future__ import annotations

from benchmarks.soak import ServerTarget, plan, soak, warm_up
from tests.helpers.server_process import API_KEY, MODEL, ServerProcess

# A hundred mixed requests (the brief asked 100-300: the least, as the shared test machine is slow).
REQUESTS = 100


async def test_a_hundred_mixed_requests_leave_no_fault_and_no_block(
    server: ServerProcess,
) -> None:
    target = ServerTarget(server.url, MODEL, server.process.pid, api_key=API_KEY)
    await warm_up(target)
    jobs = plan(REQUESTS, seed=1, summary_words=120)
    report = await soak(target, jobs, concurrency=8, bound_s=300)
    figures = report.as_dict()
    print(report.text("server"))
    assert report.not_run == 0, figures
    assert report.faults() == {}, figures
    assert report.leaked_blocks == 0, figures
    # About a tenth was cancelled mid-way, and every class was answered.
    assert 0 < figures["cancelled"] < REQUESTS // 4, figures
    assert set(figures["latency_s"]) == {"interactive", "automation", "background"}, figures
    assert server.process.poll() is None
