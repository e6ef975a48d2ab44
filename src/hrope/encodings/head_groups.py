"""The released URoPE module's head-group channel layout, for encodings with one table for every head.

``urope`` groups heads by anchor depth; ``worldrope`` and the RoPE half of ``hrope-lift-uv`` place
each token at its own depth, so their rotated heads all share one table and the layout keeps
what does not depend on anchors: in the r rotated channels of a head, [0, r/2) carry x and
[r/2, r) y, split-paired inside each half (pair f: channels (f, f + r/4) and (r/2 + f, 3r/4 + f)),
and the last ``leaveout_heads`` heads are not rotated (docs/encodings_query_frame.md §3).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.types import Device

from .base import EncodingError, TokenTransform
from .query_frame import QueryFrameTransform

__all__ = ["LAYOUTS", "check_layout", "split_pair_order", "head_group_transform"]

LAYOUTS = ("interleaved", "head_groups")


def check_layout(layout: str, leaveout_heads: int) -> None:
    """One-line errors for a layout name not in :data:`LAYOUTS` or a negative ``leaveout_heads``."""
    if layout not in LAYOUTS:
        raise EncodingError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if leaveout_heads < 0:
        raise EncodingError(f"leaveout_heads must be >= 0, got {leaveout_heads}")


def split_pair_order(rotated: int, device: Device = None) -> Tensor:
    """``order`` of :class:`QueryFrameTransform` for the head-group pairing of ``rotated`` channels
    (divisible by 4): pair f < r/4 on (f, f + r/4), pair r/4 + f on (r/2 + f, 3r/4 + f)."""
    F = rotated // 4
    return torch.cat(
        [torch.arange(F), torch.arange(2 * F, 3 * F), torch.arange(F, 2 * F), torch.arange(3 * F, 4 * F)]
    ).to(device)


def head_group_transform(
    re: Tensor,
    im: Tensor,
    grid: tuple[int, int],
    options: tuple[str, bool, bool],
    leaveout_heads: int,
    precision: str,
    relative: TokenTransform | None = None,
) -> QueryFrameTransform:
    """A :class:`QueryFrameTransform` with the head-group layout over the key tables ``(B, Vq, N, r/2)``
    (self-attention; every query takes its own-view entry) and ``options`` = (execution, recompute,
    rotate_values); the last ``leaveout_heads`` heads get the identity."""
    B, V, N, pairs = re.shape
    diag = torch.arange(V, device=re.device)
    query = [t.reshape(B, V, V, N // V, pairs)[:, diag, diag].reshape(B, N, pairs) for t in (re, im)]

    def per_head(heads: int) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]:
        if heads <= leaveout_heads:
            raise EncodingError(f"heads: {heads} heads leave none rotated with leaveout_heads={leaveout_heads}")
        rotated = (torch.arange(heads, device=re.device) < heads - leaveout_heads)[:, None, None]  # (H, 1, 1)
        q_re, q_im = (torch.where(rotated, t[:, None], fill) for t, fill in zip(query, (1.0, 0.0)))
        k_re, k_im = (torch.where(rotated, t[:, :, None], fill) for t, fill in zip((re, im), (1.0, 0.0)))
        return (q_re, q_im), (k_re, k_im)

    ones = re.new_ones(B, V, N, pairs)
    return QueryFrameTransform(
        ones,
        ones - 1,
        grid,
        *options,
        relative=relative,
        precision=precision,
        per_head=per_head,
        order=split_pair_order(2 * pairs, re.device),
    )
