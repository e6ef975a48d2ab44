"""``rayrope``'s geometry: ray segments in every query frame and their expected phases.

Conventions (docs/encodings_query_frame.md §2): three rays per patch through the corners at
:data:`RAY_OFFSETS` (patch units), r̂ = K̂^-1 (u, v, 1) with unit z, so a point at z-depth d is
d·r̂. Every segment has two ends (index 0 at log-depth μ - s, index 1 at μ + s) and its 12
coordinates in query view c are

    [ key camera centre in c's frame (3) | direction per ray (3 x 2) | depth coordinate per ray (3) ]

Two numerics (``numerics``):

- ``"exact"``: direction y_xy / max(|y|, 1e-6) with y = K̂_c X; depth coordinate from the signed
  z-depth X_z; phase E[exp(iθ)] for θ uniform between its end values.
- ``"official"``: the released code's arithmetic: direction y_xy / (|y| + 1e-6·d) (its
  homogeneous point scaled by w = 1/d, d the end's depth along its own ray); depth coordinate
  from the mirrored depth max(sqrt((X_z/d)² + 1e-9), 1e-4)·d; phase taken at the μ - s end
  wherever the angle changes by at most 0.01 across the segment, the expectation elsewhere.

Depth coordinates (``depth_coordinate``): ``"depth"`` the z-depth clipped to ±m (period 80),
``"asinh"`` asinh of it clipped to ±asinh(m) (period 8·asinh(10)), ``"inverse"`` the disparity
1/|z| clipped to [0, 20] (period 80); m = ``max_depth_coordinate``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..shapes import check_shapes
from .base import EncodingError

__all__ = [
    "RAY_OFFSETS",
    "DEPTH_COORDINATES",
    "NUMERICS",
    "MAX_DISPARITY",
    "SHORTCUT_SPREAD",
    "coordinate_periods",
    "query_frame_coordinates",
    "expected_phase",
    "sample_ray_depths",
]

RAY_OFFSETS = ((0.0, 0.0), (1.0, 0.0), (0.0, 1.0))
DEPTH_COORDINATES = ("depth", "inverse", "asinh")
NUMERICS = ("exact", "official")
MAX_DISPARITY = 20.0
SHORTCUT_SPREAD = 0.01  # official numerics: largest angle change taken as no spread
MIN_DIRECTION_NORM = 1e-6
_DEPTH_PERIODS = {"depth": 80.0, "inverse": 80.0, "asinh": 8.0 * math.asinh(10.0)}


def coordinate_periods(depth_coordinate: str = "depth") -> tuple[float, ...]:
    """Longest period T of each of the 12 coordinates: centre (3), directions (3 rays x 2), depths (3 rays)."""
    return (4.0,) * 3 + (8.0,) * 6 + (_DEPTH_PERIODS[depth_coordinate],) * 3


def _depth_coordinate(z: Tensor, depth: Tensor, kind: str, numerics: str, limit: float) -> Tensor:
    """The depth coordinate of points at query-frame z-depth ``z``, ``depth`` their key-ray depth."""
    if numerics == "official":  # homogeneous point scaled by w = 1/depth, its z mirrored and floored
        w = (1 / depth).clamp_min(1e-4)
        z_h = torch.sqrt((z * w).square() + 1e-9).clamp_min(1e-4)
        if kind == "inverse":
            return (w / z_h).clamp(0.0, MAX_DISPARITY)
        z = z_h / w
    if kind == "depth":
        return z.clamp(-limit, limit)
    if kind == "asinh":
        return torch.asinh(z).clamp(-math.asinh(limit), math.asinh(limit))
    return 1 / z.abs().clamp_min(1 / MAX_DISPARITY)


def query_frame_coordinates(
    points: Tensor, depth: Tensor, K_query: Tensor, centre: Tensor, kind: str, numerics: str, limit: float
) -> Tensor:
    """The 12 coordinates ``(..., 2 ends, 12)`` of ray points in their query frames.

    Args:
        points: ``(..., 2 ends, 3 rays, 3)`` the points X in the query camera's frame.
        depth: ``(..., 2 ends, 3 rays)`` their z-depths along their own (key) rays.
        K_query: the normalised query intrinsics, broadcastable to ``(..., 1, 1, 3, 3)``.
        centre: ``(..., 3)`` the key camera centre in the query frame.
        kind, numerics, limit: ``depth_coordinate``, ``numerics`` and ``max_depth_coordinate``.
    """
    K = K_query[..., None, None, :, :]
    y_xy = points[..., :2] * torch.stack([K[..., 0, 0], K[..., 1, 1]], -1) + points[..., 2:] * K[..., :2, 2]
    norm = torch.sqrt(y_xy.square().sum(-1) + points[..., 2].square())
    if numerics == "official":
        norm = norm + MIN_DIRECTION_NORM * depth
    else:
        norm = norm.clamp_min(MIN_DIRECTION_NORM)
    direction = (y_xy / norm[..., None]).flatten(-2)  # (..., 2, 6)
    z = _depth_coordinate(points[..., 2], depth, kind, numerics, limit)
    return torch.cat([centre[..., None, :].expand(*direction.shape[:-1], 3), direction, z], -1)


def expected_phase(coords: Tensor, freqs: Tensor, numerics: str) -> tuple[Tensor, Tensor]:
    """``(re, im)`` of E[exp(iθ)] ``(..., F * 12)`` (frequency-major) for θ = w·x uniform between
    the two ends of ``coords (..., 2, 12)``; ``freqs (F, 12)``."""
    if numerics == "exact":
        mid = (coords.mean(-2)[..., None, :] * freqs).flatten(-2)
        amp = sinc(((coords[..., 1, :] - coords[..., 0, :]) / 2)[..., None, :].mul(freqs).flatten(-2))
        return amp * mid.cos(), amp * mid.sin()
    lo, hi = ((coords[..., end, None, :] * freqs).flatten(-2) for end in (0, 1))
    delta = hi - lo
    flat = delta.abs() <= SHORTCUT_SPREAD
    safe = torch.where(flat, torch.ones_like(delta), delta)
    e_cos = torch.where(flat, lo.cos(), (hi.sin() - lo.sin()) / safe)
    e_sin = torch.where(flat, lo.sin(), (lo.cos() - hi.cos()) / safe)
    return e_cos, e_sin


def sample_ray_depths(depth_map: Tensor, grid: tuple[int, int]) -> Tensor:
    """Per-ray known depths ``(B, V * P, 3)`` from z-depth maps ``(B, V, H, W)`` (pixels, row-major).

    Ray r of patch (ix, iy) reads the pixel nearest to its corner point ((ix + ox)·W/g_w,
    (iy + oy)·H/g_h), i.e. pixel index round((ix + ox)·W/g_w - 0.5) with ties to even, clamped to
    the image (the released code's nearest sampling), so the result can be fed as
    ``known_depth``. H and W must be multiples of the grid. Zero or negative map values stay as
    they are (``known_depth`` reads them as missing).
    """
    check_shapes({"depth_map": (depth_map, "B V H W")}, error=EncodingError)
    B, V, H, W = depth_map.shape
    gh, gw = grid
    if H % gh or W % gw:
        raise EncodingError(f"depth_map's {H}x{W} pixels are not a whole number of {gh}x{gw} patches")
    per_ray = []
    for ox, oy in RAY_OFFSETS:
        x = torch.round((torch.arange(gw, dtype=torch.float64) + ox) * (W // gw) - 0.5).clamp(0, W - 1).long()
        y = torch.round((torch.arange(gh, dtype=torch.float64) + oy) * (H // gh) - 0.5).clamp(0, H - 1).long()
        per_ray.append(depth_map[:, :, y.to(depth_map.device)][:, :, :, x.to(depth_map.device)].reshape(B, V * gh * gw))
    return torch.stack(per_ray, -1)


def sinc(x: Tensor) -> Tensor:
    """``sin(x) / x`` with the value 1 at 0."""
    return torch.sinc(x / math.pi)
