"""``worldrope``: expected 2D RoPE under a per-token near/far Gaussian mixture (Kim et al. 2026).

Token j of view k carries two 3D Gaussians along its patch-centre ray r̂_j (unit z, key camera
frame): means at z-depths z_near = depth - split/2 and z_far = depth + split/2 (each clamped to
[MIN_DEPTH, MAX_DEPTH], the clamp policy of docs/encodings.md), weights (w, 1 - w) with
w = ``near_weight``, covariances

    Σ_m = z_m^2 / 12 · diag(1 / (g_w f̂x)^2, 1 / (g_h f̂y)^2, 0)  +  σ_m^2 r̂ r̂^T

(the uniform variance of the fronto-parallel patch footprint at depth z_m, then the depth
variance along the ray, |σ_m| clamped to at most MAX_DEPTH). For query view c the mean is moved
by E_c E_k^-1, the covariance rotated, and both projected to query-image patch units with the
pinhole Jacobian J at the mean (first order). With 2D RoPE frequency vectors ω (axis aligned:
(w_f, 0) or (0, w_f), base 100, the ``urope`` layout) the coefficient is the Gaussian-mixture
characteristic function

    z_j^(c) = Σ_m π_m exp(i ω·μ_m) exp(-½ ω^T (J Σ_m J^T) ω),

of which only the diagonal of J Σ J^T enters (axis-aligned ω). The query is the same
computation in its own frame: the depth term vanishes there (it lies along the query's own ray)
and the footprint gives the constant factor exp(-w_f^2 / 24) per pair (``footprint=False``
removes it). Behind-camera rule: :mod:`.query_frame` (mirrored depth, clamped positions).

``layout="head_groups"``: the released URoPE module's channel layout (:mod:`.head_groups`), x in
the first half of each head and y in the second, split-paired, the last ``leaveout_heads`` heads
not rotated. With ``footprint=False``, zero split and zero sigma this is ``urope``'s head-group
form with the anchor moved to each token's depth.
"""

from __future__ import annotations

from typing import cast

import torch
from torch import Tensor

from ..cameras import Cameras
from ..geometry import geometry_dtype, patch_rays
from ..planes import MAX_DEPTH, Planes, clamp_depth
from .base import EncodingError
from .head_groups import check_layout, head_group_transform
from .layout import ROPE_BASE
from .query_frame import (
    MIN_DEPTH,
    QueryFrameEncoding,
    QueryFrameTransform,
    image_position_rope_freqs,
    project_to_patches,
    relative_poses,
    to_query_frames,
)

__all__ = ["WorldRoPE"]


