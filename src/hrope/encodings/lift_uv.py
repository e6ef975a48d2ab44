"""``hrope-lift-uv``: hrope-lift's plane transform, plus RoPE on cross-view-consistent image positions.

One head's channels split as hrope-lift's (:class:`~hrope.encodings.layout.HeadLayout` with
4x4 tiles): the geometric first g = head_dim - 4F channels (F = head_dim // 8) carry hrope-lift's
D_t = Λ_t E_c tiles, relative as in hrope-lift (logit block D_i D_j^-1, the key's plane-induced
homography); the last r = 4F channels carry 2D RoPE on image positions in the query view, as
``worldrope`` with ``footprint=False`` and one depth hypothesis computes them:

    key j of view k, query view c:  x_j^(c) = proj_c(E_c E_k^-1 (z_j r̂_j)),
    z_j = clamp(1 / (m_j·r̂_j)) in [MIN_DEPTH, MAX_DEPTH]  (MAX_DEPTH when m_j·r̂_j <= 1 / MAX_DEPTH),

r̂_j = K̂_k^-1 (u_j, v_j, 1) the patch-centre ray and m_j the (clamped) plane of hrope-lift: the
point where the ray meets the key's plane, projected into the query camera. A plane at infinity
(m = 0), one behind the camera or farther than MAX_DEPTH along the ray gives the far anchor at
MAX_DEPTH (URoPE's far-anchor stand-in for the point at infinity). The query's own position is
its patch centre. Both halves use the same m; gradients reach it through both (through z only
where the depth is not clamped).

``layout="head_groups"``: the RoPE half takes the released URoPE module's channel layout
(:mod:`.head_groups`) on its r channels after the relative ones, and the last ``leaveout_heads``
heads keep only the relative half.
"""

from __future__ import annotations

from typing import cast

import torch
from torch import Tensor

from ..cameras import Cameras
from ..geometry import geometry_dtype, patch_rays
from ..planes import MAX_DEPTH, Planes, clamp_plane_vectors
from .base import EncodingError
from .head_groups import check_layout, head_group_transform
from .homography import HRoPELift, _token_planes
from .layout import ROPE_BASE, HeadLayout
from .query_frame import QueryFrameEncoding, QueryFrameTransform, pad_pairs
from .worldrope import WorldRoPE

__all__ = ["HRoPELiftUV", "plane_depths"]


def plane_depths(cameras: Cameras, grid: tuple[int, int], planes: Planes, dtype: torch.dtype) -> Tensor:
    """z-depths ``(B, V, P)`` where each patch-centre ray meets its token's plane, 1 / (m·r̂) with m
    within the plane bound, MAX_DEPTH where m·r̂ <= 1 / MAX_DEPTH (plane at infinity, behind the
    camera or beyond MAX_DEPTH); worldrope clamps them to at least MIN_DEPTH."""
    m = clamp_plane_vectors(_token_planes(planes, cameras, grid, dtype))
    w = (m * patch_rays(cameras.normalized_K(dtype), grid)).sum(-1)
    return 1.0 / w.clamp_min(1.0 / MAX_DEPTH)


class HRoPELiftUV(QueryFrameEncoding):
    """``hrope-lift-uv``: hrope-lift's geometric half (relative) with query-frame RoPE on the
    query-view projections of the key rays' plane points. Needs ``planes``; parameter-free.

    Args:
        rope_base: base of the RoPE half's frequency ladder (patch units).
        execution, recompute: see :class:`QueryFrameEncoding`.
        layout, leaveout_heads: the RoPE half's channel layout, ``"interleaved"`` (default) or
            ``"head_groups"``, and the heads whose RoPE half is not rotated (the last ones; default 0).
    """

    name = "hrope-lift-uv"
    needs_planes = True
    neutral_planes = "infinity"  # m = 0: prope's geometric half, RoPE on far-anchor positions

    def __init__(
        self,
        rope_base: float = ROPE_BASE,
        execution: str = "loop",
        recompute: bool = False,
        layout: str = "interleaved",
        leaveout_heads: int = 0,
    ) -> None:
        super().__init__(execution, recompute)
        check_layout(layout, leaveout_heads)
        self.rope_base = rope_base
        self.layout, self.leaveout_heads = layout, int(leaveout_heads)
        self.rope_half = WorldRoPE(footprint=False, rope_base=rope_base)

    def prepare(
        self, cameras: Cameras, grid: tuple[int, int], head_dim: int, planes: Planes | None = None, **params: Tensor
    ) -> QueryFrameTransform:
        """Needs ``planes (B, N)``; returns a :class:`QueryFrameTransform` with hrope-lift's tiles as
        its relative part."""
        self.check_inputs(planes, params)
        assert planes is not None  # check_inputs: needs_planes
        layout = HeadLayout(head_dim, block=4)
        if layout.num_freqs == 0:
            raise EncodingError(f"encoding {self.name!r} needs head_dim >= 8 (a RoPE half), got {head_dim}")
        grid = cast("tuple[int, int]", tuple(grid))
        D, D_inv = HRoPELift.lifts(cameras, grid, planes)
        relative = self.token_transform(HeadLayout(layout.geo_dim, block=4, rope=False), cameras, grid, D, D_inv)
        dtype = geometry_dtype(cameras.K.dtype)
        depth = plane_depths(cameras, grid, planes, dtype)
        zeros = torch.zeros_like(depth)
        sigma = zeros[..., None].expand(*zeros.shape, 2)
        re, im = self.rope_half.key_coefficients(
            cameras, grid, layout.rope_dim, dtype, depth=depth, depth_split=zeros, depth_sigma=sigma
        )
        if self.layout == "head_groups":
            options = (self.execution, self.recompute, True)
            return head_group_transform(re, im, grid, options, self.leaveout_heads, self.precision, relative)
        re, im = pad_pairs(re, im, layout.rope_dim // 2)
        return QueryFrameTransform(
            re, im, grid, self.execution, self.recompute, relative=relative, precision=self.precision
        )

    def extra_repr(self) -> str:
        text = f"{super().extra_repr()}, rope_base={self.rope_base}"
        if self.layout == "interleaved":
            return text
        return f"{text}, layout='head_groups', leaveout_heads={self.leaveout_heads}"
