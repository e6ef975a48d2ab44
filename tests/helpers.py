"""Test helpers: the random valid inputs of :mod:`hrope.testing`, plus test-only utilities."""

from __future__ import annotations

import torch

import hrope
from hrope.testing import (
    encoding_inputs,
    encoding_params,
    random_cameras,
    random_intrinsics,
    random_planes,
    random_qkv,
    random_rotation,
    random_se3,
)

__all__ = [
    "encoding_inputs",
    "encoding_params",
    "random_cameras",
    "random_intrinsics",
    "random_planes",
    "random_qkv",
    "random_rotation",
    "random_se3",
    "so3_exp",
    "RELATIVE",
]


def so3_exp(w: torch.Tensor) -> torch.Tensor:
    """Rotation matrices from axis-angle vectors ``(..., 3)`` (Rodrigues)."""
    theta = w.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    k = w / theta
    Kx = torch.zeros(*w.shape[:-1], 3, 3, dtype=w.dtype)
    Kx[..., 0, 1], Kx[..., 0, 2] = -k[..., 2], k[..., 1]
    Kx[..., 1, 0], Kx[..., 1, 2] = k[..., 2], -k[..., 0]
    Kx[..., 2, 0], Kx[..., 2, 1] = -k[..., 1], k[..., 0]
    s, c = torch.sin(theta)[..., None], torch.cos(theta)[..., None]
    return torch.eye(3, dtype=w.dtype) + s * Kx + (1 - c) * Kx @ Kx


# every relative (non-query-frame) encoding of the registry
RELATIVE = [name for name, cls in hrope.ENCODINGS.items() if not cls.query_frame]
