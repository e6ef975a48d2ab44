"""Small closed-form geometry used by every encoding (torch only).

Conventions (DESIGN.md §2): intrinsics K in pixels, normalised as
K̂ = [[fx/W, 0, cx/W - 0.5], [0, fy/H, cy/H - 0.5], [0, 0, 1]] (zero skew);
extrinsics E are world-to-camera 4x4 matrices with OpenCV axes (x right, y down, z forward).
Patch centres of a (grid_h, grid_w) grid have normalised image coordinates
u = (ix + 0.5) / grid_w - 0.5, v = (iy + 0.5) / grid_h - 0.5, tokens row-major (x fastest);
:func:`patch_coordinates`, :func:`patch_rays` and :func:`patchify` are the one patch-grid helper set.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.types import Device

__all__ = [
    "normalize_intrinsics",
    "invert_intrinsics",
    "lift",
    "invert_se3",
    "make_se3",
    "patch_coordinates",
    "patch_rays",
    "patchify",
    "pixel_rays",
    "geometry_dtype",
]


def geometry_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype geometry is computed in for q of ``dtype``: float64 stays, the rest use float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def normalize_intrinsics(K: Tensor, image_size: tuple[int, int]) -> Tensor:
    """Pixel intrinsics ``(..., 3, 3)`` -> normalised K̂ ``(..., 3, 3)`` (skew dropped)."""
    height, width = image_size
    out = torch.zeros_like(K)
    out[..., 0, 0] = K[..., 0, 0] / width
    out[..., 1, 1] = K[..., 1, 1] / height
    out[..., 0, 2] = K[..., 0, 2] / width - 0.5
    out[..., 1, 2] = K[..., 1, 2] / height - 0.5
    out[..., 2, 2] = 1.0
    return out


def invert_intrinsics(K: Tensor) -> Tensor:
    """Closed-form inverse of a zero-skew intrinsics matrix ``(..., 3, 3)``."""
    fx, fy = K[..., 0, 0], K[..., 1, 1]
    cx, cy = K[..., 0, 2], K[..., 1, 2]
    out = torch.zeros_like(K)
    out[..., 0, 0] = 1.0 / fx
    out[..., 1, 1] = 1.0 / fy
    out[..., 0, 2] = -cx / fx
    out[..., 1, 2] = -cy / fy
    out[..., 2, 2] = 1.0
    return out


def lift(M: Tensor) -> Tensor:
    """Embed a ``(..., 3, 3)`` matrix as the 4x4 block diagonal ``diag(M, 1)``."""
    out = torch.zeros(*M.shape[:-2], 4, 4, dtype=M.dtype, device=M.device)
    out[..., :3, :3] = M
    out[..., 3, 3] = 1.0
    return out


def make_se3(R: Tensor, t: Tensor) -> Tensor:
    """Assemble ``[[R, t], [0, 1]]`` from ``R (..., 3, 3)`` and ``t (..., 3)``."""
    out = torch.zeros(*R.shape[:-2], 4, 4, dtype=R.dtype, device=R.device)
    out[..., :3, :3] = R
    out[..., :3, 3] = t
    out[..., 3, 3] = 1.0
    return out


def invert_se3(E: Tensor) -> Tensor:
    """Closed-form inverse of a rigid transform ``(..., 4, 4)``: ``[[R^T, -R^T t], [0, 1]]``."""
    R_t = E[..., :3, :3].transpose(-1, -2)
    return make_se3(R_t, -(R_t @ E[..., :3, 3:4]).squeeze(-1))


def patch_coordinates(
    grid: tuple[int, int],
    offset: tuple[float, float] = (0.5, 0.5),
    *,
    device: Device = None,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """Normalised image coordinates ``(P, 2)`` of the points ``(ix + ox, iy + oy)`` (patch units) of
    every patch, P = grid_h * grid_w, x fastest: ``u = (ix + ox) / grid_w - 0.5``, same for v.

    ``offset`` (0.5, 0.5) is the patch centre, (0, 0) its top-left corner.
    """
    grid_h, grid_w = grid
    u = (torch.arange(grid_w, device=device, dtype=dtype) + offset[0]) / grid_w - 0.5
    v = (torch.arange(grid_h, device=device, dtype=dtype) + offset[1]) / grid_h - 0.5
    vv, uu = torch.meshgrid(v, u, indexing="ij")
    return torch.stack([uu.reshape(-1), vv.reshape(-1)], dim=-1)


def patch_rays(K_norm: Tensor, grid: tuple[int, int], offset: tuple[float, float] = (0.5, 0.5)) -> Tensor:
    """Camera-frame rays ``r̂ = K̂^-1 (u, v, 1)`` through :func:`patch_coordinates` (the patch
    centres by default).

    ``K_norm (B, V, 3, 3)`` -> ``(B, V, P, 3)`` with unit z component, so a point ``z * r̂``
    has z-depth ``z``.
    """
    uv = patch_coordinates(grid, offset, device=K_norm.device, dtype=K_norm.dtype)
    fx, fy = K_norm[..., 0, 0, None], K_norm[..., 1, 1, None]
    cx, cy = K_norm[..., 0, 2, None], K_norm[..., 1, 2, None]
    x = (uv[:, 0] - cx) / fx
    y = (uv[:, 1] - cy) / fy
    return torch.stack([x, y, torch.ones_like(x)], dim=-1)


def patchify(x: Tensor, patch_size: int) -> Tensor:
    """Channels-first images ``(B, V, C, H, W)`` -> patches ``(B, V, P, C, p*p)``.

    Patches row-major (x fastest), P = (H / p) * (W / p); pixels inside a patch row-major too.
    """
    B, V, C, H, W = x.shape
    p = patch_size
    x = x.reshape(B, V, C, H // p, p, W // p, p).permute(0, 1, 3, 5, 2, 4, 6)
    return x.reshape(B, V, (H // p) * (W // p), C, p * p)


def pixel_rays(K: Tensor, image_size: tuple[int, int]) -> Tensor:
    """Camera-frame rays ``K^-1 (x + 0.5, y + 0.5, 1)`` through the pixel centres.

    Pixel intrinsics ``K (B, V, 3, 3)`` -> ``(B, V, H, W, 3)`` in K's dtype, with unit z component,
    so ``z * ray`` is the point at z-depth ``z``.
    """
    H, W = image_size
    ys, xs = torch.meshgrid(
        torch.arange(H, dtype=K.dtype, device=K.device) + 0.5,
        torch.arange(W, dtype=K.dtype, device=K.device) + 0.5,
        indexing="ij",
    )
    pix = torch.stack([xs, ys, torch.ones_like(xs)], -1)  # (H, W, 3)
    return torch.einsum("bvij,hwj->bvhwi", invert_intrinsics(K), pix)
