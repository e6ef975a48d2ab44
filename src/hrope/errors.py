"""The one base class of every error that reports bad input.

An :class:`InputError` means the caller gave something invalid (a shape, a value, a config key, a
file); its message is one line that names what was wrong. The ``hrope`` command prints such errors
as one line on stderr and exits with status 2; any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import torch

__all__ = ["InputError", "EncodingError", "checks_values"]


class InputError(ValueError):
    """Bad input (shape, value, config, file contents); the message says what and where, in one line."""


class EncodingError(InputError):
    """Invalid input to an encoding (shapes, missing or malformed parameters)."""


def checks_values() -> bool:
    """Whether data-dependent input checks (finite values, positive depths, proper rotations, ...) run:
    always, except while ``torch.compile`` traces, where each would break the graph (and wait for
    the device); shape, dtype and device checks run there too."""
    return not torch.compiler.is_compiling()
