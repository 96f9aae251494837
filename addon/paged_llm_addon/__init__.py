"""The Paged LLM add-on's program: its options become a `paged-llm serve` it runs and announces."""
