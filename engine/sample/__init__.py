"""Sampling a step's next tokens: the sampler and the penalties applied before it."""
