"""One-request and 32-at-once decode speed of the bundled model by weight format, side by side.

``scripts/bench weights [--dtype auto] [--formats float,q4,q8]``: loads
the model once per format and alternates the formats round by round, so a busy machine
skews them alike; prints the best round of each.
"""

from __future__ import annotations

import sys
import time

from paged_llm.engine.config import EngineConfig
from paged_llm.engine.core.sequence import SamplingParams
from paged_llm.engine.llm_engine import LLMEngine
from paged_llm.engine.model.loader import load_model

from . import ROOT, argument_parser
from .machine import step_until_decoding


def decode_rate(engine: LLMEngine, batch: int, tokens: int) -> float:
    """Generated tokens per second of ``batch`` 64-token prompts decoding together."""
    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    for i in range(batch):
        engine.add_request(list(range(1000 + i, 1064 + i)), params, request_id=f"r{i}")
    step_until_decoding(engine)  # prefill and first token, not timed
    started, produced = time.perf_counter(), 0
    while engine.has_unfinished():
        produced += sum(len(out.token_ids) for out in engine.step())
    return produced / (time.perf_counter() - started)


def main(argv: list[str] | None = None) -> None:
    """Parse arguments, load each format, alternate rounds, print the best of each."""
    parser = argument_parser("weights", __doc__)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--formats", default="float,q4,q8")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batches", default="1,32")
    args = parser.parse_args(argv)
    engines = {}
    for fmt in args.formats.split(","):
        config = EngineConfig(
            device="cpu", dtype=args.dtype, weights=fmt, cache_dir=ROOT / ".cache" / "converted"
        )
        loaded = load_model(config)
        engines[fmt] = LLMEngine(loaded, config)
        print(f"{fmt}: {loaded.dtype}, weights {loaded.weights}", flush=True)
    best: dict[tuple[str, int], float] = {}
    for _ in range(args.rounds):
        for batch in (int(b) for b in args.batches.split(",")):
            for fmt, engine in engines.items():
                rate = decode_rate(engine, batch, 32)
                best[fmt, batch] = max(best.get((fmt, batch), 0.0), rate)
    for (fmt, batch), rate in sorted(best.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        print(f"batch {batch:3d}  {fmt:6s} {rate:8.1f} tokens/s")


if __name__ == "__main__":
    sys.exit(main())
