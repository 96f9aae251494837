"""Tokenizers and chat templates read from a model file, without transformers."""
