"""Per-patch planes fitted to per-pixel depth: least squares, from normals, or robust (RANSAC).

Every fit takes z-depth ``depth (B, V, H, W)`` (dense or sparse; pixels without finite positive
depth are ignored) seen by ``cameras (B, V)`` and returns one plane per ``patch_size`` patch,
:class:`hrope.Planes` ``(B, V * H/p * W/p)`` in token order:

- ``least-squares``: :meth:`hrope.Planes.from_depth` (the library's fit);
  :func:`patch_planes_from_normals` when per-pixel normals are known;
- ``robust``: :func:`robust_patch_planes`, RANSAC then a least-squares refit to the inliers.

:func:`fit_patch_planes` picks one by name (:data:`FITS`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ...cameras import Cameras
from ...geometry import patchify, pixel_rays
from ...planes import Planes, check_depth_maps
from ..config.options import FALLBACKS, FITS

__all__ = [
    "FITS",
    "FALLBACKS",
    "RANSAC_HYPOTHESES",
    "fit_patch_planes",
    "patch_planes_from_normals",
    "robust_patch_planes",
]

RANSAC_HYPOTHESES = 64  # planes tried per patch (fixed draws): 50 % outliers leave ~2e-4 of patches without a clean one


def fit_patch_planes(
    depth: Tensor,
    cameras: Cameras,
    patch_size: int,
    *,
    fit: str = "least-squares",
    normals: Tensor | None = None,
    min_points: int = 5,
    threshold: float = 0.02,
    fallback: str = "median",
) -> Planes:
    """Per-patch planes by ``fit`` (:data:`FITS`), in float32.

    ``least-squares``: :func:`patch_planes_from_normals` with ``normals (B, V, 3, H, W)`` when
    given, else :meth:`hrope.Planes.from_depth`; ``robust``: :func:`robust_patch_planes` with
    ``min_points``, ``threshold`` and ``fallback`` (normals unused).
    """
    if fit == "robust":
        return robust_patch_planes(depth, cameras, patch_size, min_points, threshold, fallback)
    if normals is not None:
        return patch_planes_from_normals(depth, normals, cameras, patch_size)
    return Planes.from_depth(depth.float(), cameras.to(dtype=torch.float32), patch_size)


def patch_planes_from_normals(depth: Tensor, normals: Tensor, cameras: Cameras, patch_size: int) -> Planes:
    """Per-patch planes with the mean pixel normal of the patch and the least-squares offset.

    ``depth (B, V, H, W)``, ``normals (B, V, 3, H, W)`` camera frame. The offset solves
    ``min_d Σ (n·X - d)^2`` over the patch's valid back-projected points X, i.e. the mean of n·X.
    A patch without valid depth gets the plane at infinity (m = 0); one whose normals cancel or whose
    plane contains the camera centre gets the fronto-parallel plane through its mean point.
    """
    check_depth_maps(depth, cameras, patch_size)
    ok = (torch.isfinite(depth) & (depth > 0)).float()[:, :, None]  # (B, V, 1, H, W)
    z = torch.where(ok > 0, depth[:, :, None], torch.zeros_like(ok)).float()
    points = pixel_rays(cameras.K.float(), cameras.image_size).movedim(-1, 2) * z  # (B, V, 3, H, W)

    def per_patch(x: Tensor) -> Tensor:  # (B, V, C, H, W) -> sum over each patch (B, N, C)
        return patchify(x, patch_size).sum(-1).flatten(1, 2)

    n_sum = per_patch(normals.float() * ok)
    count = per_patch(ok).squeeze(-1)
    mean_point = per_patch(points * ok) / count.clamp_min(1)[..., None]
    normal = F.normalize(n_sum, dim=-1)
    d = (normal * mean_point).sum(-1)
    good = (count > 0) & (n_sum.norm(dim=-1) > 1e-6) & (d.abs() > 1e-6)
    fronto = F.pad(1.0 / mean_point[..., 2:].clamp_min(1e-6), (2, 0))  # (0, 0, 1 / z̄)
    m = torch.where(
        good[..., None],
        normal / torch.where(good, d, torch.ones_like(d))[..., None],
        torch.where((count > 0)[..., None], fronto, torch.zeros_like(fronto)),
    )
    return Planes.from_m(m)


def robust_patch_planes(
    depth: Tensor,
    cameras: Cameras,
    patch_size: int,
    min_points: int = 5,
    threshold: float = 0.02,
    fallback: str = "median",
) -> Planes:
    """Per-patch planes from z-depth ``(B, V, H, W)`` (sparse, e.g. SfM points, or dense) that ignore outliers.

    Pixels with finite positive depth are back-projected (pixel centres). A patch with at least
    ``min_points`` of them runs RANSAC: :data:`RANSAC_HYPOTHESES` planes through three of its points
    (the same fixed draws in every patch), a point being an inlier when its distance to the plane is
    below ``threshold`` times its depth; the plane with the most inliers is refitted to its inliers by
    least squares (:meth:`hrope.Planes.from_depth`). A patch with fewer points, or fewer inliers,
    gets the ``fallback`` (:data:`FALLBACKS`): ``median``, the fronto-parallel plane at the median depth
    of its points, or of its view's points when it has none (the plane at infinity, m = 0, when the
    view has none either); ``infinity``, the plane at infinity.
    """
    check_depth_maps(depth, cameras, patch_size)
    depth, cameras = depth.float(), cameras.to(dtype=torch.float32)
    B, V, H, W = depth.shape
    p = patch_size
    ok = torch.isfinite(depth) & (depth > 0)
    z = torch.where(ok, depth, torch.zeros_like(depth))
    points = patchify((pixel_rays(cameras.K, (H, W)) * z[..., None]).movedim(-1, 2), p).mT.flatten(1, 2)  # (B, N, K, 3)
    valid = patchify(ok[:, :, None].float(), p)[:, :, :, 0].flatten(1, 2) > 0  # (B, N, K)
    inliers = _ransac_inliers(points, valid, threshold)  # (B, N, K)
    inlier_map = inliers.reshape(B, V, H // p, W // p, p, p).transpose(3, 4).reshape(B, V, H, W)
    grid = (H // p, W // p)
    fitted = Planes.from_depth(depth, cameras, p, valid=inlier_map).m(cameras, grid)
    if fallback == "infinity":
        rest = torch.zeros_like(fitted)
    else:
        rest = _median_planes(points, valid, torch.where(ok, depth, torch.nan), grid)
    enough = inliers.sum(-1) >= min_points  # (so the patch has that many valid points too)
    return Planes.from_m(torch.where(enough[..., None], fitted, rest))


def _inliers(points: Tensor, valid: Tensor, normal: Tensor, offset: Tensor, threshold: float) -> Tensor:
    """``(B, N, K)``: valid points ``(B, N, K, 3)`` within ``threshold`` x their depth of the planes
    ``{X : normal·X = offset}`` (``normal (B, N, 3)`` unit, ``offset (B, N)``)."""
    distance = ((points * normal[:, :, None]).sum(-1) - offset[..., None]).abs()
    return valid & (distance < threshold * points[..., 2])


def _ransac_inliers(points: Tensor, valid: Tensor, threshold: float) -> Tensor:
    """``(B, N, K)``: the inliers of the best of :data:`RANSAC_HYPOTHESES` planes per patch, each
    through three distinct valid points of the patch's ``points (B, N, K, 3)`` (``valid (B, N, K)``)."""
    # three distinct valid points per hypothesis: positions in the patch's valid points, mapped through `order`
    count = valid.sum(-1, keepdim=True).clamp_min(3)  # (B, N, 1)
    draws = torch.rand(RANSAC_HYPOTHESES, 3, generator=torch.Generator().manual_seed(0)).to(points.device)
    first = (draws[:, 0] * count).long()
    second = (first + 1 + (draws[:, 1] * (count - 1)).long()) % count
    third = (draws[:, 2] * (count - 2)).long()
    third = third + (third >= torch.minimum(first, second)).long()
    third = third + (third >= torch.maximum(first, second)).long()
    order = torch.argsort((~valid).to(torch.uint8), dim=-1, stable=True)  # valid points first
    index = order.gather(-1, torch.cat([first, second, third], -1))  # (B, N, 3 * hypotheses)
    corners = points.gather(2, index[..., None].expand(-1, -1, -1, 3)).unflatten(2, (3, RANSAC_HYPOTHESES))
    a, b = corners[:, :, 1] - corners[:, :, 0], corners[:, :, 2] - corners[:, :, 0]  # (B, N, hypotheses, 3)
    normal = torch.cross(a, b, dim=-1)
    area = normal.norm(dim=-1)
    proper = area > 1e-6 * a.norm(dim=-1) * b.norm(dim=-1)  # not (nearly) collinear
    normal = normal / area.clamp_min(torch.finfo(area.dtype).tiny)[..., None]
    offset = (normal * corners[:, :, 0]).sum(-1)
    scores = torch.stack(
        [
            _inliers(points, valid, normal[:, :, h], offset[:, :, h], threshold).sum(-1)
            for h in range(RANSAC_HYPOTHESES)
        ],
        -1,
    )
    best = torch.where(proper, scores, -1).argmax(-1, keepdim=True)  # (B, N, 1)
    best_normal = normal.gather(2, best[..., None].expand(-1, -1, -1, 3))[:, :, 0]
    return _inliers(points, valid, best_normal, offset.gather(2, best)[..., 0], threshold)


def _median_planes(points: Tensor, valid: Tensor, view_depth: Tensor, grid: tuple[int, int]) -> Tensor:
    """Plane vectors ``(B, N, 3)``: the fronto-parallel plane at the median depth of each patch's valid
    ``points (B, N, K, 3)``, or of its view's depth ``(B, V, H, W)`` (nan where invalid) when the
    patch has none; m = 0 (the plane at infinity) when the view has no depth either."""
    patch_median = torch.where(valid, points[..., 2], torch.nan).nanmedian(-1).values  # (B, N), nan: no point
    view_median = view_depth.flatten(2).nanmedian(-1).values  # (B, V)
    median = torch.where(patch_median.isnan(), view_median.repeat_interleave(grid[0] * grid[1], 1), patch_median)
    return F.pad((1.0 / median).nan_to_num(0.0)[..., None], (2, 0))  # (0, 0, 1 / z), 0 without any depth
