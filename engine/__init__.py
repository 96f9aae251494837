"""The Paged LLM serving engine: paged KV pool, scheduler, model runner, async engine."""

from paged_llm.extras import require_engine_extra

require_engine_extra(__name__)
