"""Prometheus metric names the server exposes and the remote client reads (vLLM's where shared)."""

from __future__ import annotations

MODEL_LABEL = "model_name"
PRIORITY_LABEL = "priority"

# vLLM's names and types: a dashboard reads this server and vLLM alike.
NUM_REQUESTS_RUNNING = "vllm:num_requests_running"  # gauge
NUM_REQUESTS_WAITING = "vllm:num_requests_waiting"  # gauge
KV_CACHE_USAGE_PERC = "vllm:kv_cache_usage_perc"  # gauge, 0 to 1
NUM_PREEMPTIONS = "vllm:num_preemptions"  # counter (exposed as ..._total)
PREFIX_CACHE_QUERIES = "vllm:prefix_cache_queries"  # counter, tokens
PREFIX_CACHE_HITS = "vllm:prefix_cache_hits"  # counter, tokens
PROMPT_TOKENS = "vllm:prompt_tokens"  # counter
GENERATION_TOKENS = "vllm:generation_tokens"  # counter
TIME_TO_FIRST_TOKEN = "vllm:time_to_first_token_seconds"  # histogram
REQUEST_QUEUE_TIME = "vllm:request_queue_time_seconds"  # histogram
E2E_REQUEST_LATENCY = "vllm:e2e_request_latency_seconds"  # histogram
REQUEST_SUCCESS = "vllm:request_success"  # counter, label finished_reason

# This engine's own.
KV_BLOCKS_TOTAL = "paged_llm:kv_blocks_total"  # gauge
KV_BLOCKS_USED = "paged_llm:kv_blocks_used"  # gauge
KV_BLOCKS_CACHED = "paged_llm:kv_blocks_cached"  # gauge: free but holding a cached prefix
NUM_REQUESTS_WAITING_BY_CLASS = "paged_llm:num_requests_waiting_by_class"  # gauge, priority
CLASS_QUEUE_TIME = "paged_llm:request_queue_time_seconds"  # histogram, priority
CLASS_TIME_TO_FIRST_TOKEN = "paged_llm:time_to_first_token_seconds"  # histogram, priority
GENERATION_THROUGHPUT = "paged_llm:generation_tokens_per_second"  # gauge, recent window

# vLLM's bucket bounds, so histograms line up on one dashboard.
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
    120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
