"""The OpenAI-compatible HTTP server and the ``paged-llm`` command; the engine loads lazily."""
