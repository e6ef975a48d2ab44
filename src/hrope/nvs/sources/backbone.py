"""The ``backbone`` source: a small trainable head on a frozen user module's image features."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .base import ParameterSource, camera_views, zero_linear
from .errors import PredictorError

__all__ = ["BackboneSource"]


class BackboneSource(ParameterSource):
    """``backbone``: frozen ``module(images (B*Vc, 3, H, W) in [0, 1]) -> (B*Vc, C, h, w)`` features,
    bilinearly resampled to the patch grid, then ``Linear(C, hidden) -> GELU -> Linear(hidden, raw)``
    (last layer zero-initialised). Context views only; target views (no image) get neutral values,
    each decoder's zero-output value (e.g. identity transforms, hrope-lift's plane at infinity), or
    with ``targets="transfer"`` planes transferred from the context views."""

    frozen = ("backbone",)

    def __init__(
        self, specs, module: nn.Module, feature_dim: int, hidden_dim: int = 64, targets: str = "neutral"
    ) -> None:
        super().__init__(specs, targets)
        self.backbone = module.eval().requires_grad_(False)
        self.head = nn.Sequential(nn.Linear(feature_dim, hidden_dim), nn.GELU(), zero_linear(hidden_dim, self.raw_dim))

    def static(self, batch, cameras, grid, num_context):
        images = batch.images[:, :num_context]
        B, Vc = images.shape[:2]
        with torch.no_grad():
            features = self.backbone(images.flatten(0, 1))
        if features.ndim != 4:
            raise PredictorError(f"backbone must return (B, C, h, w) feature maps, got {tuple(features.shape)}")
        features = F.interpolate(features.float(), size=grid, mode="bilinear", align_corners=False)
        tokens = features.flatten(2).transpose(1, 2).reshape(B, Vc * grid[0] * grid[1], -1)
        return self.with_targets(
            self.decode(self.head(tokens), camera_views(cameras, 0, Vc), grid), cameras, grid, num_context
        )
