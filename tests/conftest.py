"""Shared fixtures: the bundled tokenizer and tiny random models as local folders."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.support import CACHE, TINY_VERSION, build_tiny_model


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """A tiny random Llama with the SmolLM2 tokenizer, as a local model folder."""
    return build_tiny_model(CACHE / f"tiny-llama-{TINY_VERSION}")
