"""Dense float64 references of the encodings (tests only; never used by the fast path).

For each token the full ``head_dim x head_dim`` matrix D_t is built from the formulas of
DESIGN.md §3–4 (no closed-form inverses, no clamps), then attention is computed explicitly:

    a_ij = softmax_j((D_i^T q_i)·(D_j^-1 k_j) * scale),   o_i = D_i Σ_j a_ij D_j^-1 v_j.

This costs O(N d^2) memory and O(N^2) time: use it on small inputs.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .cameras import Cameras
from .encodings import Encoding, HeadLayout, get_encoding, rope_angles, tangent_frames
from .geometry import lift, normalize_intrinsics

__all__ = ["multiview_attention", "token_matrices", "dense_attention"]


def _rope_matrix(layout: HeadLayout, grid, num_views: int, base: float) -> Tensor:
    """``(N, d, d)`` with 2x2 rotations R(θ) on the split pairs (f, f + F) of the RoPE channels."""
    d, F_ = layout.head_dim, layout.num_freqs
    angles = rope_angles(grid, F_, base=base).repeat(num_views, 1, 1)  # (N, 2, F)
    D = torch.eye(d, dtype=torch.float64).repeat(angles.shape[0], 1, 1)
    for axis in range(2):
        for f in range(F_):
            a = layout.geo_dim + axis * 2 * F_ + f
            b = a + F_
            c, s = angles[:, axis, f].cos(), angles[:, axis, f].sin()
            D[:, a, a], D[:, a, b], D[:, b, a], D[:, b, b] = c, -s, s, c
    return D


def _tile(blocks: Tensor, layout: HeadLayout, D: Tensor) -> Tensor:
    """Write per-token ``blocks (B, N, b, b)`` on the geometric diagonal of ``D (B, N, d, d)``."""
    b = layout.block
    for i in range(layout.num_blocks):
        D[..., i * b : (i + 1) * b, i * b : (i + 1) * b] = blocks
    return D


def _per_token(x: Tensor, grid) -> Tensor:
    """Per-view ``(B, V, ...)`` -> per-token ``(B, N, ...)``."""
    return x.repeat_interleave(grid[0] * grid[1], dim=1)


def _geometric_blocks(encoding: Encoding, cameras: Cameras, grid, planes, params) -> Tensor | None:
    """The geometric block of every token, ``(B, N, b, b)``, straight from the definitions."""
    name = encoding.name
    K = _per_token(normalize_intrinsics(cameras.K, cameras.image_size), grid)
    E = _per_token(cameras.world_to_cam, grid)
    if name in ("none", "rope2d"):
        return None
    if name in ("prope",):
        return lift(K) @ E
    if name in ("gta", "cape"):
        if getattr(encoding, "translation_scale", None) is not None:
            E = E.clone()
            E[..., :3, 3] = E[..., :3, 3] * encoding.translation_scale.double()
        return E
    if name == "hrope":
        n_w, kappa = planes.world_normal_and_kappa(cameras, grid)
        R, t = E[..., :3, :3], E[..., :3, 3]
        H = K @ (R + kappa[..., None, None] * t[..., :, None] * n_w[..., None, :])
        H = H / torch.linalg.det(H).abs().pow(1.0 / 3.0)[..., None, None]
        return lift(H) if encoding.lift4 else H
    if name == "hrope-lift":
        lam = lift(K)
        lam[..., 3, :3] = -planes.m(cameras, grid)
        return lam @ E
    G = _patch_transform(name, cameras, grid, planes, params, K)
    return lift(K) @ G @ E


def _patch_transform(name: str, cameras, grid, planes, params, K) -> Tensor:
    """G_u of the ablations, ``(B, N, 4, 4)``."""
    B, N = cameras.batch_size, cameras.num_views * grid[0] * grid[1]
    G = torch.eye(4, dtype=torch.float64).repeat(B, N, 1, 1)
    uv = _per_token(torch.stack(_patch_uv(grid), -1)[None, None].expand(B, cameras.num_views, -1, -1), grid)
    if name in ("hrope-depth", "hrope-pf"):
        if name == "hrope-depth":
            z = params["depth"].double()
        else:
            normal, z = planes.normal_and_depth(cameras, grid)
        pix = torch.cat([uv, torch.ones_like(uv[..., :1])], -1)
        ray = torch.linalg.solve(K, pix[..., None]).squeeze(-1)
        p = z[..., None] * ray
        if name == "hrope-depth":
            G[..., :3, 3] = -p
        else:
            frame = tangent_frames(normal)
            G[..., :3, :3] = frame.transpose(-1, -2)
            G[..., :3, 3] = -(frame.transpose(-1, -2) @ p[..., None]).squeeze(-1)
        return G
    if name == "hrope-so3":
        G[..., :3, :3] = params["rotation"].double()
        return G
    if name in ("hrope-se3", "hrope-full"):
        return params["transform"].double()
    raise KeyError(f"no reference for encoding {name!r}")


def _patch_uv(grid):
    """Patch-centre normalised coordinates (u, v) of one view, each ``(P,)``."""
    gh, gw = grid
    v, u = torch.meshgrid((torch.arange(gh, dtype=torch.float64) + 0.5) / gh - 0.5,
                          (torch.arange(gw, dtype=torch.float64) + 0.5) / gw - 0.5, indexing="ij")
    return u.reshape(-1), v.reshape(-1)


def token_matrices(encoding: str | Encoding, cameras: Cameras, grid, head_dim: int,
                   planes=None, params: dict | None = None) -> tuple[Tensor, HeadLayout]:
    """Every token's full transform D_t ``(B, N, head_dim, head_dim)`` in float64, and its layout.

    Relative encodings only (for query-frame encodings the key transform depends on the query).
    """
    encoding = get_encoding(encoding)
    cameras = cameras.to(dtype=torch.float64)
    probe = encoding.prepare(cameras, tuple(grid), head_dim, planes=planes, **(params or {}))
    layout = probe.layout
    B, N = cameras.batch_size, cameras.num_views * grid[0] * grid[1]
    if layout.rope:
        D = _rope_matrix(layout, grid, cameras.num_views, encoding.rope_base).repeat(B, 1, 1, 1)
    else:
        D = torch.eye(head_dim, dtype=torch.float64).repeat(B, N, 1, 1)
    blocks = _geometric_blocks(encoding, cameras, tuple(grid), planes, params or {})
    if blocks is not None:
        D = _tile(blocks, layout, D)
    return D, layout


def dense_attention(q: Tensor, k: Tensor, v: Tensor, D_q: Tensor, D_k: Tensor, *,
                    transform_values: bool = True, attn_mask: Tensor | None = None,
                    scale: float | None = None) -> Tensor:
    """Explicit attention with per-token matrices ``D_q (B, Nq, d, d)``, ``D_k (B, Nk, d, d)``."""
    q, k, v = q.double(), k.double(), v.double()
    D_k_inv = torch.linalg.inv(D_k)[:, None]
    q_t = (D_q.transpose(-1, -2)[:, None] @ q[..., None]).squeeze(-1)
    k_t = (D_k_inv @ k[..., None]).squeeze(-1)
    v_t = (D_k_inv @ v[..., None]).squeeze(-1) if transform_values else v
    logits = q_t @ k_t.transpose(-1, -2) * (scale if scale is not None else 1.0 / math.sqrt(q.shape[-1]))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            logits = logits.masked_fill(~attn_mask, float("-inf"))
        else:
            logits = logits + attn_mask.double()
    out = torch.softmax(logits, dim=-1) @ v_t
    if transform_values:
        out = (D_q[:, None] @ out[..., None]).squeeze(-1)
    return out


def multiview_attention(q: Tensor, k: Tensor, v: Tensor, *, encoding: str | Encoding, cameras: Cameras,
                        grid, planes=None, params: dict | None = None, attn_mask: Tensor | None = None,
                        scale: float | None = None) -> Tensor:
    """Float64 dense reference of :func:`hrope.multiview_attention` (same signature, same output)."""
    encoding = get_encoding(encoding)
    D, _ = token_matrices(encoding, cameras, grid, q.shape[-1], planes, params)
    transform_values = encoding.name != "cape"
    return dense_attention(q, k, v, D, D, transform_values=transform_values, attn_mask=attn_mask, scale=scale)
