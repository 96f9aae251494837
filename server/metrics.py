"""Prometheus metrics under vLLM's names and types, plus this engine's own under paged_llm:."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from paged_llm.protocol import metrics as names
from paged_llm.protocol.priority import PRIORITY_NAMES

if TYPE_CHECKING:
    from paged_llm.engine.api import RequestTiming

    from .host import EngineHost

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _SnapshotCollector(Collector):
    """Gauges and counters read from the engine's latest snapshot at scrape time."""

    def __init__(self, host: EngineHost) -> None:
        """Read from ``host``'s engine."""
        self._host = host

    def collect(self) -> Iterator[Metric]:
        """Yield one family per figure, labelled with the model name."""
        snap = self._host.metrics()
        if snap is None:
            return
        label = [self._host.model_name]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(name, doc, labels=[names.MODEL_LABEL])
            family.add_metric(label, value)
            return family

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            family = CounterMetricFamily(name, doc, labels=[names.MODEL_LABEL])
            family.add_metric(label, value)
            return family

        yield gauge(
            names.NUM_REQUESTS_RUNNING, "Requests in the running batch.", snap.num_requests_running
        )
        yield gauge(
            names.NUM_REQUESTS_WAITING, "Requests waiting to run.", snap.num_requests_waiting
        )
        yield gauge(
            names.KV_CACHE_USAGE_PERC, "KV-cache usage, 1 means full.", snap.kv_cache_usage_perc
        )
        yield counter(names.NUM_PREEMPTIONS, "Preemptions.", snap.num_preemptions)
        yield counter(
            names.PREFIX_CACHE_QUERIES, "Prompt tokens looked up.", snap.prefix_cache_queries
        )
        yield counter(
            names.PREFIX_CACHE_HITS, "Prompt tokens found cached.", snap.prefix_cache_hits
        )
        yield counter(names.PROMPT_TOKENS, "Prefilled prompt tokens.", snap.prompt_tokens_total)
        yield counter(names.GENERATION_TOKENS, "Generated tokens.", snap.generation_tokens_total)
        yield gauge(names.KV_BLOCKS_TOTAL, "KV blocks in the pool.", snap.kv_blocks_total)
        yield gauge(names.KV_BLOCKS_USED, "KV blocks held by requests.", snap.kv_blocks_used)
        yield gauge(
            names.KV_BLOCKS_CACHED,
            "Free KV blocks still holding a cached prefix.",
            snap.kv_blocks_cached,
        )
        yield gauge(
            names.GENERATION_THROUGHPUT,
            "Generated tokens per second over the recent window.",
            snap.generation_throughput,
        )
        waiting = GaugeMetricFamily(
            names.NUM_REQUESTS_WAITING_BY_CLASS,
            "Requests waiting, by priority class.",
            labels=[names.MODEL_LABEL, names.PRIORITY_LABEL],
        )
        for cls in PRIORITY_NAMES:
            waiting.add_metric([*label, cls], snap.num_requests_waiting_by_class.get(cls, 0))
        yield waiting


class ServerMetrics:
    """The process registry: the snapshot figures and per-request histograms."""

    def __init__(self, host: EngineHost) -> None:
        """Register every metric for ``host``'s model."""
        # vLLM exposes no ``_created`` series; neither does this process.
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(_SnapshotCollector(host))
        model = [names.MODEL_LABEL]
        by_class = [names.MODEL_LABEL, names.PRIORITY_LABEL]
        self._model = host.model_name

        def histogram(
            name: str, doc: str, labels: list[str], buckets: tuple[float, ...]
        ) -> Histogram:
            return Histogram(name, doc, labels, buckets=buckets, registry=self.registry)

        ttft_doc = "Time to first token in seconds"
        queue_doc = "Time waiting before first being scheduled, in seconds"
        self.ttft = histogram(names.TIME_TO_FIRST_TOKEN, ttft_doc, model, names.TTFT_BUCKETS)
        self.queue_time = histogram(
            names.REQUEST_QUEUE_TIME, queue_doc, model, names.LATENCY_BUCKETS
        )
        self.e2e = histogram(
            names.E2E_REQUEST_LATENCY,
            "End-to-end request latency in seconds",
            model,
            names.LATENCY_BUCKETS,
        )
        self.class_ttft = histogram(
            names.CLASS_TIME_TO_FIRST_TOKEN, f"{ttft_doc}, by class", by_class, names.TTFT_BUCKETS
        )
        self.class_queue = histogram(
            names.CLASS_QUEUE_TIME, f"{queue_doc}, by class", by_class, names.LATENCY_BUCKETS
        )
        self.success = Counter(
            names.REQUEST_SUCCESS,
            "Finished requests by finish reason.",
            [names.MODEL_LABEL, "finished_reason"],
            registry=self.registry,
        )
        # Every class shows from the start, so a dashboard needs no request first.
        for cls in PRIORITY_NAMES:
            self.class_ttft.labels(self._model, cls)
            self.class_queue.labels(self._model, cls)
        self.ttft.labels(self._model)
        self.queue_time.labels(self._model)
        self.e2e.labels(self._model)

    def observe(self, priority: str, timing: RequestTiming, finish_reason: str) -> None:
        """Record one finished request's latencies."""
        if timing.time_to_first_token is not None:
            self.ttft.labels(self._model).observe(timing.time_to_first_token)
            self.class_ttft.labels(self._model, priority).observe(timing.time_to_first_token)
        if timing.queue_time is not None:
            self.queue_time.labels(self._model).observe(timing.queue_time)
            self.class_queue.labels(self._model, priority).observe(timing.queue_time)
        if timing.finished is not None:
            self.e2e.labels(self._model).observe(timing.finished - timing.arrival)
        self.success.labels(self._model, finish_reason).inc()

    def render(self) -> bytes:
        """The text exposition format."""
        return generate_latest(self.registry)
