"""A torch-free client for OpenAI-compatible servers and their Prometheus metrics."""

from .errors import (
    AuthenticationError,
    CannotConnectError,
    ClientError,
    RequestError,
    ServerError,
)
from .metrics import MetricsReader, parse_metrics
from .openai import ChatChunk, ModelInfo, OpenAIClient, ToolCall, Usage, chat_request

__all__ = [
    "AuthenticationError",
    "CannotConnectError",
    "ChatChunk",
    "ClientError",
    "MetricsReader",
    "ModelInfo",
    "OpenAIClient",
    "RequestError",
    "ServerError",
    "ToolCall",
    "Usage",
    "chat_request",
    "parse_metrics",
]
