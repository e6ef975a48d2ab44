"""What a transform computes float16 / bfloat16 tensors in (docs/encodings.md, "Numerics in half precision")."""

from __future__ import annotations

import torch

from ..errors import EncodingError
from ..geometry import geometry_dtype

__all__ = ["PRECISIONS", "transform_dtype", "check_precision"]

# What a transform computes float16 / bfloat16 tensors in (docs/encodings.md, "Numerics in half
# precision"): "float32" (the tables stay float32 and each result is rounded to the tensor's dtype
# once) or "input" (the tables are cast to the tensor's dtype). float32 and float64 tensors are
# computed in their own dtype either way.
PRECISIONS = ("float32", "input")


def transform_dtype(dtype: torch.dtype, precision: str) -> torch.dtype:
    """The dtype a transform with ``precision`` (:data:`PRECISIONS`) computes tensors of ``dtype`` in."""
    return geometry_dtype(dtype) if precision == "float32" else dtype


def check_precision(precision: str) -> None:
    """``precision`` is one of :data:`PRECISIONS` (one-line :class:`EncodingError` otherwise)."""
    if precision not in PRECISIONS:
        raise EncodingError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
