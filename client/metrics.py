"""Prometheus text with vLLM's metric names, read into the engine's own snapshot shape."""

from __future__ import annotations

import math
import time
from collections import defaultdict
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from paged_llm.protocol import metrics as names
from paged_llm.protocol.snapshot import EngineState, MetricsSnapshot, Percentiles

VLLM = "vllm:"
ENGINE = "paged_llm:"
CLASS_LABEL = names.PRIORITY_LABEL
# The key of a latency family without classes (vLLM's).
ALL_CLASSES = "all"
HISTOGRAMS = tuple(
    name.removeprefix(VLLM)
    for name in (names.TIME_TO_FIRST_TOKEN, names.REQUEST_QUEUE_TIME, names.E2E_REQUEST_LATENCY)
)


@dataclass(slots=True)
class Histogram:
    """One histogram's cumulative buckets (upper bound -> count), sum and count."""

    buckets: dict[float, float] = field(default_factory=dict)
    count: float = 0.0

    def minus(self, earlier: Histogram | None) -> Histogram:
        """What was observed since ``earlier`` (a counter reset counts from zero)."""
        if earlier is None or earlier.count > self.count:
            return self
        return Histogram(
            {le: n - earlier.buckets.get(le, 0.0) for le, n in self.buckets.items()},
            self.count - earlier.count,
        )

    def quantile(self, q: float) -> float | None:
        """Prometheus' histogram_quantile: linear within the bucket holding the rank."""
        if self.count <= 0 or not self.buckets:
            return None
        rank = q * self.count
        lower, below = 0.0, 0.0
        for upper, cumulative in sorted(self.buckets.items()):
            if cumulative >= rank:
                if math.isinf(upper):
                    return lower
                inside = cumulative - below
                share = (rank - below) / inside if inside > 0 else 1.0
                return lower + (upper - lower) * share
            lower, below = upper, cumulative
        return lower

    def percentiles(self) -> Percentiles:
        """p50 and p95 of what this histogram holds."""
        return Percentiles(self.quantile(0.5), self.quantile(0.95), int(self.count))


@dataclass(slots=True)
class Scrape:
    """The figures of one ``/metrics`` text that the snapshot needs, summed over models."""

    values: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    by_class: dict[str, dict[str, float]] = field(default_factory=lambda: defaultdict(dict))
    histograms: dict[str, dict[str, Histogram]] = field(default_factory=lambda: defaultdict(dict))
    time: float = 0.0

    @property
    def vllm_names(self) -> bool:
        """Whether the text had any of vLLM's figures (a server without them gives no sensors)."""
        return any(name.startswith(VLLM) for name in self.values) or bool(self.histograms)


def parse_metrics(text: str, model: str | None = None, now: float | None = None) -> Scrape:
    """Read vLLM's families (and this engine's ``paged_llm:`` ones); other models' skipped."""
    scrape = Scrape(time=time.monotonic() if now is None else now)
    for family in text_string_to_metric_families(text):
        if not family.name.startswith((VLLM, ENGINE)):
            continue
        for sample in family.samples:
            labels = sample.labels
            if model is not None and labels.get(names.MODEL_LABEL, model) != model:
                continue
            name = sample.name
            klass = labels.get(CLASS_LABEL, ALL_CLASSES)
            base = family.name.removeprefix(VLLM).removeprefix(ENGINE)
            if family.type == "histogram" and base in HISTOGRAMS:
                hist = scrape.histograms[base].setdefault(klass, Histogram())
                if name.endswith("_bucket"):
                    le = float(labels["le"])
                    hist.buckets[le] = hist.buckets.get(le, 0.0) + sample.value
                elif name.endswith("_count"):
                    hist.count += sample.value
            elif family.type == "histogram":
                continue
            elif CLASS_LABEL in labels:
                scrape.by_class[name][klass] = scrape.by_class[name].get(klass, 0) + sample.value
            else:
                scrape.values[name] += sample.value
    return scrape


def _first(values: dict[str, float], *names: str) -> float:
    """The first of ``names`` the scrape has (vLLM renamed some figures over time)."""
    for name in names:
        if name in values:
            return values[name]
    return 0.0


