"""``urope``: key ray points at fixed depth anchors projected into the query image (Xie et al. 2026).

For key token j of view k and anchor depth d_a (z-depth in the key camera), the point
X = d_a r̂_j (r̂_j = K̂_k^-1 (u_j, v_j, 1), patch centre) is moved into query view c by
E_c E_k^-1 and projected with K̂_c to a query-image position p_a in patch units (the patch ix has
centre ix + 0.5). Standard 2D RoPE (base 100, F = head_dim // 4 frequencies per axis) then encodes
p_a. Parameter-free. Two layouts (docs/encodings_query_frame.md §3):

- ``"interleaved"`` (default): every head alike over the whole head, pair p = channels
  (p, p + head_dim/2), pair f rotates by w_f x and pair F + f by w_f y with anchor a = f mod A,
  so every anchor sees low and high frequencies.
- ``"head_groups"`` (the released module): the last ``leaveout_heads`` heads are not rotated; the
  other heads form groups of ``group_size``, group g using anchor d_g = min + g (max - min) / n
  (n groups: the left edges of n equal bins); in a head, channels [0, d/2) carry x and [d/2, d) y,
  each half split-paired (pair f: channels (f, f + d/4) and (d/2 + f, 3d/4 + f)).

Projection: ``"clamped"`` (default) is the shared behind-camera rule of :mod:`.query_frame`;
``"released"`` divides by |Z| + 1e-5 and clamps positions to [-64, 96] patches. Either way the
query uses its own patch centre (with ``"clamped"``, its own anchors land there exactly).

When all views share one camera, the interleaved layout with ``"clamped"`` is exactly 2D RoPE on
patch indices (docs/encodings_query_frame.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import torch
from torch import Tensor

from ..cameras import Cameras
from ..geometry import geometry_dtype, patch_coordinates, patch_rays
from ..planes import Planes
from .base import EncodingError
from .head_groups import LAYOUTS, split_pair_order
from .layout import ROPE_BASE
from .query_frame import (
    QueryFrameEncoding,
    QueryFrameTransform,
    image_position_rope_freqs,
    pad_pairs,
    project_to_patches,
    relative_poses,
    to_query_frames,
)

__all__ = ["URoPE", "DEFAULT_ANCHORS", "LAYOUTS", "PROJECTIONS", "RELEASED_CLAMP", "released_projection"]

# Four anchors spanning a depth range of 2 to 20 scene units, inclusive (the spacing reported for
# the paper); scenes normalised to a unit context baseline have most content in this range.
DEFAULT_ANCHORS = (2.0, 8.0, 14.0, 20.0)
PROJECTIONS = ("clamped", "released")
RELEASED_CLAMP = (-64.0, 96.0)  # the released module's position clamp, patch units
RELEASED_DEPTH_EPS = 1e-5  # ... and its projection's |Z| + eps


def released_projection(X: Tensor, K_norm: Tensor, grid: tuple[int, int]) -> Tensor:
    """The released module's projection of query-frame points ``X (..., 3)`` to patch units
    ``(..., 2)``: K (x, y, z) / (|z| + 1e-5) with K in patch units (so a point behind the camera
    keeps z's sign on the principal point), clamped to :data:`RELEASED_CLAMP`."""
    size = X.new_tensor([grid[1], grid[0]])
    focal = torch.stack([K_norm[..., 0, 0], K_norm[..., 1, 1]], -1) * size
    centre = (torch.stack([K_norm[..., 0, 2], K_norm[..., 1, 2]], -1) + 0.5) * size
    pos = (focal * X[..., :2] + centre * X[..., 2:3]) / (X[..., 2:3].abs() + RELEASED_DEPTH_EPS)
    return pos.clamp(*RELEASED_CLAMP)


class URoPE(QueryFrameEncoding):
    """``urope``: 2D RoPE on the query-image projections of key ray points at fixed anchors.

    Args:
        anchors: positive anchor z-depths of the interleaved layout (default
            :data:`DEFAULT_ANCHORS`); frequency f uses anchor f mod len(anchors).
        rope_base: base of the frequency ladder (100, on patch units).
        execution, recompute: see :class:`QueryFrameEncoding`.
        layout: ``"interleaved"`` or ``"head_groups"`` (module docstring).
        group_size, min_depth, max_depth, leaveout_heads: the head-group layout's (4, 2, 20, 0; the last
            leaveout_heads heads are not rotated):
            (heads - leaveout_heads) / group_size anchors at the left bin edges of
            [min_depth, max_depth].
        projection: ``"clamped"`` or ``"released"`` (module docstring).
    """

    name = "urope"

    def __init__(
        self,
        anchors: Sequence[float] | None = None,
        rope_base: float = ROPE_BASE,
        execution: str = "loop",
        recompute: bool = False,
        layout: str = "interleaved",
        group_size: int = 4,
        min_depth: float = 2.0,
        max_depth: float = 20.0,
        leaveout_heads: int = 0,
        projection: str = "clamped",
    ) -> None:
        super().__init__(execution, recompute)
        for value, allowed, what in ((layout, LAYOUTS, "layout"), (projection, PROJECTIONS, "projection")):
            if value not in allowed:
                raise EncodingError(f"{what} must be one of {allowed}, got {value!r}")
        if layout == "head_groups" and anchors is not None:
            raise EncodingError("anchors: the head-group layout places its anchors by min_depth and max_depth")
        anchors = tuple(float(a) for a in (DEFAULT_ANCHORS if anchors is None else anchors))
        if not anchors or min(anchors) <= 0:
            raise EncodingError(f"anchors must be a non-empty sequence of positive depths, got {anchors}")
        if not 0 < min_depth < max_depth:
            raise EncodingError(f"min_depth, max_depth: need 0 < min_depth < max_depth, got {min_depth}, {max_depth}")
        if group_size < 1 or leaveout_heads < 0:
            raise EncodingError(f"group_size >= 1 and leaveout_heads >= 0 needed, got {group_size}, {leaveout_heads}")
        self.anchors = anchors
        self.rope_base = rope_base
        self.layout, self.projection = layout, projection
        self.group_size, self.leaveout_heads = int(group_size), int(leaveout_heads)
        self.min_depth, self.max_depth = float(min_depth), float(max_depth)

    def positions(self, cameras: Cameras, grid: tuple[int, int], depths: Tensor) -> Tensor:
        """Query-image positions ``(B, Vq, N, A, 2)`` of every key's points at ``depths (A,)``."""
        K = cameras.normalized_K(depths.dtype)
        points = patch_rays(K, grid)[..., None, :] * depths[:, None]  # (B, Vk, P, A, 3)
        X = to_query_frames(points, relative_poses(cameras, depths.dtype))  # (B, Vq, N, A, 3)
        if self.projection == "released":
            return released_projection(X, K[:, :, None, None], grid)
        return project_to_patches(X, K[:, :, None, None], grid)[0]

    def key_coefficients(
        self, cameras: Cameras, grid: tuple[int, int], head_dim: int, dtype: torch.dtype, **params: Tensor
    ) -> tuple[Tensor, Tensor]:
        """The interleaved layout's key tables ``(B, Vq, N, 2F)``."""
        pos = self.positions(cameras, grid, torch.tensor(self.anchors, dtype=dtype, device=cameras.K.device))
        freqs = image_position_rope_freqs(head_dim, self.rope_base, device=pos.device, dtype=dtype)
        anchor = torch.arange(freqs.numel(), device=pos.device) % len(self.anchors)
        angles = torch.cat([pos[..., anchor, 0] * freqs, pos[..., anchor, 1] * freqs], -1)
        return angles.cos(), angles.sin()

    def prepare(
        self, cameras: Cameras, grid: tuple[int, int], head_dim: int, planes: Planes | None = None, **params: Tensor
    ) -> QueryFrameTransform:
        """No planes or params; head groups build their tables when the number of heads is known."""
        if self.layout == "interleaved" and self.projection == "clamped":
            return super().prepare(cameras, grid, head_dim, planes, **params)
        self.check_inputs(planes, params)
        grid = cast("tuple[int, int]", tuple(grid))
        if head_dim % (4 if self.layout == "head_groups" else 2):
            raise EncodingError(f"encoding {self.name!r} ({self.layout}) needs head_dim divisible by 4, got {head_dim}")
        dtype = geometry_dtype(cameras.K.dtype)
        freqs = image_position_rope_freqs(head_dim, self.rope_base, device=cameras.K.device, dtype=dtype)
        centre = patch_coordinates(grid, (0.5, 0.5), device=freqs.device, dtype=dtype) + 0.5  # (P, 2), in [0, 1]
        own = centre * centre.new_tensor([grid[1], grid[0]])  # patch centres ix + 0.5, iy + 0.5
        own_angles = torch.cat([own[:, 0:1] * freqs, own[:, 1:2] * freqs], -1).repeat(cameras.num_views, 1)
        options: tuple[str, bool, bool] = (self.execution, self.recompute, self.rotate_values)
        if self.layout == "interleaved":
            key = pad_pairs(*self.key_coefficients(cameras, grid, head_dim, dtype), head_dim // 2)
            B = key[0].shape[0]
            query = pad_pairs(own_angles.cos().expand(B, -1, -1), own_angles.sin().expand(B, -1, -1), head_dim // 2)
            return QueryFrameTransform(key[0], key[1], grid, *options, query=query, precision=self.precision)
        B, V, N = cameras.batch_size, cameras.num_views, own_angles.shape[0]
        ones = own_angles.new_ones(B, V, N, head_dim // 2)

        def per_head(heads: int) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]:
            anchor = self.head_anchors(heads)  # (H,), -1: not rotated
            depths = self.min_depth + (self.max_depth - self.min_depth) * torch.arange(int(anchor.max()) + 1) / (
                int(anchor.max()) + 1
            )
            pos = self.positions(cameras, grid, depths.to(dtype=dtype, device=freqs.device))  # (B, Vq, N, A, 2)
            angles = torch.cat([pos[..., 0:1] * freqs, pos[..., 1:2] * freqs], -1)[..., anchor.clamp_min(0), :]
            rotated = (anchor >= 0).to(device=freqs.device, dtype=dtype)[:, None, None]  # (H, 1, 1)
            key_angles = angles.permute(0, 1, 3, 2, 4) * rotated  # (B, Vq, H, N, 2F)
            query_angles = (own_angles * rotated).expand(B, -1, -1, -1)  # (B, H, N, 2F)
            return (query_angles.cos(), query_angles.sin()), (key_angles.cos(), key_angles.sin())

        return QueryFrameTransform(
            ones,
            ones - 1,
            grid,
            *options,
            precision=self.precision,
            per_head=per_head,
            order=split_pair_order(head_dim, freqs.device),
        )

    def head_anchors(self, heads: int) -> Tensor:
        """Anchor index of each head ``(heads,)`` under the head-group layout, -1 for a head left out."""
        active = heads - self.leaveout_heads
        if active < self.group_size or active % self.group_size:
            raise EncodingError(
                f"heads: {heads} heads less leaveout_heads={self.leaveout_heads} must be a positive multiple "
                f"of group_size={self.group_size}"
            )
        return torch.cat([torch.arange(active) // self.group_size, torch.full((self.leaveout_heads,), -1)])

    def extra_repr(self) -> str:
        if self.layout == "interleaved":
            text = f"{super().extra_repr()}, anchors={self.anchors}"
        else:
            text = (
                f"{super().extra_repr()}, layout='head_groups', group_size={self.group_size}, "
                f"min_depth={self.min_depth}, max_depth={self.max_depth}, leaveout_heads={self.leaveout_heads}"
            )
        return text if self.projection == "clamped" else f"{text}, projection={self.projection!r}"
