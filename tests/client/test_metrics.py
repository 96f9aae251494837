"""Prometheus text with vLLM's names, written by prometheus_client, read back as a snapshot."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from paged_llm.client.metrics import MetricsReader, parse_metrics


def _registry() -> tuple[CollectorRegistry, dict[str, object]]:
    registry = CollectorRegistry()
    labels = ["model_name"]
    m: dict[str, object] = {
        "running": Gauge("vllm:num_requests_running", "", labels, registry=registry),
        "waiting": Gauge("vllm:num_requests_waiting", "", labels, registry=registry),
        "usage": Gauge("vllm:kv_cache_usage_perc", "", labels, registry=registry),
        "preempt": Counter("vllm:num_preemptions", "", labels, registry=registry),
        "queries": Counter("vllm:prefix_cache_queries", "", labels, registry=registry),
        "hits": Counter("vllm:prefix_cache_hits", "", labels, registry=registry),
        "gen": Counter("vllm:generation_tokens", "", labels, registry=registry),
        "ttft": Histogram(
            "vllm:time_to_first_token_seconds",
            "",
            labels,
            buckets=(0.1, 0.5, 1.0),
            registry=registry,
        ),
    }
    return registry, m


def test_vllm_names_become_the_engine_snapshot() -> None:
    registry, m = _registry()
    m["running"].labels("a").set(3)  # type: ignore[attr-defined]
    m["waiting"].labels("a").set(2)  # type: ignore[attr-defined]
    m["waiting"].labels("other").set(40)  # type: ignore[attr-defined]
    m["usage"].labels("a").set(0.25)  # type: ignore[attr-defined]
    m["preempt"].labels("a").inc(4)  # type: ignore[attr-defined]
    m["queries"].labels("a").inc(100)  # type: ignore[attr-defined]
    m["hits"].labels("a").inc(60)  # type: ignore[attr-defined]
    m["gen"].labels("a").inc(50)  # type: ignore[attr-defined]
    reader = MetricsReader("a")
    first = reader.read(generate_latest(registry).decode(), now=10.0)
    assert first.num_requests_running == 3
    assert first.num_requests_waiting == 2  # the other model's queue is not ours
    assert first.kv_cache_usage_perc == pytest.approx(0.25)
    assert first.num_preemptions == 4
    assert first.prefix_cache_hit_rate == pytest.approx(0.6)
    assert first.generation_tokens_total == 50
    assert first.generation_throughput == 0.0  # a rate needs two scrapes

    for seconds in (0.05, 0.05, 0.3, 0.7):
        m["ttft"].labels("a").observe(seconds)  # type: ignore[attr-defined]
    m["gen"].labels("a").inc(30)  # type: ignore[attr-defined]
    second = reader.read(generate_latest(registry).decode(), now=12.0)
    assert second.generation_throughput == pytest.approx(15.0)
    ttft = second.time_to_first_token_seconds["all"]
    assert ttft.count == 4
    assert ttft.p50 == pytest.approx(0.1)  # rank 2 of 4 ends the first bucket
    assert 0.5 < ttft.p95 <= 1.0  # type: ignore[operator]

    # No new request: the last interval's figures stay; one more moves them.
    third = reader.read(generate_latest(registry).decode(), now=14.0)
    assert third.time_to_first_token_seconds["all"].count == 4
    assert third.generation_throughput == 0.0
    m["ttft"].labels("a").observe(0.05)  # type: ignore[attr-defined]
    fourth = reader.read(generate_latest(registry).decode(), now=16.0)
    assert fourth.time_to_first_token_seconds["all"].count == 1
    assert fourth.time_to_first_token_seconds["all"].p95 == pytest.approx(0.1 * 0.95)


def test_text_without_vllm_names_says_so() -> None:
    registry = CollectorRegistry()
    Gauge("process_open_fds", "", registry=registry).set(3)
    assert not parse_metrics(generate_latest(registry).decode()).vllm_names
    registry, m = _registry()
    m["running"].labels("a").set(0)  # type: ignore[attr-defined]
    assert parse_metrics(generate_latest(registry).decode()).vllm_names
