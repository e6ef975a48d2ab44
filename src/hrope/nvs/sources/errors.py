"""The error of the parameter sources."""

from __future__ import annotations

from ...errors import InputError

__all__ = ["PredictorError"]


class PredictorError(InputError):
    """Invalid predictor configuration or missing inputs (the message says what to supply)."""
