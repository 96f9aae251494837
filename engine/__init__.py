"""The Paged LLM serving engine: paged KV pool, scheduler, model runner, async engine."""
