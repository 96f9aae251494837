"""The engine's core: requests, the waiting queue, the scheduler, step costs and KV blocks."""