class MetricsReader:
    """Turns successive scrapes into snapshots: latencies and rates over the last interval."""

    def __init__(self, model: str | None = None) -> None:
        """Read the figures of ``model`` (all models when None)."""
        self.model = model
        self._previous: Scrape | None = None
        self._latencies: dict[str, dict[str, Percentiles]] = {}
        self._throughput = 0.0
        self.vllm_names = False
        self._prompt_throughput = 0.0

    def read(self, text: str, now: float | None = None) -> MetricsSnapshot:
        """The snapshot of one ``/metrics`` text."""
        scrape = parse_metrics(text, self.model, now)
        previous, self._previous = self._previous, scrape
        self.vllm_names = scrape.vllm_names
        v = scrape.values
        generated = _first(v, f"{names.GENERATION_TOKENS}_total")
        if previous is not None and scrape.time > previous.time:
            delta = generated - _first(previous.values, f"{names.GENERATION_TOKENS}_total")
            self._throughput = max(delta, 0.0) / (scrape.time - previous.time)
            read = _first(v, "vllm:prompt_tokens_total") - _first(
                previous.values, "vllm:prompt_tokens_total"
            )
            self._prompt_throughput = max(read, 0.0) / (scrape.time - previous.time)
        for name, classes in scrape.histograms.items():
            earlier = previous.histograms.get(name, {}) if previous else {}
            family = self._latencies.setdefault(name, {})
            for klass, hist in classes.items():
                recent = hist.minus(earlier.get(klass))
                # Nothing new since the last scrape: keep showing the last interval's figure.
                if recent.count > 0 or klass not in family:
                    family[klass] = recent.percentiles()
        waiting_by_class = {
            k: int(n)
            for k, n in scrape.by_class.get(names.NUM_REQUESTS_WAITING_BY_CLASS, {}).items()
        }
        blocks_total = int(_first(v, names.KV_BLOCKS_TOTAL))
        # Older vLLM releases called it gpu_cache_usage_perc.
        usage = _first(v, names.KV_CACHE_USAGE_PERC, "vllm:gpu_cache_usage_perc")
        return MetricsSnapshot(
            timestamp=scrape.time,
            kv_blocks_used=int(_first(v, names.KV_BLOCKS_USED)),
            kv_blocks_total=blocks_total,
            kv_blocks_cached=int(_first(v, names.KV_BLOCKS_CACHED)),
            kv_cache_usage_perc=usage,
            num_requests_running=int(_first(v, names.NUM_REQUESTS_RUNNING)),
            num_requests_waiting=int(_first(v, names.NUM_REQUESTS_WAITING)),
            num_requests_waiting_by_class=waiting_by_class,
            num_preemptions=int(_first(v, f"{names.NUM_PREEMPTIONS}_total")),
            prefix_cache_queries=int(_first(v, f"{names.PREFIX_CACHE_QUERIES}_total")),
            prefix_cache_hits=int(_first(v, f"{names.PREFIX_CACHE_HITS}_total")),
            prompt_tokens_total=int(_first(v, f"{names.PROMPT_TOKENS}_total")),
            generation_tokens_total=int(generated),
            num_requests_finished=int(_first(v, f"{names.REQUEST_SUCCESS}_total")),
            time_to_first_token_seconds=dict(self._latencies.get(HISTOGRAMS[0], {})),
            request_queue_time_seconds=dict(self._latencies.get(HISTOGRAMS[1], {})),
            e2e_request_latency_seconds=dict(self._latencies.get(HISTOGRAMS[2], {})),
            generation_throughput=self._throughput,
            prompt_throughput=self._prompt_throughput,
            engine_state=self._state(v),
        )

    def _state(self, values: dict[str, float]) -> EngineState:
        """The server's state as far as its counters tell: busy reading, generating or idle."""
        running = _first(values, "vllm:num_requests_running")
        if not running and not _first(values, "vllm:num_requests_waiting"):
            return EngineState.IDLE
        if self._prompt_throughput > 0 and self._throughput == 0:
            return EngineState.READING_PROMPTS
        return EngineState.GENERATING
