"""What a transform and the attention around it compute float16 / bfloat16 tensors in
(docs/encodings.md, "Numerics in half precision").

The precisions (:data:`PRECISIONS`), for half-precision q, k, v:

* ``"auto"`` (the default): the transforms in float32; SDPA in float32 too (q, k, v converted up
  before the transforms, the output rounded to their dtype once) where the transform has
  geometric blocks, whose general b x b tiles (intrinsics, translations, planes) can amplify the
  rounding of the encoded q', k'; where it is made of rotations and per-pair complex scalings only
  (RoPE, the query-frame coefficients), which do not, each encoded tensor is rounded to the dtype
  once and SDPA runs in it (its flash and memory-efficient kernels stay eligible).
* ``"float32"``: the transforms in float32, each result rounded to the tensor's dtype once; SDPA
  in that dtype.
* ``"input"``: the transforms' tables cast to the tensor's dtype and the passes run in it.

float32 and float64 tensors are computed in their own dtype under every precision.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ..errors import EncodingError
from ..geometry import geometry_dtype

__all__ = ["PRECISIONS", "HALF_DTYPES", "transform_dtype", "attention_dtype", "check_precision", "attend_in"]

PRECISIONS = ("auto", "float32", "input")
HALF_DTYPES = (torch.float16, torch.bfloat16)


def transform_dtype(dtype: torch.dtype, precision: str) -> torch.dtype:
    """The dtype a transform with ``precision`` (:data:`PRECISIONS`) computes tensors of ``dtype`` in."""
    return dtype if precision == "input" else geometry_dtype(dtype)


def attention_dtype(dtype: torch.dtype, precision: str, amplifies: bool) -> torch.dtype:
    """The dtype the SDPA around a transform runs in for q, k, v of ``dtype``: float32 for
    half-precision tensors under ``"auto"`` when the transform can amplify rounding
    (``amplifies``: it has geometric blocks), ``dtype`` otherwise."""
    return torch.float32 if precision == "auto" and amplifies and dtype in HALF_DTYPES else dtype


def check_precision(precision: str) -> None:
    """``precision`` is one of :data:`PRECISIONS` (one-line :class:`EncodingError` otherwise)."""
    if precision not in PRECISIONS:
        raise EncodingError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")


def attend_in(dtype: torch.dtype, attention: Callable[..., Tensor], *tensors: Tensor, **sdpa_kwargs: Any) -> Tensor:
    """``attention(*tensors, **sdpa_kwargs)`` computed in ``dtype``: where it is not the first
    tensor's (q's), the tensors and a floating ``attn_mask`` are converted to it, autocast is off
    (it would run SDPA in the half dtype again) and the output is rounded to q's dtype once;
    otherwise the call as it is."""
    if dtype == tensors[0].dtype:
        return attention(*tensors, **sdpa_kwargs)
    mask = sdpa_kwargs.get("attn_mask")
    if isinstance(mask, Tensor) and mask.is_floating_point():
        sdpa_kwargs = {**sdpa_kwargs, "attn_mask": mask.to(dtype)}
    with torch.autocast(tensors[0].device.type, enabled=False):
        return attention(*(x.to(dtype) for x in tensors), **sdpa_kwargs).to(tensors[0].dtype)
