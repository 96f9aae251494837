"""Helpers the tests share: cached tiny models, GGUF writers, server processes."""
