"""Typed errors shared across packages, each mapped to TGI's HTTP status and `error_type`."""

from __future__ import annotations


class PytgiError(Exception):
    status_code = 500
    error_type = "generation"

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class ValidationError(PytgiError):
    """Bad user input (TGI: 422 `validation`)."""

    status_code = 422
    error_type = "validation"


class OverloadedError(PytgiError):
    """Too many concurrent requests (TGI: 429 `overloaded`)."""

    status_code = 429
    error_type = "overloaded"

    def __init__(self, message: str = "Model is overloaded"):
        super().__init__(message)


class GenerationError(PytgiError):
    """The engine failed while running a request (TGI: 424 `generation`)."""

    status_code = 424
    error_type = "generation"


class IncompleteGenerationError(PytgiError):
    """A stream ended without a final token (TGI: 500 `incomplete_generation`)."""

    status_code = 500
    error_type = "incomplete_generation"


class TemplateError(PytgiError):
    """Chat template rendering failed (TGI: 422 `template_error`)."""

    status_code = 422
    error_type = "template_error"


class ToolError(PytgiError):
    status_code = 422
    error_type = "tool_error"


class EngineDeadError(PytgiError):
    """The engine process is gone; the server is unhealthy."""

    status_code = 500
    error_type = "generation"

    def __init__(self, message: str = "Engine is not running"):
        super().__init__(message)


class ModelLoadError(PytgiError):
    """The model cannot be resolved or loaded (start-up error, reported with the offending name)."""


class ConfigError(PytgiError):
    """An invalid combination of launcher flags (start-up error, TGI's texts)."""
