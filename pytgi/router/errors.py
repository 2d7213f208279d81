"""Router-side constructors for typed errors, so every message carries TGI's prefix
(TGI_COMPATIBILITY.md §4)."""

from __future__ import annotations

from pytgi.errors import GenerationError, IncompleteGenerationError, ToolError, ValidationError


def input_error(message: str) -> ValidationError:
    """422 `validation`: "Input validation error: <message>" (TGI's `InferError` display)."""
    return ValidationError(f"Input validation error: {message}")


def generation_error(detail: str) -> GenerationError:
    """424 `generation`: the engine failed this request."""
    return GenerationError(f"Request failed during generation: {detail}")


def tool_error(message: str) -> ToolError:
    """422 `tool_error`: "Tool error: <message>"."""
    return ToolError(f"Tool error: {message}")


class IncompleteStreamError(IncompleteGenerationError):
    """A stream ended without its final token (TGI: `incomplete_generation_stream`)."""

    error_type = "incomplete_generation_stream"

    def __init__(self, message: str = "Incomplete generation stream"):
        super().__init__(message)
