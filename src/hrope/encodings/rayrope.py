"""``rayrope``: 12 query-frame coordinates per token, uniform-interval expected rotation (Wu et al. 2026).

Token j of view k carries a log-depth interval [l_lo, l_hi] = [μ - s, μ + s] (both clamped to
[log MIN_DEPTH, ``max_log_depth``]), i.e. the ray segment between z-depths exp(l_lo) and
exp(l_hi) along three rays through the patch corners at offsets (0, 0), (1, 0), (0, 1) in patch
units (r̂ = K̂_k^-1 (u, v, 1), unit z). In query view c, with X the ray point moved by E_c E_k^-1
and y = K̂_c X, its 12 coordinates are

    [ key camera centre in c's frame (3) | y_xy / |y| per ray (3 x 2) | clip(X_z, ±max_depth_coordinate) per ray (3) ]

with frequencies w = (2π / T) · freq_base^f, f < F = head_dim // 24, periods T = 4 (centre), 8
(direction), 80 (depth); pair f * 12 + coordinate holds the angle, pairs from 12F on are identity.
Each angle θ is uniform between its values at the two depth endpoints, so its coefficient is
E[exp(iθ)] = exp(i (θ_lo + θ_hi) / 2) · sinc((θ_hi - θ_lo) / 2) (the centre is deterministic).
The query is the same computation in its own frame (centre 0, directions its own rays).

Behind the query camera: the direction y / |y| is defined everywhere except at the camera centre
(|y| is floored at 1e-6) and the depth coordinate keeps its sign, so a point behind the camera is
distinguished from its mirror image (the public code mirrors it); depths are clipped to
±``max_depth_coordinate``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.types import Device

from ..cameras import Cameras
from ..geometry import patch_rays
from .base import EncodingError
from .query_frame import MIN_DEPTH, QueryFrameEncoding, relative_poses, sinc, to_query_frames

__all__ = ["RayRoPE", "RAY_OFFSETS", "COORDINATE_PERIODS"]

RAY_OFFSETS = ((0.0, 0.0), (1.0, 0.0), (0.0, 1.0))
# Longest period T of each of the 12 coordinates: centre (3), directions (3 rays x 2), depths (3 rays).
COORDINATE_PERIODS = (4.0,) * 3 + (8.0,) * 6 + (80.0,) * 3
NUM_COORDINATES = len(COORDINATE_PERIODS)
MIN_DIRECTION_NORM = 1e-6


class RayRoPE(QueryFrameEncoding):
    """``rayrope``: ray-segment RoPE in each query camera's frame.

    Per-token params (both required), tokens view-major ``(B, N)``:
        ``log_depth``: μ, natural log of the z-depth at the segment's centre.
        ``log_depth_halfwidth``: s, half-width of the log-depth interval (0 = deterministic;
            its sign does not matter).

    Args:
        freq_base: ratio between successive frequencies (3).
        max_log_depth: cap on the interval's log-depths (3, depth about 20).
        max_depth_coordinate: clip of the depth coordinate (10).
        execution, recompute: see :class:`QueryFrameEncoding`.
    """

    name = "rayrope"
    param_names = ("log_depth", "log_depth_halfwidth")

    def __init__(
        self,
        freq_base: float = 3.0,
        max_log_depth: float = 3.0,
        max_depth_coordinate: float = 10.0,
        execution: str = "loop",
        recompute: bool = False,
    ) -> None:
        super().__init__(execution, recompute)
        if max_log_depth <= math.log(MIN_DEPTH):
            raise EncodingError(f"max_log_depth must exceed log({MIN_DEPTH}), got {max_log_depth}")
        self.freq_base = freq_base
        self.max_log_depth = max_log_depth
        self.max_depth_coordinate = max_depth_coordinate

    def frequencies(self, head_dim: int, device: Device = None, dtype: torch.dtype = torch.float32) -> Tensor:
        """``(F, 12)`` angular frequencies, F = head_dim // 24 (at least 1 required)."""
        num = head_dim // (2 * NUM_COORDINATES)
        if num < 1:
            raise EncodingError(f"rayrope needs head_dim >= {2 * NUM_COORDINATES}, got {head_dim}")
        periods = torch.tensor(COORDINATE_PERIODS, dtype=torch.float64, device=device)
        ladder = self.freq_base ** torch.arange(num, dtype=torch.float64, device=device)
        return (2 * math.pi / periods * ladder[:, None]).to(dtype)

    def key_coefficients(
        self,
        cameras: Cameras,
        grid: tuple[int, int],
        head_dim: int,
        dtype: torch.dtype,
        *,
        log_depth: Tensor,
        log_depth_halfwidth: Tensor,
    ) -> tuple[Tensor, Tensor]:
        freqs = self.frequencies(head_dim, device=cameras.device, dtype=dtype)
        K = cameras.normalized_K(dtype)
        rays = torch.stack([patch_rays(K, grid, offset) for offset in RAY_OFFSETS], -2)  # (B, Vk, P, 3, 3)
        log_ends = torch.stack([log_depth - log_depth_halfwidth, log_depth + log_depth_halfwidth], -1)
        depth = log_ends.clamp(math.log(MIN_DEPTH), self.max_log_depth).exp()  # (B, Vk, P, 2)
        rel = relative_poses(cameras, dtype)
        X = to_query_frames(depth[..., None, None] * rays[..., None, :, :], rel)  # (B, Vq, N, 2 ends, 3 rays, 3)
        K_q = K[:, :, None, None, None]
        y_xy = X[..., :2] * torch.stack([K_q[..., 0, 0], K_q[..., 1, 1]], -1) + X[..., 2:] * K_q[..., :2, 2]
        y_norm = torch.sqrt(y_xy.square().sum(-1) + X[..., 2].square()).clamp_min(MIN_DIRECTION_NORM)
        direction = (y_xy / y_norm[..., None]).flatten(-2)  # (B, Vq, N, 2, 6)
        z = X[..., 2].clamp(-self.max_depth_coordinate, self.max_depth_coordinate)
        centre = rel[..., :3, 3].repeat_interleave(grid[0] * grid[1], dim=2)  # (B, Vq, N, 3)
        ray_coords = torch.cat([direction, z], -1)  # (B, Vq, N, 2 ends, 9)
        mid = torch.cat([centre, ray_coords.mean(-2)], -1)  # (B, Vq, N, 12)
        half_spread = torch.cat([torch.zeros_like(centre), (ray_coords[..., 1, :] - ray_coords[..., 0, :]) / 2], -1)
        angle = (mid[..., None, :] * freqs).flatten(-2)  # (B, Vq, N, F * 12), frequency-major
        amp = sinc((half_spread[..., None, :] * freqs).flatten(-2))
        return amp * angle.cos(), amp * angle.sin()

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, freq_base={self.freq_base}"
