"""The error of the parameter sources (declared with the config, which checks their options)."""

from __future__ import annotations

from ..config.fields import PredictorError

__all__ = ["PredictorError"]
