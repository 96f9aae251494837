"""Code the engine's server, its remote client and the integration share; imports no torch."""
