"""What the server is told at start: where to listen, who may call it, and its limits."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from paged_llm.net import is_loopback

_LOGGER = logging.getLogger(__name__)

API_KEY_ENV = "PAGED_LLM_API_KEY"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
DEFAULT_BODY_LIMIT = 4 * 2**20


@dataclass(slots=True)
class ServerSettings:
    """Listening address, authentication and limits of one server process."""

    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    api_key: str | None = None
    no_auth: bool = False
    served_model_name: str | None = None
    max_body_bytes: int = DEFAULT_BODY_LIMIT
    grace_seconds: float = 30.0
    retry_after_seconds: int = 1

    def check(self) -> None:
        """Refuse to listen beyond loopback without a key unless --no-auth says so."""
        if self.max_body_bytes < 1024:
            raise ValueError(f"max_body_bytes must be >= 1024, got {self.max_body_bytes}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be 0..65535, got {self.port}")
        if self.api_key is not None and not self.api_key.strip():
            raise ValueError("the API key is empty")
        if self.api_key or is_loopback(self.host):
            return
        if not self.no_auth:
            raise ValueError(
                f"listening on {self.host} makes the server reachable from other machines: "
                f"set an API key (--api-key or {API_KEY_ENV}) or pass --no-auth to accept that"
            )
        _LOGGER.warning(
            "Listening on %s without an API key (--no-auth): anyone who reaches this "
            "address can use the model",
            self.host,
        )
