"""OpenAI's error JSON, and the error an API request fails with."""

from __future__ import annotations

from typing import Any

# OpenAI's error ``type`` for each HTTP status this API returns.
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    500: "server_error",
    503: "server_error",
}


class ApiError(Exception):
    """A request the API refuses: HTTP status, message, the bad field and a stable code."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        retry_after: int | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.retry_after = retry_after

    def body(self) -> dict[str, Any]:
        """The error as OpenAI's JSON body."""
        return error_body(self.status, self.message, param=self.param, code=self.code)


def error_body(
    status: int, message: str, *, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """``{"error": {...}}`` in OpenAI's shape."""
    return {
        "error": {
            "message": message,
            "type": _TYPES.get(status, "invalid_request_error" if status < 500 else "server_error"),
            "param": param,
            "code": code,
        }
    }


def bad_field(param: str, message: str) -> ApiError:
    """A 400 naming the field that is wrong."""
    return ApiError(400, f"{param}: {message}", param=param, code="invalid_value")
