"""2D RoPE applied in place on a projection's output, as one complex multiply per tensor.

The library's RoPE (:class:`~hrope.encodings.HeadLayout`) rotates channel pairs (c, c + F) of the
last 4F channels of a head, ``[a_x | b_x | a_y | b_y]``, by R(θ): (a, b) -> (a cos - b sin,
b cos + a sin), i.e. the complex number a + ib times e^{iθ}. Inside an attention module the
channel order of q and k (and of v and the output o) is free as long as both sides of a dot
product share it: the module permutes the rows of its projection weights (and the columns of the
output projection) so that each pair is adjacent (:func:`interleaved_order`), views the RoPE
channels as complex numbers and multiplies them by e^{±iθ} in place (:func:`rotate_`): one
memory pass over the RoPE channels, none over the others, where the banded product
(:mod:`hrope.encodings.banded`) makes three over the whole head.

Phases ``(P, 2F)``: e^{iθ} per patch (row-major, shared by every view) and frequency, x-axis
frequencies first, the order of the interleaved pairs.
"""

from __future__ import annotations

import functools
from typing import Any, cast

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from ..encodings.layout import patch_index_rope_angles

__all__ = ["COMPLEX", "interleaved_order", "rope_phase", "rotate_"]

COMPLEX = {torch.float32: torch.complex64, torch.float64: torch.complex128}  # dtypes with a complex twin


@functools.lru_cache(maxsize=32)
def interleaved_order(head_dim: int, rope_dim: int, device: torch.device) -> Tensor:
    """``(head_dim,)`` long: internal channel c' of a head holds the library's channel ``order[c']``
    (identity before the RoPE channels; then ``a_x0, b_x0, a_x1, b_x1, ..., a_y0, b_y0, ...``)."""
    F, start = rope_dim // 4, head_dim - rope_dim
    pairs = [start + offset + f for axis in (0, 2 * F) for f in range(F) for offset in (axis, axis + F)]
    return torch.tensor(list(range(start)) + pairs, dtype=torch.long, device=device)


@functools.lru_cache(maxsize=32)
def rope_phase(grid: tuple[int, int], rope_dim: int, base: float, device: torch.device, dtype: torch.dtype) -> Tensor:
    """e^{iθ} ``(P, rope_dim // 2)`` of the library's 2D RoPE
    (:func:`~hrope.encodings.layout.patch_index_rope_angles`), in the interleaved pair order, as
    the complex twin of ``dtype`` (float32 or float64; computed in float64, cached)."""
    angles = patch_index_rope_angles(grid, rope_dim // 4, base=base, device=device).flatten(1)  # (P, 2F)
    return torch.polar(torch.ones_like(angles), angles).to(COMPLEX[dtype])


def _pairs(t: Tensor, phase: Tensor, num_views: int, heads: tuple[int, int], head_dim: int, rope_dim: int) -> Tensor:
    """The RoPE channels of heads [start, stop) of ``t`` (contiguous, tokens ``V * P`` view-major
    after the batch dimension, channels ``heads * head_dim`` last, in any shape) as complex
    ``(B, V, P, stop - start, rope_dim // 2)``."""
    per_head = t.view(t.shape[0], num_views, phase.shape[0], -1, head_dim)[:, :, :, heads[0] : heads[1]]
    pairs = per_head[..., head_dim - rope_dim :]
    return torch.view_as_complex(pairs.reshape(*pairs.shape[:-1], rope_dim // 2, 2))


class _RotateInPlace(torch.autograd.Function):
    """``t`` with the RoPE channels of heads [start, stop) multiplied by ``phase``, in place; the
    gradient is the incoming one multiplied by conj(phase) (written into a copy)."""

    @staticmethod
    def forward(
        ctx: Any, t: Tensor, phase: Tensor, num_views: int, heads: tuple[int, int], dims: tuple[int, int]
    ) -> Tensor:
        ctx.phase, ctx.num_views, ctx.heads, ctx.dims = phase, num_views, heads, dims
        _pairs(t, phase, num_views, heads, *dims).mul_(phase[:, None])
        ctx.mark_dirty(t)
        return t

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        grad_t = grad.clone(memory_format=torch.contiguous_format)
        _pairs(grad_t, ctx.phase, ctx.num_views, ctx.heads, *ctx.dims).mul_(ctx.phase.conj()[:, None])
        return grad_t, None, None, None, None


def rotate_(
    t: Tensor, phase: Tensor, num_views: int, heads: tuple[int, int], head_dim: int, rope_dim: int, *, inverse: bool
) -> Tensor:
    """Rotate ``t`` ``(B, V * P, heads * head_dim)`` (or any shape with the same memory: contiguous,
    tokens view-major after the batch dimension; a tensor, not a view of one), in place: the RoPE
    channels (interleaved, the last ``rope_dim`` of each head) of heads [start, stop) = ``heads``
    by R(θ) (``inverse`` False: D, the output side) or R(-θ) = R(θ)^T = R(θ)^-1 (q, k and v).
    ``phase``: :func:`rope_phase` in t's dtype. Differentiable in ``t``; returns ``t``."""
    phase = phase.conj() if inverse else phase
    return cast(Tensor, _RotateInPlace.apply(t, phase, num_views, heads, (head_dim, rope_dim)))  # type: ignore[no-untyped-call]
