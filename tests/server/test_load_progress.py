"""A server's log shows how far a model's load got: a line at each tenth, not per tensor."""

from __future__ import annotations

import logging

import pytest

from paged_llm.server.host import load_progress


def test_the_load_is_logged_at_each_tenth(caplog: pytest.LogCaptureFixture) -> None:
    report = load_progress("qwen")
    with caplog.at_level(logging.INFO, logger="paged_llm.server.host"):
        for fraction in (0.01, 0.1, 0.1, 0.15, 0.37, 0.38, 0.99, 1.0, 1.0):
            report(fraction)
    assert [r.getMessage() for r in caplog.records] == [
        "Loading qwen: 0%",
        "Loading qwen: 10%",
        "Loading qwen: 30%",
        "Loading qwen: 90%",
        "Loading qwen: 100%",
    ]
