"""KV pool sizing: how many blocks a memory budget buys, and whether one sequence fits."""

from __future__ import annotations

from paged_llm.engine.config import EngineConfig
from paged_llm.engine.core.kv.block_pool import cdiv
from paged_llm.engine.errors import KVBudgetError
from paged_llm.engine.model.loaded import LoadedModel, config_kv_dtype_name, kv_bytes_per_block
from paged_llm.engine.model.memory import available_memory

# With max_model_len unset, a pool smaller than this many tokens is an error at start.
AUTO_MIN_MODEL_LEN = 2048


def _mib(num_bytes: int) -> str:
    """Bytes as MiB with enough digits to be non-zero for small test budgets."""
    return f"{num_bytes / 2**20:.3g} MiB"


def plan_kv_pool(config: EngineConfig, loaded: LoadedModel) -> tuple[int, int]:
    """Return (number of KV blocks, max model length) for the budget, or raise KVBudgetError."""
    per_block = kv_bytes_per_block(
        loaded.model.config, config.block_size, config_kv_dtype_name(config, loaded)
    )
    if config.kv_budget > 1:
        budget = int(config.kv_budget)
    else:
        budget = int(available_memory(loaded.device) * config.kv_budget)
    num_blocks = budget // per_block
    capacity = num_blocks * config.block_size
    if config.max_model_len is None:
        # Automatic: the model's context, shortened to what the pool holds, but never below
        # a length that still serves Home Assistant's long system prompt and a document.
        max_len = min(loaded.max_model_len, max(capacity, AUTO_MIN_MODEL_LEN))
    else:
        max_len = config.max_model_len
    if max_len > loaded.max_model_len:
        raise KVBudgetError(f"max_model_len {max_len} is beyond {loaded.context_limit}")
    if capacity < max_len:
        need = cdiv(max_len, config.block_size) * per_block
        raise KVBudgetError(
            f"the KV budget of {_mib(budget)} holds {capacity} tokens "
            f"({num_blocks} blocks of {config.block_size}), less than one sequence of "
            f"max_model_len {max_len} tokens; give at least {_mib(need)} or lower "
            "max_model_len"
        )
    return num_blocks, max_len
