"""Sources of known geometry (``external``, ``oracle``): known planes turned into every encoding input."""

from __future__ import annotations

import torch
from torch import Tensor

from ...cameras import Cameras
from ...encodings import tangent_frames
from ...geometry import make_se3
from ...planes import Planes, clamp_plane_vectors
from ..config import DEFAULT_MAX_INVERSE_DISTANCE
from .base import ParameterSource
from .errors import PredictorError
from .specs import FACING_NORMAL, token_rays

__all__ = ["GeometrySource"]


def _values_from_planes(specs, planes: Planes, cameras: Cameras, grid, depth_init: float = 1.0) -> dict[str, Tensor]:
    """Every supported encoding input derived from known planes.

    ``planes`` (m, as given); ``depth`` / ``log_depth``: where the plane crosses the patch-centre
    ray; uncertainties 0 (``log_depth_halfwidth``, ``depth_split``, ``depth_sigma``); ``rotation``:
    the patch's tangent frame F^T (camera -> plane axes); ``transform``: [[F^T, -F^T p], [0, 1]] with
    p the plane point on the ray (hrope-pf's G). A plane that never crosses the ray (m = 0, e.g. a
    patch without valid depth, or m ⟂ r̂) stands in as the fronto-parallel plane at ``depth_init``
    for every input but ``planes``, so all values stay finite.
    """
    cameras = cameras.to(dtype=torch.float32)
    normal, depth = planes.normal_and_depth(cameras, grid, torch.float32)
    missing = ~torch.isfinite(depth)
    depth = torch.where(missing, torch.full_like(depth, depth_init), depth)
    facing = torch.tensor(FACING_NORMAL, dtype=normal.dtype, device=normal.device)
    normal = torch.where(missing[..., None], facing, normal)
    frame_t = tangent_frames(normal).transpose(-1, -2)
    point = depth[..., None] * token_rays(cameras, grid)
    values = {
        "planes": planes.m(cameras, grid, torch.float32),
        "depth": depth,
        "log_depth": depth.clamp_min(1e-6).log(),
        "log_depth_halfwidth": torch.zeros_like(depth),
        "depth_split": torch.zeros_like(depth),
        "depth_sigma": depth.new_zeros(*depth.shape, 2),
        "rotation": frame_t,
        "transform": make_se3(frame_t, -(frame_t @ point[..., None]).squeeze(-1)),
        # hrope's per-patch pose offsets: none (a geometry source knows planes, not poses)
        "patch_rotation": torch.eye(3, dtype=depth.dtype, device=depth.device).expand(*depth.shape, 3, 3),
        "patch_translation": depth.new_zeros(*depth.shape, 3),
    }
    unknown = [s.name for s in specs if s.name not in values]
    if unknown:
        raise PredictorError(f"geometry sources cannot provide {unknown}")
    return {s.name: values[s.name] for s in specs}


class GeometrySource(ParameterSource):
    """Sources of known geometry (``external``, ``oracle``): planes turned into every encoding input
    by :meth:`values_of`. ``max_inverse_distance`` (default :data:`DEFAULT_MAX_INVERSE_DISTANCE`):
    planes closer to the camera centre than 1 / max_inverse_distance are moved out to that
    distance, normal kept (|m| capped, :func:`hrope.planes.clamp_plane_vectors`), before anything
    is derived from them; None leaves them to the encodings' own clamp (|m| <=
    :data:`hrope.planes.MAX_INVERSE_DISTANCE`, an overflow guard)."""

    def __init__(
        self,
        specs,
        targets: str,
        scope: str,
        depth_init: float = 1.0,
        max_inverse_distance: float | None = DEFAULT_MAX_INVERSE_DISTANCE,
    ) -> None:
        super().__init__(specs, targets, scope)
        self.depth_init, self.max_inverse_distance = depth_init, max_inverse_distance

    def values_of(self, planes: Planes, cameras: Cameras, grid: tuple[int, int]) -> dict[str, Tensor]:
        """The encoding inputs ``{name: (B, N, ...)}`` of known ``planes`` seen by ``cameras``."""
        if self.max_inverse_distance is not None:
            m = planes.m(cameras.to(dtype=torch.float32), grid, torch.float32)
            planes = Planes.from_m(clamp_plane_vectors(m, self.max_inverse_distance))
        return _values_from_planes(self.specs, planes, cameras, grid, self.depth_init)
