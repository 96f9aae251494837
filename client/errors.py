"""What a request to an OpenAI-compatible server can fail with, by cause."""

from __future__ import annotations


class ClientError(Exception):
    """Base class: the server could not be used for this request."""

    code = "client_error"


class CannotConnectError(ClientError):
    """The server did not answer: refused, unreachable, timed out, or closed mid-answer."""

    code = "cannot_connect"


class AuthenticationError(ClientError):
    """The server refused the API key (HTTP 401 or 403)."""

    code = "invalid_auth"


class RequestError(ClientError):
    """The server refused this request (HTTP 4xx): ``param`` names the bad field if it said."""

    code = "bad_request"

    def __init__(
        self, status: int, message: str, *, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.param = param
        self.error_code = code


class ServerError(ClientError):
    """The server failed or is overloaded (HTTP 5xx); ``retry_after`` in seconds if given."""

    code = "server_error"

    def __init__(
        self,
        status: int,
        message: str,
        *,
        retry_after: float | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after
        self.error_code = code

    @property
    def loading(self) -> bool:
        """Whether the server said it is loading its model (503 then), not that it is full."""
        return self.status == 503 and (
            self.error_code == "model_not_ready" or "loading" in str(self).lower()
        )
