"""Errors the engine raises; each carries a stable code the integration translates."""

from __future__ import annotations


class EngineError(Exception):
    """Base class of every error the engine raises on purpose."""

    code: str = "engine_error"


class InvalidSamplingParams(EngineError, ValueError):
    """A sampling parameter is out of range or of the wrong type."""

    code = "invalid_sampling_params"


class InvalidArgument(EngineError, TypeError, ValueError):
    """An argument of a public entry point has the wrong type or form; ``argument`` names it."""

    code = "invalid_argument"

    def __init__(self, argument: str, message: str) -> None:
        super().__init__(message)
        self.argument = argument


class RequestRejected(EngineError):
    """Admission control refused a request; ``code`` says which limit it hit."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class ModelLoadError(EngineError):
    """The model could not be loaded; the message names the model and the cause."""

    code = "model_load_failed"


class UnsupportedModelError(ModelLoadError):
    """The model needs an attention feature or architecture the engine does not run exactly."""

    code = "unsupported_model"

    def __init__(self, message: str, feature: str) -> None:
        super().__init__(message)
        self.feature = feature


class EngineDeadError(EngineError):
    """The engine's step loop crashed or was stopped; no request can be served."""

    code = "engine_dead"


class KVBudgetError(EngineError):
    """The KV memory budget cannot hold even one sequence of the model's full length."""

    code = "kv_budget_too_small"
