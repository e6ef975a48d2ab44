"""The one base class of every error that reports bad input.

An :class:`InputError` means the caller gave something invalid (a shape, a value, a config key, a
file); its message is one line that names what was wrong. The ``hrope`` command prints such errors
as one line on stderr and exits with status 2; any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

__all__ = ["InputError", "EncodingError"]


class InputError(ValueError):
    """Bad input (shape, value, config, file contents); the message says what and where, in one line."""


class EncodingError(InputError):
    """Invalid input to an encoding (shapes, missing or malformed parameters)."""