class WorldRoPE(QueryFrameEncoding):
    """``worldrope``: per-token near/far Gaussian mixture, expected rotation in the query view.

    Per-token params (all required), tokens view-major ``(B, N)``:
        ``depth``: mixture centre, z-depth along the patch-centre ray (scene units).
        ``depth_split``: distance between the near and far means (0 = one depth hypothesis).
        ``depth_sigma``: ``(B, N, 2)`` standard deviations (near, far) along the ray.

    Args:
        near_weight: mixture weight of the near component (far gets 1 - near_weight).
        footprint: include the patch-footprint covariance (default True).
        rope_base: base of the 2D RoPE frequency ladder (patch units).
        execution, recompute: see :class:`QueryFrameEncoding`.
        layout: ``"interleaved"`` (default) or ``"head_groups"`` (module docstring; head_dim
            divisible by 4).
        leaveout_heads: the head-group layout's heads left unrotated (the last ones; default 0).
    """

    name = "worldrope"
    param_names = ("depth", "depth_split", "depth_sigma")
    param_shapes = {"depth_sigma": (2,)}

    def __init__(
        self,
        near_weight: float = 0.5,
        footprint: bool = True,
        rope_base: float = ROPE_BASE,
        execution: str = "loop",
        recompute: bool = False,
        layout: str = "interleaved",
        leaveout_heads: int = 0,
    ) -> None:
        super().__init__(execution, recompute)
        check_layout(layout, leaveout_heads)
        if not 0.0 <= near_weight <= 1.0:
            raise EncodingError(f"near_weight must be in [0, 1], got {near_weight}")
        self.near_weight = float(near_weight)
        self.footprint = bool(footprint)
        self.rope_base = rope_base
        self.layout, self.leaveout_heads = layout, int(leaveout_heads)

    def prepare(
        self, cameras: Cameras, grid: tuple[int, int], head_dim: int, planes: Planes | None = None, **params: Tensor
    ) -> QueryFrameTransform:
        """Params ``depth``, ``depth_split`` ``(B, N)`` and ``depth_sigma (B, N, 2)``; no planes."""
        if self.layout == "interleaved":
            return super().prepare(cameras, grid, head_dim, planes, **params)
        self.check_inputs(planes, params)
        if head_dim % 4:
            raise EncodingError(f"encoding {self.name!r} (head_groups) needs head_dim divisible by 4, got {head_dim}")
        grid = cast("tuple[int, int]", tuple(grid))
        dtype = geometry_dtype(cameras.K.dtype)
        table = self.key_coefficients(cameras, grid, head_dim, dtype, **self.token_params(cameras, grid, params, dtype))
        options = (self.execution, self.recompute, self.rotate_values)
        return head_group_transform(*table, grid, options, self.leaveout_heads, self.precision)

    def key_coefficients(
        self,
        cameras: Cameras,
        grid: tuple[int, int],
        head_dim: int,
        dtype: torch.dtype,
        *,
        depth: Tensor,
        depth_split: Tensor,
        depth_sigma: Tensor,
    ) -> tuple[Tensor, Tensor]:
        K = cameras.normalized_K(dtype)
        ray = patch_rays(K, grid)  # (B, Vk, P, 3)
        half = depth_split / 2
        z = clamp_depth(torch.stack([depth - half, depth + half], -1))  # (B, Vk, P, 2)
        mean = z[..., None] * ray[..., None, :]  # (B, Vk, P, 2, 3)
        sigma = depth_sigma.clamp(-MAX_DEPTH, MAX_DEPTH)
        cov = (sigma**2)[..., None, None] * (ray[..., :, None] * ray[..., None, :])[..., None, :, :]
        if self.footprint:
            size = torch.tensor([grid[1], grid[0]], dtype=dtype, device=K.device)
            focal = torch.stack([K[..., 0, 0], K[..., 1, 1]], -1)[:, :, None, None]  # (B, Vk, 1, 1, 2)
            box = (z[..., None] / (size * focal)) ** 2 / 12  # (B, Vk, P, 2, 2 axes)
            cov = cov + torch.diag_embed(torch.cat([box, torch.zeros_like(box[..., :1])], -1))
        rel = relative_poses(cameras, dtype)
        mu = to_query_frames(mean, rel)  # (B, Vq, N, 2, 3)
        R = rel[..., :3, :3].repeat_interleave(grid[0] * grid[1], dim=2)[:, :, :, None]  # (B, Vq, N, 1, 3, 3)
        cov_q = R @ cov[:, None].flatten(2, 3) @ R.transpose(-1, -2)  # (B, Vq, N, 2, 3, 3)
        pos, scale = project_to_patches(mu, K[:, :, None, None], grid)  # (B, Vq, N, 2, 2)
        var = image_variances(mu, cov_q, scale)  # (B, Vq, N, 2, 2)
        freqs = image_position_rope_freqs(head_dim, self.rope_base, device=K.device, dtype=dtype)
        angles = torch.cat([pos[..., 0:1] * freqs, pos[..., 1:2] * freqs], -1)  # (B, Vq, N, 2, 2F)
        damping = torch.exp(-0.5 * torch.cat([var[..., 0:1] * freqs**2, var[..., 1:2] * freqs**2], -1))
        weights = torch.tensor([self.near_weight, 1.0 - self.near_weight], dtype=dtype, device=K.device)
        amp = damping * weights[:, None]
        return (amp * angles.cos()).sum(-2), (amp * angles.sin()).sum(-2)

    def extra_repr(self) -> str:
        text = f"{super().extra_repr()}, near_weight={self.near_weight}, footprint={self.footprint}"
        if self.layout == "interleaved":
            return text
        return f"{text}, layout='head_groups', leaveout_heads={self.leaveout_heads}"


def image_variances(mu: Tensor, cov: Tensor, scale: Tensor) -> Tensor:
    """Per-axis image variances ``(..., 2)`` of ``J cov J^T`` for the pinhole Jacobian at ``mu``.

    Row a of J is ``scale_a * (e_a - (mu_a / Z_eff) e_z)`` with the mirrored, clamped depth of
    :func:`project_to_patches` (``scale`` is its second output). Floored at 0: for a covariance
    along the viewing ray the terms cancel, and round-off must not make a variance negative.
    """
    z_eff = mu[..., 2].abs().clamp_min(MIN_DEPTH)
    ratio = mu[..., :2] / z_eff[..., None]  # (..., 2)
    diag = torch.diagonal(cov, dim1=-2, dim2=-1)
    var = diag[..., :2] - 2 * ratio * cov[..., :2, 2] + ratio**2 * diag[..., 2:3]
    return scale**2 * var.clamp_min(0.0)
