"""PRoPE applied the way the official PRoPE module applies it, for a same-run speed comparison.

Written from the description of the official code (its algorithm, not its code): on every call
the RoPE cos/sin tables of one image are tiled to the whole sequence; q, k, v and the output are
each split into [projective half | RoPE-x quarter | RoPE-y quarter]; the projective half is an
einsum of the ``(B, V, 4, 4)`` camera matrices against a ``(B, heads, V, P, head_dim/8, 4)``
view; each RoPE quarter is ``x cos + rotate_half(x) sin`` (split pairing: channel f with f + F);
the three parts are concatenated. q gets P^T and R(-θ), k and v get P^-1 and R(-θ), the output
P and R(θ), so the result equals ``hrope.multiview_attention(..., encoding="prope")``
(tests/test_benchmarks.py checks it). The camera matrices come from hrope's ``prope``: building
them is a few 4x4 products, and the comparison is about applying them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

import hrope
from hrope.encodings.layout import patch_index_rope_angles


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """R(θ) on one RoPE quarter ``(..., N, 2F)`` with split pairing, tables ``(N, F)``."""
    a, b = x.chunk(2, dim=-1)
    rotate_half = torch.cat([-b, a], dim=-1)
    return x * torch.cat([cos, cos], dim=-1) + rotate_half * torch.cat([sin, sin], dim=-1)


def _transform(x: Tensor, matrix: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """``[matrix on 4-chunks | R_x | R_y]`` for x ``(B, heads, N, head_dim)``, matrix ``(B, V, 4, 4)``,
    RoPE tables ``(N, 2, F)``."""
    B, heads, N, head_dim = x.shape
    half, quarter = head_dim // 2, head_dim // 4
    chunks = x[..., :half].reshape(B, heads, matrix.shape[1], -1, half // 4, 4)
    projective = torch.einsum("bvij,bhvpkj->bhvpki", matrix, chunks).reshape(B, heads, N, half)
    rope_x = _rotate(x[..., half : half + quarter], cos[:, 0], sin[:, 0])
    rope_y = _rotate(x[..., half + quarter :], cos[:, 1], sin[:, 1])
    return torch.cat([projective, rope_x, rope_y], dim=-1)


def prope_einsum_tables(
    cameras: hrope.Cameras, grid: tuple[int, int], head_dim: int, dtype: torch.dtype, device: torch.device | None = None
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """What the official module's cached closures hold: P and P^-1 ``(B, V, 4, 4)`` and the RoPE
    tables tiled to the sequence, cos and sin ``(N, 2, head_dim / 8)``."""
    P, P_inv = (
        m[:, :, 0].to(device=device, dtype=dtype)
        for m in hrope.get_encoding("prope").prepare(cameras, grid, head_dim).geometric_blocks()
    )
    angles = patch_index_rope_angles(grid, head_dim // 8, device=device, dtype=dtype).repeat(cameras.num_views, 1, 1)
    return P, P_inv, angles.cos(), angles.sin()


def prope_einsum_apply(
    q: Tensor, k: Tensor, v: Tensor, tables: tuple[Tensor, Tensor, Tensor, Tensor], **sdpa_kwargs
) -> Tensor:
    """PRoPE attention from :func:`prope_einsum_tables`; q, k, v ``(B, heads, N, head_dim)``,
    head_dim % 8 == 0."""
    P, P_inv, cos, sin = tables
    out = F.scaled_dot_product_attention(
        _transform(q, P.transpose(-1, -2), cos, -sin),
        _transform(k, P_inv, cos, -sin),
        _transform(v, P_inv, cos, -sin),
        **sdpa_kwargs,
    )
    return _transform(out, P, cos, sin)


def prope_einsum_attention(
    q: Tensor, k: Tensor, v: Tensor, *, cameras: hrope.Cameras, grid: tuple[int, int], **sdpa_kwargs
) -> Tensor:
    """PRoPE attention, official-module algorithm, tables built on every call (as its module does);
    q, k, v ``(B, heads, N, head_dim)``, head_dim % 8 == 0."""
    tables = prope_einsum_tables(cameras, grid, q.shape[-1], q.dtype, q.device)
    return prope_einsum_apply(q, k, v, tables, **sdpa_kwargs)
