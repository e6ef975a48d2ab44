"""HRoPE ablation parameterisations (DESIGN.md §4.4, the paper's Fig. 4a).

Each one is a per-patch transform G_u acting in the token's camera frame, composed as
D_t = lift(K̂_c) G_u E_c and tiled as 4x4 blocks next to the 2D RoPE channels. Only E_i E_j^-1
appears in D_i D_j^-1, so all of them are world-frame invariant.

| name          | G_u                                      | per-token input                     |
|---------------|------------------------------------------|-------------------------------------|
| hrope-depth   | [[I, -p], [0, 1]], p = z r̂               | ``depth (B, N)`` z-depth on the ray  |
| hrope-so3     | lift(R_u)                                | ``rotation (B, N, 3, 3)``           |
| hrope-se3     | [[R_u, t_u], [0, 1]]                     | ``transform (B, N, 4, 4)`` rigid    |
| hrope-pf      | [[F^T, -F^T p], [0, 1]], tangent frame F | ``planes`` (normal + depth point)   |
| hrope-full    | any invertible 4x4 (generic inverse)     | ``transform (B, N, 4, 4)``          |
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..cameras import Cameras
from ..errors import checking_values
from ..geometry import geometry_dtype, invert_intrinsics, invert_se3, lift, make_se3, patch_rays
from ..planes import Planes, clamp_depth, clamp_inverse_depth, clamp_plane_vectors
from ..shapes import check_rotations
from .base import Encoding, EncodingError, TokenTransform, per_token_param
from .layout import HeadLayout

__all__ = ["PatchTransformEncoding", "HRoPEDepth", "HRoPESO3", "HRoPESE3", "HRoPEPF", "HRoPEFull", "tangent_frames"]


def tangent_frames(normal: Tensor) -> Tensor:
    """Right-handed frames ``F = [t1, t2, n]`` (columns) ``(..., 3, 3)`` for unit normals ``(..., 3)``.

    t1 is the camera x axis projected onto the plane (the y axis when |n_x| > 0.9), t2 = n x t1.
    """
    x_axis = torch.zeros_like(normal)
    use_y = normal[..., 0].abs() > 0.9
    x_axis[..., 0] = torch.where(use_y, 0.0, 1.0)
    x_axis[..., 1] = torch.where(use_y, 1.0, 0.0)
    t1 = x_axis - (x_axis * normal).sum(-1, keepdim=True) * normal
    t1 = t1 / t1.norm(dim=-1, keepdim=True)
    t2 = torch.cross(normal, t1, dim=-1)
    return torch.stack([t1, t2, normal], dim=-1)


class PatchTransformEncoding(Encoding):
    """Shared composition D = lift(K̂) G E and D^-1 = E^-1 G^-1 lift(K̂^-1) over 4x4 tiles."""

    def patch_transforms(
        self, cameras: Cameras, grid: tuple[int, int], dtype: torch.dtype, *args: Any, **params: Any
    ) -> tuple[Tensor, Tensor]:
        """Per-token G and G^-1, each ``(B, V, P, 4, 4)``, from the planes (the next argument) and the
        per-token params named by ``param_names`` (keywords); each subclass names what it takes."""
        raise NotImplementedError

    def prepare(
        self, cameras: Cameras, grid: tuple[int, int], head_dim: int, planes: Planes | None = None, **params: Tensor
    ) -> TokenTransform:
        """The subclass's input: ``depth (B, N)``, ``rotation (B, N, 3, 3)``, ``transform (B, N, 4, 4)`` or
        ``planes (B, N)`` (hrope-pf); D_t = lift(K̂_c) G_u E_c tiles + RoPE."""
        self.check_inputs(planes, params)
        dtype = geometry_dtype(cameras.K.dtype)
        G, G_inv = self.patch_transforms(cameras, grid, dtype, planes, **params)
        K = cameras.normalized_K(dtype)[:, :, None]
        E = cameras.world_to_cam.to(dtype)[:, :, None]
        D = lift(K) @ G @ E
        D_inv = invert_se3(E) @ G_inv @ lift(invert_intrinsics(K))
        return self.token_transform(HeadLayout(head_dim, block=4), cameras, grid, D, D_inv)


def _translation(p: Tensor) -> Tensor:
    eye = torch.eye(3, dtype=p.dtype, device=p.device).expand(*p.shape[:-1], 3, 3)
    return make_se3(eye, p)


class HRoPEDepth(PatchTransformEncoding):
    """``hrope-depth``: the token frame is moved to its point p = z r̂ at the predicted depth.

    ``depth`` must be positive; it is clamped to ``[MIN_DEPTH, MAX_DEPTH]`` (the clamp policy).
    """

    name = "hrope-depth"
    param_names = ("depth",)

    def patch_transforms(
        self, cameras: Cameras, grid: tuple[int, int], dtype: torch.dtype, planes: Planes | None, *, depth: Tensor
    ) -> tuple[Tensor, Tensor]:
        z = per_token_param(depth, cameras, grid, (), "depth", dtype)
        if checking_values() and not (z > 0).all():
            raise EncodingError(
                f"hrope-depth: depth must be positive (z-depth along the patch-centre ray), "
                f"min is {float(z.detach().min()):g}"
            )
        p = clamp_depth(z)[..., None] * patch_rays(cameras.normalized_K(dtype), grid)
        return _translation(-p), _translation(p)


class HRoPESO3(PatchTransformEncoding):
    """``hrope-so3``: a per-patch rotation G = lift(R_u)."""

    name = "hrope-so3"
    param_names = ("rotation",)

    def patch_transforms(
        self, cameras: Cameras, grid: tuple[int, int], dtype: torch.dtype, planes: Planes | None, *, rotation: Tensor
    ) -> tuple[Tensor, Tensor]:
        R = per_token_param(rotation, cameras, grid, (3, 3), "rotation", dtype)
        check_rotations(R, "rotation", error=EncodingError)
        return lift(R), lift(R.transpose(-1, -2))


class HRoPESE3(PatchTransformEncoding):
    """``hrope-se3``: a per-patch rigid transform G = [[R_u, t_u], [0, 1]]."""

    name = "hrope-se3"
    param_names = ("transform",)
    transform_kind = "rigid"

    def patch_transforms(
        self, cameras: Cameras, grid: tuple[int, int], dtype: torch.dtype, planes: Planes | None, *, transform: Tensor
    ) -> tuple[Tensor, Tensor]:
        G = per_token_param(transform, cameras, grid, (4, 4), "transform", dtype)
        check_rotations(G[..., :3, :3], "transform[..., :3, :3]", error=EncodingError)
        bottom = torch.tensor([0.0, 0.0, 0.0, 1.0], dtype=dtype, device=G.device)
        if checking_values() and (G[..., 3, :] - bottom).abs().amax() > 1e-6:
            raise EncodingError("transform must have bottom row [0, 0, 0, 1]")
        return G, invert_se3(G)


class HRoPEPF(PatchTransformEncoding):
    """``hrope-pf``: P·F — the calibrated projection composed with the patch's tangent frame.

    G = [[F^T, -F^T p], [0, 1]] maps camera coordinates to the plane's frame (origin at the
    point p where the plane crosses the patch-centre ray, z axis along the camera-facing normal).
    Needs ``planes`` that cross the patch-centre ray in front of the camera; m is clamped to
    ``|m| <= MAX_INVERSE_DISTANCE`` and p's z-depth to ``[MIN_DEPTH, MAX_DEPTH]`` (the clamp policy).
    """

    name = "hrope-pf"
    needs_planes = True
    neutral_planes = "fronto-parallel"  # needs a point on every ray
    planes_in_front = True
    # no APE variant: it would embed the same planes, decoded the same way, as hrope-ape

    def patch_transforms(
        self, cameras: Cameras, grid: tuple[int, int], dtype: torch.dtype, planes: Planes
    ) -> tuple[Tensor, Tensor]:
        B, V, P = cameras.batch_size, cameras.num_views, grid[0] * grid[1]
        m = clamp_plane_vectors(planes.m(cameras, grid, dtype).reshape(B, V, P, 3))
        rays = patch_rays(cameras.normalized_K(dtype), grid)
        inverse_depth = (m * rays).sum(-1)  # 1 / z of the point where the plane crosses the ray
        if checking_values() and not (inverse_depth > 0).all():
            raise EncodingError("hrope-pf needs planes crossing every patch-centre ray in front of the camera")
        p = rays / clamp_inverse_depth(inverse_depth)[..., None]
        direction = m / m.abs().amax(-1, keepdim=True)  # m != 0 here; scaled so that the norm cannot underflow
        normal = -direction / direction.norm(dim=-1, keepdim=True)
        frame_t = tangent_frames(normal).transpose(-1, -2)
        G = make_se3(frame_t, -(frame_t @ p[..., None]).squeeze(-1))
        return G, invert_se3(G)


class HRoPEFull(PatchTransformEncoding):
    """``hrope-full``: an unconstrained invertible 4x4 per patch (init identity), generic inverse."""

    name = "hrope-full"
    param_names = ("transform",)
    transform_kind = "invertible"

    def patch_transforms(
        self, cameras: Cameras, grid: tuple[int, int], dtype: torch.dtype, planes: Planes | None, *, transform: Tensor
    ) -> tuple[Tensor, Tensor]:
        G = per_token_param(transform, cameras, grid, (4, 4), "transform", dtype)
        G_inv, info = torch.linalg.inv_ex(G)
        if checking_values() and ((info != 0).any() or not torch.isfinite(G_inv).all()):
            raise EncodingError("hrope-full transform is singular for at least one token")
        return G, G_inv
