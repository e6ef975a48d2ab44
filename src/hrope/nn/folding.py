"""Per-view projection weights with an encoding's per-view factor folded in, and projections that
use them for the camera tokens and the plain weights for the others.

A projection's rows ``(parts * heads * head_dim, in)`` are the heads of each part (q, k, v, ...)
in order; inside a head the first ``num_blocks * b`` channels are the tiles of the encoding's
per-view block G_c (:class:`~hrope.encodings.HeadLayout`). Folding a ``(B, V, b, b)`` matrix M
into a part replaces every tile's b rows W_n by M W_n, per view; the other channels keep their rows.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .factors import TokenLayout

__all__ = ["fold_rows", "project"]


def fold_rows(
    weight: Tensor, bias: Tensor | None, matrices: list[Tensor | None], heads: int, num_blocks: int
) -> tuple[Tensor, Tensor | None]:
    """Per-view weights ``(B, V, out, in)`` and bias ``(B, V, out)`` from ``weight (out, in)`` and
    ``bias (out,)``, split into ``len(matrices)`` equal parts of ``heads`` heads: part p's tiles
    are multiplied from the left by ``matrices[p]`` ``(B, V, b, b)``, or kept (None). At least one
    matrix is given; all share B, V and b."""
    given = next(m for m in matrices if m is not None)
    B, V, b = given.shape[0], given.shape[1], given.shape[-1]
    eye = torch.eye(b, dtype=given.dtype, device=given.device).expand(B, V, b, b)
    # (B, V, parts, 1, 1, b, b): one matrix per part, broadcast over heads and tiles
    stacked = torch.stack([eye if m is None else m for m in matrices], 2)[:, :, :, None, None]
    rows = [weight] if bias is None else [weight, bias[:, None]]
    folded = []
    for w in rows:
        per_head = w.view(len(matrices), heads, -1, w.shape[-1])  # (parts, heads, head_dim, in)
        tiles = per_head[:, :, : num_blocks * b].reshape(len(matrices), heads, num_blocks, b, -1)
        geo = (stacked.to(w.dtype) @ tiles).flatten(4, 5)  # (B, V, parts, heads, tiled, in), written once
        rest = per_head[:, :, num_blocks * b :].expand(B, V, *per_head.shape[:2], -1, w.shape[-1])
        folded.append(torch.cat([geo, rest], 4).flatten(2, 4))  # (B, V, out, in): the one full write
    return folded[0], (folded[1][..., 0] if bias is not None else None)


def project(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    tokens: TokenLayout,
    folded: tuple[Tensor, Tensor | None] | None,
) -> Tensor:
    """``x (B, L, in)`` -> ``(B, L, out)``: the camera tokens (``tokens``) by the per-view
    ``folded`` = (weight_t ``(B, V, in, out)``, bias ``(B, V, out)``), the others by ``weight
    (out, in)`` and ``bias``; everything by ``weight`` when ``folded`` is None."""
    if folded is None:
        return F.linear(x, weight, bias)
    weight_t, view_bias = folded
    B, V = weight_t.shape[:2]

    def cameras(xc: Tensor) -> Tensor:  # (B, N, in) view-major -> (B, N, out)
        y: Tensor = xc.reshape(B, V, -1, xc.shape[-1]) @ weight_t
        return (y if view_bias is None else y + view_bias[:, :, None]).flatten(1, 2)

    if tokens.all_camera:
        return cameras(x)
    if tokens.span is not None:
        start, stop = tokens.span
        parts = [F.linear(x[:, :start], weight, bias), cameras(x[:, start:stop]), F.linear(x[:, stop:], weight, bias)]
        return torch.cat(parts, 1)
    assert tokens.index is not None and tokens.identity is not None  # not a span: positions given
    index, identity = tokens.index, tokens.identity
    out = x.new_empty(*x.shape[:-1], weight.shape[0])
    out = out.index_copy(1, index, cameras(x.index_select(1, index)))
    return out.index_copy(1, identity, F.linear(x.index_select(1, identity), weight, bias))
