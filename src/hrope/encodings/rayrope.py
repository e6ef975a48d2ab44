"""``rayrope``: 12 query-frame coordinates per token, uniform-interval expected rotation (Wu et al. 2026).

Token j of view k carries a log-depth interval [l_lo, l_hi] = [μ - s, μ + s] (both clamped to
[log MIN_DEPTH, ``max_log_depth``]), i.e. the ray segment between z-depths exp(l_lo) and
exp(l_hi) along three rays through the patch corners at offsets (0, 0), (1, 0), (0, 1) in patch
units (r̂ = K̂_k^-1 (u, v, 1), unit z). In query view c, with X the ray point moved by E_c E_k^-1
and y = K̂_c X, its 12 coordinates are

    [ key camera centre in c's frame (3) | y_xy / |y| per ray (3 x 2) | depth coordinate per ray (3) ]

with frequencies w = (2π / T) · freq_base^f, f < F = head_dim // 24, periods T = 4 (centre), 8
(direction), 80 (depth); pair f * 12 + coordinate holds the angle, pairs from 12F on are identity.
Each angle θ is uniform between its values at the two depth endpoints, so its coefficient is
E[exp(iθ)] = exp(i (θ_lo + θ_hi) / 2) · sinc((θ_hi - θ_lo) / 2) (the centre is deterministic).
The query is the same computation in its own frame (centre 0, directions its own rays).

Options reproduce the released code's modes and arithmetic (:mod:`.ray_segments` holds the
geometry): ``numerics="official"`` its rounding shortcuts and mirrored depth, ``depth="known"``
its RGB-D mode (per-ray known depths where given), ``depth_coordinate`` its disparity and asinh
coordinates, ``rotate_values=False`` attention on q and k only, :meth:`RayRoPE.prepare_cross` its
cross-attention form. With the defaults a point behind the query camera keeps the sign of its
depth coordinate (the released code mirrors it).
"""

from __future__ import annotations

import math
from typing import ClassVar, cast

import torch
from torch import Tensor
from torch.types import Device

from ..cameras import Cameras
from ..geometry import geometry_dtype, patch_rays
from ..planes import MAX_DEPTH
from .base import EncodingError
from .query_frame import MIN_DEPTH, QueryFrameEncoding, QueryFrameTransform, pad_pairs, relative_poses, to_query_frames
from .ray_segments import (
    DEPTH_COORDINATES,
    NUMERICS,
    RAY_OFFSETS,
    coordinate_periods,
    expected_phase,
    query_frame_coordinates,
)

__all__ = ["RayRoPE", "RAY_OFFSETS", "COORDINATE_PERIODS", "DEPTH_MODES"]

COORDINATE_PERIODS = coordinate_periods("depth")
NUM_COORDINATES = len(COORDINATE_PERIODS)
# "predicted": every token's interval from (μ, s); "known": rays with a known depth (> 0) take it
# at both ends (the released RGB-D mode); "known+halfwidth": they take [log d - s, log d + s].
DEPTH_MODES = ("predicted", "known", "known+halfwidth")


