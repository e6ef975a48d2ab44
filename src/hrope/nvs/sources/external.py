"""The ``external`` source: planes fitted to the batch's depth or to a frozen depth model's output."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...cameras import Cameras
from ...encodings import sample_ray_depths
from ...geometry import patchify
from ...planes import Planes
from ..config import DEFAULT_MAX_INVERSE_DISTANCE
from .plane_fitting import fit_patch_planes
from .transfer import transfer_depth
from .user_depth import user_depth
from .base import camera_views
from .errors import PredictorError
from .known_planes import GeometrySource

__all__ = ["ExternalSource", "DEPTH_PARAMS", "ray_depths"]

# Encoding inputs read off the depth maps themselves, not derived from the fitted planes (an
# encoding's ``data_param_names``): rayrope's per-ray known depths.
DEPTH_PARAMS = ("known_depth",)


def ray_depths(depth: Tensor, grid: tuple[int, int]) -> Tensor:
    """``known_depth (B, V*P, 3)`` of z-depth maps ``(B, V, H, W)``: each token's corner rays read
    by :func:`hrope.encodings.sample_ray_depths`; pixels without depth (not finite or <= 0, e.g.
    where nothing was splatted) give 0, which the encoding reads as missing. No near-camera cap:
    the encoding clamps the depths to [MIN_DEPTH, MAX_DEPTH] itself."""
    known = torch.isfinite(depth) & (depth > 0)
    return sample_ray_depths(torch.where(known, depth, torch.zeros_like(depth)).float(), grid)


def _median_scale(predicted: Tensor, reference: Tensor) -> Tensor:
    """``(B, V, 1, 1)``: per view, the median of ``reference / predicted`` over the pixels where both
    depths ``(B, V, H, W)`` are valid; a view without such pixels takes its scene's median."""
    both = torch.isfinite(reference) & (reference > 0) & torch.isfinite(predicted) & (predicted > 0)
    ratio = torch.where(both, reference / predicted, torch.nan)
    per_view = ratio.flatten(2).nanmedian(-1).values
    scale = torch.where(per_view.isnan(), ratio.flatten(1).nanmedian(-1).values[:, None], per_view)
    if scale.isnan().any():
        raise PredictorError(
            "predictor_options.align 'median': a scene has no pixel with both data depth and "
            "positive model depth to scale the depth model's output by"
        )
    return scale[..., None, None]


