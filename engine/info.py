"""What a running engine is: its model, weights, KV pool and limits, read-only for hosts."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class EngineInfo:
    """The loaded model and the pool sized for it; fixed for the engine's life."""

    model: str
    device: str
    dtype: str
    # How the weights are kept ("float", "q8 (...)", a GGUF file's types kept in place).
    weights: str
    # How attention, the KV cache and the forward run, in words for logs and diagnostics.
    attention: str
    kv_cache: str
    forward: str
    block_size: int
    # Bytes one block of K and V takes across every layer.
    block_bytes: int
    num_kv_blocks: int
    max_model_len: int
    eos_token_ids: tuple[int, ...]

    @property
    def pool_tokens(self) -> int:
        """Tokens the KV pool holds."""
        return self.num_kv_blocks * self.block_size

    @property
    def max_request_tokens(self) -> int:
        """The most tokens one request can hold: the context, or the whole pool if smaller."""
        return min(self.max_model_len, self.pool_tokens)

    @property
    def blocks_per_sequence(self) -> int:
        """Blocks one sequence of the full context takes."""
        return -(-self.max_model_len // self.block_size)
