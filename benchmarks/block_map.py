"""Time a block-map snapshot of a large KV pool: what a live card costs the engine thread.

Run: ``scripts/bench block_map [--blocks 1000 10000 50000] [--repeat 200] [--json]``.
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import time

from paged_llm.engine.core.kv.block_map import BlockMap, take_block_map
from paged_llm.engine.core.kv.paged import KVCacheManager
from paged_llm.engine.core.sequence import Priority, SamplingParams, Sequence, SequenceStatus

from . import argument_parser


def fill_pool(
    num_blocks: int, block_size: int, seed: int = 0
) -> tuple[KVCacheManager, list[Sequence]]:
    """A pool that looks busy: a shared prompt, three classes, finished requests' cached blocks.

    About a tenth of the blocks stay free, a fifth hold cached prefixes of finished
    requests, and the rest are held, a shared system prompt among them.
    """
    rng = random.Random(seed)
    kv = KVCacheManager(num_blocks, block_size)
    system = [rng.randrange(1, 30000) for _ in range(block_size * 24)]
    running: list[Sequence] = []
    n = 0
    target_used = int(num_blocks * 0.7)
    target_cached = int(num_blocks * 0.2)
    finished_blocks = 0
    while True:
        n += 1
        priority = Priority(n % 3)
        own = rng.randrange(block_size, block_size * 60)
        prompt = (system if priority is not Priority.BACKGROUND else []) + [
            rng.randrange(1, 30000) for _ in range(own)
        ]
        seq = Sequence(f"r{n}", prompt, SamplingParams(max_tokens=16), priority, 0.0)
        need = -(-len(prompt) // block_size)
        if need + 1 > kv.num_free_blocks:
            break
        computed = kv.get_computed_blocks(seq)
        if not kv.allocate_slots(seq, len(prompt) - computed.num_tokens, computed):
            break
        seq.num_computed_tokens = len(prompt)
        seq.status = SequenceStatus.RUNNING
        kv.cache_blocks(seq)
        if finished_blocks < target_cached and n % 4 == 0:
            finished_blocks += len(kv.block_table(seq))
            kv.free(seq)
            continue
        running.append(seq)
        if kv.num_used_blocks >= target_used:
            break
    return kv, running


def measure(kv: KVCacheManager, running: list[Sequence], repeat: int) -> dict[str, float]:
    """Median and p95 milliseconds of a snapshot, and of its JSON encoding."""
    take_ms: list[float] = []
    encode_ms: list[float] = []
    block_map: BlockMap | None = None
    for _ in range(repeat):
        start = time.perf_counter()
        block_map = take_block_map(kv, running, num_waiting=0, num_preemptions=0)
        middle = time.perf_counter()
        json.dumps(block_map.as_dict())
        end = time.perf_counter()
        take_ms.append((middle - start) * 1e3)
        encode_ms.append((end - middle) * 1e3)
    assert block_map is not None
    assert block_map.used == kv.num_used_blocks
    assert block_map.cached + block_map.free == kv.num_free_blocks
    take_ms.sort()
    encode_ms.sort()
    return {
        "blocks": block_map.num_blocks,
        "used": block_map.used,
        "cached": block_map.cached,
        "free": block_map.free,
        "shared": block_map.shared,
        "running": len(running),
        "take_ms_p50": statistics.median(take_ms),
        "take_ms_p95": take_ms[int(0.95 * (len(take_ms) - 1))],
        "encode_ms_p50": statistics.median(encode_ms),
        "json_bytes": len(json.dumps(block_map.as_dict())),
    }


def main(argv: list[str] | None = None) -> None:
    """Print the cost of a snapshot for each pool size asked."""
    parser = argument_parser("block_map", __doc__)
    parser.add_argument("--blocks", type=int, nargs="+", default=[1000, 10000, 50000])
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--json", action="store_true", help="print one JSON object per size")
    args = parser.parse_args(argv)
    for num_blocks in args.blocks:
        kv, running = fill_pool(num_blocks, args.block_size)
        result = measure(kv, running, args.repeat)
        if args.json:
            print(json.dumps(result))
            continue
        print(
            f"{result['blocks']:>6} blocks ({result['used']} used by {result['running']} "
            f"sequences, {result['shared']} shared, {result['cached']} cached, "
            f"{result['free']} free): snapshot p50 {result['take_ms_p50']:.3f} ms, "
            f"p95 {result['take_ms_p95']:.3f} ms; JSON encoding p50 "
            f"{result['encode_ms_p50']:.3f} ms, {result['json_bytes']} bytes"
        )


if __name__ == "__main__":
    sys.exit(main())