class ExternalSource(GeometrySource):
    """``external``: planes from per-pixel depth (and normals when present and ``use_normals``), one
    plane per patch. The depth is the batch's (``batch.depth``: synthetic depth, depth maps or sparse
    COLMAP points) or, with a ``depth_model``, that frozen module's output on the views' images,
    ``(N, 3, H, W)`` in [0, 1] -> ``(N, H', W')`` or ``(N, 1, H', W')`` z-depth (resized bilinearly to
    ``(H, W)``), scaled per view to the batch's depth by the median ratio (``align="median"``) or
    used as it is, in scene units (``align="none"``).

    ``depth_noise`` (1-3) and ``depth_sparse`` (points per view) turn the data's depth into depth
    as users have it (:func:`hrope.nvs.sources.user_depth.user_depth`: estimator noise, then SfM-like
    sparse points) before any fit or transfer, view by view, on the views read (the context views
    only unless ``scope="all"``); the data's exact normals are then not used. Both 0: unchanged.

    The fit is :func:`hrope.nvs.sources.plane_fitting.fit_patch_planes`: ``fit="least-squares"``,
    :meth:`hrope.Planes.from_depth` (or ``patch_planes_from_normals``), patches without valid depth
    getting the plane at infinity; ``fit="robust"``, ``robust_patch_planes`` with ``min_points``,
    ``inlier_threshold`` and ``fallback`` (normals unused). Depth-like inputs of planes that miss
    the patch ray use ``depth_init`` (:mod:`hrope.nvs.sources.known_planes`).

    ``scope="context"`` (default) reads the context views' depth only; the target views get neutral
    values or (``targets="transfer"``) planes fitted to the context depth splatted into each target
    camera (:func:`hrope.nvs.sources.transfer.transfer_depth`; target patches without splatted depth stay
    neutral). ``scope="all"`` fits every view's own depth: an upper bound with target geometry.

    ``data_params`` (names in :data:`DEPTH_PARAMS`): inputs read off the same depth maps rather
    than the planes, added to the values: ``known_depth`` (:func:`ray_depths`) of the views whose
    depth is read (the context views, or all with ``scope="all"``), of the splatted depth in the
    target views with ``targets="transfer"`` (0, missing, where no context pixel landed) and 0
    in the target views otherwise."""

    frozen = ("depth_model",)

    def __init__(
        self,
        specs,
        patch_size: int,
        use_normals: bool = True,
        depth_init: float = 1.0,
        targets: str = "neutral",
        scope: str = "context",
        *,
        fit: str = "least-squares",
        min_points: int = 5,
        inlier_threshold: float = 0.02,
        fallback: str = "median",
        depth_model: nn.Module | None = None,
        align: str = "median",
        max_inverse_distance: float | None = DEFAULT_MAX_INVERSE_DISTANCE,
        data_params: tuple[str, ...] = (),
        depth_noise: int = 0,
        depth_sparse: int = 0,
    ) -> None:
        super().__init__(specs, targets, scope, depth_init, max_inverse_distance)
        unknown = sorted(set(data_params) - set(DEPTH_PARAMS))
        if unknown:
            raise PredictorError(
                f"the 'external' predictor cannot read {unknown} off depth maps; it reads {DEPTH_PARAMS}"
            )
        self.data_params = tuple(data_params)
        self.patch_size = patch_size
        self.use_normals = use_normals
        self.fit, self.min_points, self.inlier_threshold, self.fallback = fit, min_points, inlier_threshold, fallback
        self.depth_model = None if depth_model is None else depth_model.eval().requires_grad_(False)
        self.align = align
        self.depth_noise, self.depth_sparse = depth_noise, depth_sparse

    def _fit(self, depth: Tensor, normals: Tensor | None, cameras: Cameras) -> Planes:
        return fit_patch_planes(
            depth,
            cameras,
            self.patch_size,
            fit=self.fit,
            normals=normals if self.use_normals else None,
            min_points=self.min_points,
            threshold=self.inlier_threshold,
            fallback=self.fallback,
        )

    def _depth(self, batch, views: int) -> Tensor:
        """Depth ``(B, views, H, W)`` of the first ``views`` views (class doc)."""
        reference = getattr(batch, "depth", None)
        reference = None if reference is None else reference[:, :views]
        if self.depth_model is None:
            if reference is None:
                raise PredictorError(
                    "the 'external' predictor needs per-pixel depth in the batch (batch.depth): set "
                    "data.depth (points: COLMAP points3D.txt; maps: depth_file_path) or "
                    "predictor_options.depth: model"
                )
            if self.depth_noise or self.depth_sparse:
                return user_depth(reference, batch.images[:, :views], self.depth_noise, self.depth_sparse)
            return reference
        images = batch.images[:, :views]
        B, V, _, H, W = images.shape
        with torch.no_grad():
            predicted = self.depth_model(images.flatten(0, 1))
        predicted = predicted[:, 0] if predicted.ndim == 4 and predicted.shape[1] == 1 else predicted
        if predicted.ndim != 3 or len(predicted) != B * V:
            raise PredictorError(
                f"the depth model must return (N, H, W) or (N, 1, H, W) depth for N = {B * V} "
                f"images, got {tuple(predicted.shape)}"
            )
        predicted = F.interpolate(
            predicted[:, None].float(), size=(H, W), mode="bilinear", align_corners=False
        ).reshape(B, V, H, W)
        if self.align == "none":
            return predicted
        if reference is None:
            raise PredictorError(
                "predictor_options.align 'median' scales the depth model's output to the data's "
                "depth: set data.depth (points or maps), or align: none for a model that outputs "
                "scene units"
            )
        return predicted * _median_scale(predicted, reference)

    def static(self, batch, cameras, grid, num_context):
        exact = self.depth_model is None and not (self.depth_noise or self.depth_sparse)
        normals = getattr(batch, "normals", None) if exact else None
        if self.scope == "all":
            depth = self._depth(batch, cameras.num_views)
            return self._with_depth_params(
                self.values_of(self._fit(depth, normals, cameras), cameras, grid), depth, grid
            )
        context, targets = camera_views(cameras, 0, num_context), camera_views(cameras, num_context)
        depth = self._depth(batch, num_context)
        planes = self._fit(depth, None if normals is None else normals[:, :num_context], context)
        values = self.values_of(planes, context, grid)
        transferred, splatted = None, None
        if self.targets == "transfer":
            splatted = transfer_depth(depth.float(), cameras.to(dtype=torch.float32), num_context)
            fitted = self._fit(splatted, None, targets.to(dtype=torch.float32))
            moved = self.values_of(fitted, targets, grid)
            hit = patchify(torch.isfinite(splatted)[:, :, None].float(), self.patch_size).sum(-1).flatten(1) > 0
            transferred = moved, hit
        values = self.with_targets(values, cameras, grid, num_context, transferred)
        if splatted is None:  # neutral targets: no known depth
            splatted = depth.new_zeros(depth.shape[0], targets.num_views, *depth.shape[2:])
        return self._with_depth_params(values, torch.cat([depth.float(), splatted.float()], 1), grid)

    def _with_depth_params(self, values: dict[str, Tensor], depth: Tensor, grid: tuple[int, int]) -> dict[str, Tensor]:
        """``values`` and the :data:`DEPTH_PARAMS` asked for, from the depth maps ``(B, V, H, W)`` of all views."""
        return {**values, **({"known_depth": ray_depths(depth, grid)} if "known_depth" in self.data_params else {})}
