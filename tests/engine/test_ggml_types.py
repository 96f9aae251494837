"""The engine's GGML type table is gguf's, and the CPU path loads a GGUF without gguf."""

from __future__ import annotations

import gguf

from paged_llm.engine.model.ggml_types import BLOCK_SIZES, GGMLType
from paged_llm.engine.model.loader import bundled_gguf_path
from tests.helpers.without_torch import BLOCKED, run_without_torch


def test_the_type_table_is_ggufs() -> None:
    """Every type gguf knows, with its id and block sizes; nothing gguf does not know."""
    ours = {t.name: (t.value, *BLOCK_SIZES[t]) for t in GGMLType}
    theirs = {t.name: (t.value, *gguf.GGML_QUANT_SIZES[t]) for t in gguf.GGMLQuantizationType}
    assert ours == theirs


LOAD = """
from paged_llm.engine.api import EngineConfig
from paged_llm.engine.model.cpu_model import load_cpu_model
import paged_llm.server.serve

loaded = load_cpu_model(EngineConfig(model={path!r}, device="cpu", weights="auto"))
print(loaded.max_model_len, len(loaded.tokenizer.encode("Hello there")))
"""


def test_the_cpu_path_loads_a_gguf_without_importing_gguf() -> None:
    """gguf's import costs a tenth of a first load: the server and the CPU load avoid it."""
    path = str(bundled_gguf_path("SmolLM2-135M-Instruct"))
    result = run_without_torch(LOAD.format(path=path), blocked=(*BLOCKED, "gguf", "yaml"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split()[-2:] == ["8192", "2"]
