"""Paged LLM: a paged-KV LLM serving engine, its OpenAI-compatible server and shared protocol."""
