"""Structured output: grammars, JSON bounds, tool-call formats, closing an answer in time."""
