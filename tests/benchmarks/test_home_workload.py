"""The benchmark's home workload is seeded, mixed, and shaped as DESIGN.md describes."""

from __future__ import annotations

import itertools

import pytest
from transformers import AutoTokenizer

from benchmarks.workload import MODES, build_workload
from tests.helpers.support import tokenizer_dir


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(tokenizer_dir())


def test_same_seed_same_requests_other_seed_other_requests(tok) -> None:
    a = build_workload(tok, "quick", seed=3)
    b = build_workload(tok, "quick", seed=3)
    c = build_workload(tok, "quick", seed=4)
    assert a == b
    assert a != c


def test_classes_share_the_system_prompt_and_differ_in_length(tok) -> None:
    reqs = build_workload(tok, "quick", seed=0)
    by_class = {c: [r for r in reqs if r.priority == c] for c in MODES["quick"] if c != "duration"}
    assert all(by_class.values())
    voice = by_class["interactive"]
    prefix = voice[0].prompt_ids[:300]
    assert all(r.prompt_ids[:300] == prefix for r in voice + by_class["automation"])
    assert 300 < min(len(r.prompt_ids) for r in voice) < 700
    assert min(len(r.prompt_ids) for r in by_class["background"]) > 1000
    assert [r.arrival for r in reqs] == sorted(r.arrival for r in reqs)
    assert all(0 <= r.arrival <= MODES["quick"]["duration"] for r in reqs)


def test_bursty_variant_groups_voice_arrivals(tok) -> None:
    reqs = build_workload(tok, "full", seed=0, bursty=True)
    times = [r.arrival for r in reqs if r.priority == "interactive"]
    close = sum(1 for a, b in itertools.pairwise(times) if b - a < 1.0)
    assert close > len(times) // 2
