"""The ``oracle`` source: the batch's ground-truth planes."""

from __future__ import annotations

import torch

from ...planes import Planes
from ..config import DEFAULT_MAX_INVERSE_DISTANCE
from .transfer import transfer_planes
from .base import camera_views
from .errors import PredictorError
from .known_planes import GeometrySource

__all__ = ["OracleSource"]


class OracleSource(GeometrySource):
    """``oracle``: the dataset's ground-truth per-patch planes ``batch.planes(patch_size)``;
    ``depth_init`` as for ``external``. ``scope="context"`` (default): the context views' planes
    only, targets neutral or (``targets="transfer"``) the context planes transferred into the
    target cameras, the fair upper bound for a method that predicts planes from images;
    ``scope="all"``: every view's own planes, an upper bound with target geometry."""

    def __init__(
        self,
        specs,
        patch_size: int,
        depth_init: float = 1.0,
        targets: str = "neutral",
        scope: str = "context",
        max_inverse_distance: float | None = DEFAULT_MAX_INVERSE_DISTANCE,
    ) -> None:
        super().__init__(specs, targets, scope, depth_init, max_inverse_distance)
        self.patch_size = patch_size

    def static(self, batch, cameras, grid, num_context):
        planes = batch.planes(self.patch_size) if hasattr(batch, "planes") else None
        if planes is None:
            raise PredictorError("the 'oracle' predictor needs ground-truth planes (batch.planes(patch_size))")
        if self.scope == "all":
            return self.values_of(planes, cameras, grid)
        context_m = planes.m(cameras, grid, torch.float32)[:, : num_context * grid[0] * grid[1]]
        transferred = None
        if self.targets == "transfer":
            target_m, hit = transfer_planes(context_m, cameras.to(dtype=torch.float32), grid, num_context)
            transferred = self.values_of(Planes.from_m(target_m), camera_views(cameras, num_context), grid), hit
        values = self.values_of(Planes.from_m(context_m), camera_views(cameras, 0, num_context), grid)
        return self.with_targets(values, cameras, grid, num_context, transferred)
