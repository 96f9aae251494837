"""Errors the integration raises, and their translation keys for forms, setup and actions."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from homeassistant.exceptions import HomeAssistantError, ServiceValidationError

from .backend import BackendError
from .const import DOMAIN, LOGGER

# Failed starts with a translation of their own (the engine errors' codes).
_LOAD_ERROR_KEYS = frozenset({"kv_budget_too_small", "unsupported_model", "model_load_failed"})


class TorchUnavailableError(Exception):
    """PyTorch cannot be imported on this system."""


class EngineImportError(Exception):
    """The paged_llm engine cannot be imported (a broken or partial install)."""


def load_error_key(err: BaseException) -> str:
    """The translation key of a failed engine start."""
    if isinstance(err, TorchUnavailableError):
        return "torch_unavailable"
    if isinstance(err, EngineImportError):
        return "engine_unavailable"
    # The engine errors' code, read without importing the engine (a failed import lacks it).
    code = getattr(err, "code", None)
    return code if code in _LOAD_ERROR_KEYS else "engine_start_failed"


def install_error_key(err: BaseException) -> str:
    """The form error of a failed install: what could not be imported after it, else the install."""
    key = load_error_key(err)
    return key if key in ("torch_unavailable", "engine_unavailable") else "engine_install_failed"


def is_transient_load_error(err: BaseException) -> bool:
    """Whether a failed start may succeed later unchanged (memory or network, not settings)."""
    cause: BaseException | None = err
    while cause is not None:
        if isinstance(cause, ConnectionError | TimeoutError | MemoryError):
            return True
        if type(cause).__name__ == "OutOfMemoryError":  # torch's, without importing torch
            return True
        cause = cause.__cause__
    return False


def ha_error(err: BackendError) -> HomeAssistantError:
    """A translated Home Assistant error for a failed request."""
    cls = ServiceValidationError if err.caller else HomeAssistantError
    return cls(
        translation_domain=DOMAIN,
        translation_key=err.key,
        translation_placeholders={"reason": err.reason, **err.placeholders},
    )


def first_failure(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The failure of a group that says most: the first translated or backend error.

    A task group collects its tasks' failures in the order they failed; when several
    parts fail together (the engine stopped under them), they all say the same thing, so
    the first meaningful one stands for the rest.
    """
    leaves: list[BaseException] = []
    pending: list[BaseException] = [group]
    while pending:
        err = pending.pop(0)
        if isinstance(err, BaseExceptionGroup):
            pending[:0] = list(err.exceptions)
        else:
            leaves.append(err)
    for err in leaves:
        if isinstance(err, HomeAssistantError | BackendError):
            return err
    return leaves[0]


def one_error(err: Exception) -> HomeAssistantError:
    """One translated Home Assistant error for any failure of a request, groups included.

    What Home Assistant's service layer, the REST API and Assist show is this one error;
    an unexpected exception is logged with its traceback and named in the message.
    """
    if isinstance(err, BaseExceptionGroup):
        err = first_failure(err)  # type: ignore[assignment]
    if isinstance(err, HomeAssistantError):
        return err
    if isinstance(err, BackendError):
        return ha_error(err)
    LOGGER.error("Generation failed", exc_info=err)
    return HomeAssistantError(
        translation_domain=DOMAIN,
        translation_key="generation_failed",
        translation_placeholders={"reason": str(err) or type(err).__name__},
    )


@contextlib.contextmanager
def raising_one_error() -> Iterator[None]:
    """Let what fails inside leave as :func:`one_error`'s one translated error.

    A HomeAssistantError passes as it is (it is its own translation; ``raise err from err``
    would make it its own cause); cancellation (a stopped automation) passes too.
    """
    try:
        yield
    except HomeAssistantError:
        raise
    except Exception as err:
        raise one_error(err) from err
