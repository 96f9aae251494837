"""The server keeps what its model load left alive out of the cyclic collector's scans."""

from __future__ import annotations

import gc
from pathlib import Path

from paged_llm.engine.config import EngineConfig
from paged_llm.server.host import EngineHost
from paged_llm.server.serve import load


async def test_loading_freezes_the_objects_the_load_left(tiny_model_dir: Path) -> None:
    gc.unfreeze()
    config = EngineConfig(model=str(tiny_model_dir), device="cpu", dtype="float32", kv_budget=2**20)
    host = EngineHost(config)
    try:
        assert gc.get_freeze_count() == 0
        await load(host)
        assert host.ready
        assert gc.get_freeze_count() > 0
    finally:
        await host.stop()
        gc.unfreeze()  # the rest of the test session collects as before