class RayRoPE(QueryFrameEncoding):
    """``rayrope``: ray-segment RoPE in each query camera's frame.

    Per-token params, tokens view-major ``(B, N)``:
        ``log_depth``: μ, natural log of the z-depth at the segment's centre.
        ``log_depth_halfwidth``: s, half-width of the log-depth interval (0 = deterministic;
            its sign matters only to ``numerics="official"``, whose shortcut reads the μ - s end).
        ``known_depth`` ``(B, N, 3)`` (known-depth modes only): z-depth of each of the token's
            three corner rays; a value <= 0 marks it missing (that ray uses μ). Clamped to
            [MIN_DEPTH, MAX_DEPTH]. :func:`~hrope.encodings.sample_ray_depths` reads
            it off depth maps.

    Args:
        freq_base: ratio between successive frequencies (3).
        max_log_depth: cap on the predicted interval's log-depths (3, depth about 20).
        max_depth_coordinate: clip of the depth coordinate (10).
        numerics: ``"exact"`` (default, the exact expectation) or ``"official"`` (the released
            code's arithmetic, bit for bit up to float rounding).
        depth: one of :data:`DEPTH_MODES`.
        depth_coordinate: ``"depth"`` (default), ``"inverse"`` (disparity) or ``"asinh"``.
        rotate_values: rotate v and the output too (default, as released); False: q and k only.
        execution, recompute: see :class:`QueryFrameEncoding`.
    """

    name = "rayrope"
    param_names: tuple[str, ...] = ("log_depth", "log_depth_halfwidth")
    param_shapes: ClassVar[dict[str, tuple[int, ...]]] = {"known_depth": (len(RAY_OFFSETS),)}

    def __init__(
        self,
        freq_base: float = 3.0,
        max_log_depth: float = 3.0,
        max_depth_coordinate: float = 10.0,
        numerics: str = "exact",
        depth: str = "predicted",
        depth_coordinate: str = "depth",
        rotate_values: bool = True,
        execution: str = "loop",
        recompute: bool = False,
    ) -> None:
        super().__init__(execution, recompute, rotate_values)
        if max_log_depth <= math.log(MIN_DEPTH):
            raise EncodingError(f"max_log_depth must exceed log({MIN_DEPTH}), got {max_log_depth}")
        for option, value, accepted in (
            ("numerics", numerics, NUMERICS),
            ("depth", depth, DEPTH_MODES),
            ("depth_coordinate", depth_coordinate, DEPTH_COORDINATES),
        ):
            if value not in accepted:
                raise EncodingError(f"rayrope: {option} must be one of {accepted}, got {value!r}")
        self.freq_base = freq_base
        self.max_log_depth = max_log_depth
        self.max_depth_coordinate = max_depth_coordinate
        self.numerics = numerics
        self.depth = depth
        self.depth_coordinate = depth_coordinate
        if depth != "predicted":
            self.param_names = (*self.param_names, "known_depth")  # facts of this instance
            self.data_param_names = ("known_depth",)

    def frequencies(self, head_dim: int, device: Device = None, dtype: torch.dtype = torch.float32) -> Tensor:
        """``(F, 12)`` angular frequencies, F = head_dim // 24 (at least 1 required)."""
        num = head_dim // (2 * NUM_COORDINATES)
        if num < 1:
            raise EncodingError(f"rayrope needs head_dim >= {2 * NUM_COORDINATES}, got {head_dim}")
        periods = torch.tensor(coordinate_periods(self.depth_coordinate), dtype=torch.float64, device=device)
        ladder = self.freq_base ** torch.arange(num, dtype=torch.float64, device=device)
        return (2 * math.pi / periods * ladder[:, None]).to(dtype)

    def segment_depths(
        self, log_depth: Tensor, log_depth_halfwidth: Tensor, known_depth: Tensor | None = None
    ) -> Tensor:
        """z-depths ``(..., 2 ends, 3 rays)`` of each token's segment ends (end 0 at μ - s) from
        params ``(...)`` (``known_depth (..., 3)``)."""
        log_ends = torch.stack([log_depth - log_depth_halfwidth, log_depth + log_depth_halfwidth], -1)
        depth = log_ends.clamp(math.log(MIN_DEPTH), self.max_log_depth).exp()[..., None].expand(*log_ends.shape, 3)
        if known_depth is None:
            return depth
        log_known = known_depth.clamp(MIN_DEPTH, MAX_DEPTH).log()[..., None, :]  # (..., 1, 3)
        if self.depth == "known+halfwidth":
            spread = torch.stack([-log_depth_halfwidth, log_depth_halfwidth], -1)[..., None]
            log_known = (log_known + spread).clamp(math.log(MIN_DEPTH), math.log(MAX_DEPTH))
        return torch.where(known_depth[..., None, :] > 0, log_known.exp().expand_as(depth), depth)

    def coefficients(
        self,
        query_cameras: Cameras,
        key_cameras: Cameras,
        key_grid: tuple[int, int],
        head_dim: int,
        dtype: torch.dtype,
        **params: Tensor,
    ) -> tuple[Tensor, Tensor]:
        """Coefficients ``(re, im)`` each ``(B, Vq, Nk, 12F)`` of the key tokens (params ``(B, Vk, P, ...)``)
        in every query camera's frame."""
        freqs = self.frequencies(head_dim, device=key_cameras.device, dtype=dtype)
        K_key = key_cameras.normalized_K(dtype)
        rays = torch.stack([patch_rays(K_key, key_grid, offset) for offset in RAY_OFFSETS], -2)  # (B, Vk, P, 3, 3)
        depth = self.segment_depths(**params)  # (B, Vk, P, 2, 3)
        rel = relative_poses(query_cameras, dtype, key_cameras)  # (B, Vq, Vk, 4, 4)
        X = to_query_frames(depth[..., None] * rays[..., None, :, :], rel)  # (B, Vq, Nk, 2, 3, 3)
        tokens = key_grid[0] * key_grid[1]
        centre = rel[..., :3, 3].repeat_interleave(tokens, dim=2)  # (B, Vq, Nk, 3)
        depth_q = depth.flatten(1, 2)[:, None]  # (B, 1, Nk, 2, 3)
        K_q = query_cameras.normalized_K(dtype)[:, :, None]
        coords = query_frame_coordinates(
            X, depth_q, K_q, centre, self.depth_coordinate, self.numerics, self.max_depth_coordinate
        )
        return expected_phase(coords, freqs, self.numerics)

    def key_coefficients(
        self, cameras: Cameras, grid: tuple[int, int], head_dim: int, dtype: torch.dtype, **params: Tensor
    ) -> tuple[Tensor, Tensor]:
        return self.coefficients(cameras, cameras, grid, head_dim, dtype, **params)

    def prepare_cross(
        self,
        query_cameras: Cameras,
        key_cameras: Cameras,
        grid: tuple[int, int],
        head_dim: int,
        *,
        query_params: dict[str, Tensor],
        key_params: dict[str, Tensor],
        key_grid: tuple[int, int] | None = None,
    ) -> QueryFrameTransform:
        """Bind to cross-attention: Nq = Vq * grid tokens of ``query_cameras`` attend to Nk = Vk *
        key_grid tokens of ``key_cameras`` (same batch and device).

        Each set carries its own params (``query_params`` ``(B, Nq, ...)``, ``key_params``
        ``(B, Nk, ...)``; known depths usually on the key side). A query token is encoded in its
        own frame as in self-attention; key tokens in every query camera's frame. Use the result
        as ``hrope.cross_attention(q, k, v, query=t, key=t)`` or ``t.attention(q, k, v)``.
        """
        grid = cast("tuple[int, int]", tuple(grid))
        key_grid = cast("tuple[int, int]", tuple(grid if key_grid is None else key_grid))
        if (query_cameras.batch_size, query_cameras.device) != (key_cameras.batch_size, key_cameras.device):
            raise EncodingError(
                f"rayrope.prepare_cross: query cameras (batch {query_cameras.batch_size}, {query_cameras.device}) "
                f"and key cameras (batch {key_cameras.batch_size}, {key_cameras.device}) must agree"
            )
        if head_dim % 2:
            raise EncodingError(f"encoding {self.name!r} needs an even head_dim, got {head_dim}")
        dtype = geometry_dtype(query_cameras.K.dtype)
        own = self.token_params(query_cameras, grid, query_params, dtype, "query_params")
        keys = self.token_params(key_cameras, key_grid, key_params, dtype, "key_params")
        re, im = pad_pairs(
            *self.coefficients(query_cameras, key_cameras, key_grid, head_dim, dtype, **keys), head_dim // 2
        )
        own_re, own_im = self.coefficients(query_cameras, query_cameras, grid, head_dim, dtype, **own)
        B, V, P = query_cameras.batch_size, query_cameras.num_views, grid[0] * grid[1]
        diag = torch.arange(V, device=re.device)
        own_re, own_im = (t.reshape(B, V, V, P, -1)[:, diag, diag].reshape(B, V * P, -1) for t in (own_re, own_im))
        query = pad_pairs(own_re, own_im, head_dim // 2)
        return QueryFrameTransform(
            re, im, grid, self.execution, self.recompute, self.rotate_values, query, precision=self.precision
        )

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, freq_base={self.freq_base}, numerics={self.numerics!r}, depth={self.depth!r}, "
            f"depth_coordinate={self.depth_coordinate!r}"
        )
