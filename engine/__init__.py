"""The Paged LLM serving engine: paged KV pool, scheduler, model runners, async engine.

The engine core imports no torch: the numpy runner serves GGUF files on the CPU without it,
and the torch path's entry modules (engine/model/loader.py, runner.py) say what to install
when it is missing.
"""
