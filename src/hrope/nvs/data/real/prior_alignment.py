"""Monocular depth priors aligned to sparse metric depth, and how well the priors agree with SfM.

A monocular depth prior (``Scene.relative_depth``, e.g. MonoSDF's Omnidata depth) is known up to an
unknown scale and shift per view. :func:`align_depth` recovers them from sparse metric z-depth (SfM
points projected into the view) by RANSAC then least squares, in one of two models (:data:`SPACES`):

- ``depth``: ``z = scale * r + shift`` (the prior is affine in depth);
- ``inverse``: ``1 / z = scale / r + shift`` (the prior's inverse is affine in inverse depth, the
  model of disparity-like outputs).

Both fits minimise the **relative depth error** ``|ẑ - z| / z`` at the points: a point is an inlier
when it is below ``threshold``. ``scale`` must be positive (depth grows with the prior). Which model
fits scan24's SfM points better is measured in docs/real_data.md ("Priors aligned to SfM points"),
which sets :data:`DEFAULT_SPACE`.

:func:`prior_report` compares, per view, the planes the priors give (each patch's mean prior normal
and the aligned depth: the ``external`` source's least-squares fit with ``use_normals``) with the
planes fitted robustly to the sparse points, by the angle between their normals.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ....errors import InputError
from ....shapes import check_shapes

__all__ = [
    "Alignment",
    "AlignmentError",
    "PriorReport",
    "align_depth",
    "prior_report",
    "SPACES",
    "DEFAULT_SPACE",
    "THRESHOLD",
    "MIN_POINTS",
    "HYPOTHESES",
]

SPACES = ("depth", "inverse")
DEFAULT_SPACE = "depth"
THRESHOLD = 0.05  # relative depth error below which a point is an inlier
MIN_POINTS = 10  # points (and inliers) a view needs for an alignment
HYPOTHESES = 256  # RANSAC draws of two points per view (fixed draws)
REFITS = 2  # least-squares refits to the inliers after RANSAC


class AlignmentError(InputError):
    """Invalid input to :func:`align_depth` or :func:`prior_report`."""


@dataclass(frozen=True)
class Alignment:
    """Per view ``V`` the prior aligned to metric z-depth.

    ``depth (V, H, W)``: the aligned prior, NaN where the prior is NaN, where the model gives a
    non-positive depth, and in every pixel of a view that is not ``valid``; ``scale``, ``shift``
    ``(V,)`` (NaN when not valid); ``residual (V,)``: the median relative depth error
    ``|ẑ - z| / z`` over the view's points (NaN when not valid); ``inliers``, ``points`` ``(V,)``
    int64: points within the threshold and all points with both a prior and a sparse depth;
    ``valid (V,)`` bool: at least ``min_points`` inliers and a positive scale; ``space``: the model.
    """

    depth: Tensor
    scale: Tensor
    shift: Tensor
    residual: Tensor
    inliers: Tensor
    points: Tensor
    valid: Tensor
    space: str


def align_depth(
    relative: Tensor,
    sparse: Tensor,
    *,
    space: str = DEFAULT_SPACE,
    threshold: float = THRESHOLD,
    min_points: int = MIN_POINTS,
) -> Alignment:
    """Align ``relative (V, H, W)`` (the prior; NaN: none) to ``sparse (V, H, W)`` metric z-depth
    (not finite or <= 0: no point) view by view (module doc).

    Per view: :data:`HYPOTHESES` lines through two of its points (the same fixed draws in every
    view; a draw with a non-positive scale is skipped), the one with the most inliers (relative depth
    error < ``threshold``) refitted :data:`REFITS` times by least squares of the relative error over
    its inliers. A view with fewer than ``min_points`` points or inliers is not valid: NaN depth,
    scale, shift and residual, ``valid`` False (no exception, so one bad view does not stop a capture).
    Computed in float64; ``depth`` in ``relative``'s dtype.
    """
    _check_inputs(relative, sparse, space, threshold, min_points)
    r, z = relative.double(), sparse.double()
    usable = torch.isfinite(r) & (r > 0) if space == "inverse" else torch.isfinite(r)
    x = torch.where(usable, 1 / r if space == "inverse" else r, torch.nan).flatten(1)  # (V, H*W)
    has = usable.flatten(1) & torch.isfinite(z).flatten(1) & (z.flatten(1) > 0)
    xs, zs, ok = _packed(x, z.flatten(1), has)  # (V, K)
    scale, shift = _ransac(xs, zs, ok, space, threshold)
    for _ in range(REFITS):
        scale, shift = _refit(xs, zs, _errors(xs, zs, ok, scale, shift, space) < threshold, space)
    errors = _errors(xs, zs, ok, scale, shift, space)
    inliers = (errors < threshold).sum(1)
    points = ok.sum(1)
    valid = (points >= min_points) & (inliers >= min_points) & (scale > 0) & torch.isfinite(shift)
    nan = torch.full_like(scale, torch.nan)
    scale, shift = torch.where(valid, scale, nan), torch.where(valid, shift, nan)
    at_points = torch.where(ok, errors, torch.nan)
    residual = torch.where(valid, at_points.nanmedian(1).values, nan) if ok.shape[1] else nan
    depth = _model(x, scale[:, None], shift[:, None], space).reshape(relative.shape)
    depth = torch.where(torch.isfinite(depth) & (depth > 0), depth, torch.nan).to(relative.dtype)
    return Alignment(depth, scale, shift, residual, inliers, points, valid, space)


def _check_inputs(relative: Tensor, sparse: Tensor, space: str, threshold: float, min_points: int) -> None:
    """One-line :class:`AlignmentError` for bad arguments of :func:`align_depth`."""
    check_shapes({"relative": (relative, "V H W"), "sparse": (sparse, "V H W")}, error=AlignmentError, floating=True)
    if relative.device != sparse.device:
        raise AlignmentError(f"relative is on {relative.device} but sparse on {sparse.device}")
    if space not in SPACES:
        raise AlignmentError(f"space must be one of {SPACES}, got {space!r}")
    if not threshold > 0:
        raise AlignmentError(f"threshold must be positive, got {threshold}")
    if min_points < 2:
        raise AlignmentError(f"min_points must be at least 2 (a scale and a shift), got {min_points}")
    if torch.isinf(relative).any():
        raise AlignmentError("relative holds inf; a missing prior is NaN, anything else must be finite")


def _packed(x: Tensor, z: Tensor, has: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Each view's points first: ``x``, ``z`` ``(V, K)`` (K: the most points of a view) and which are points."""
    count = int(has.sum(1).max()) if has.numel() else 0
    order = torch.argsort((~has).to(torch.uint8), dim=1, stable=True)[:, :count]
    ok = has.gather(1, order)
    return torch.where(ok, x.gather(1, order), 0.0), torch.where(ok, z.gather(1, order), 1.0), ok


def _model(x: Tensor, scale: Tensor, shift: Tensor, space: str) -> Tensor:
    """The aligned depth of the prior's linear variable ``x`` (``r`` or ``1 / r``); inf for 1/0."""
    line = scale * x + shift
    return line if space == "depth" else 1 / line


def _errors(x: Tensor, z: Tensor, ok: Tensor, scale: Tensor, shift: Tensor, space: str) -> Tensor:
    """``(V, K)`` relative depth errors of lines ``scale``, ``shift`` ``(V,)`` (inf off the points,
    or where the model's depth is not positive)."""
    depth = _model(x, scale[:, None], shift[:, None], space)
    error = (depth - z).abs() / z
    return torch.where(ok & (depth > 0) & torch.isfinite(error), error, torch.inf)


def _ransac(x: Tensor, z: Tensor, ok: Tensor, space: str, threshold: float) -> tuple[Tensor, Tensor]:
    """``scale``, ``shift`` ``(V,)`` of the line through two points with the most inliers."""
    V, K = x.shape
    count = ok.sum(1).clamp_min(2)  # (V,)
    draws = torch.rand(HYPOTHESES, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64).to(x.device)
    first = (draws[:, :1].T * count[:, None]).long()  # (V, hypotheses)
    second = (first + 1 + (draws[:, 1:].T * (count[:, None] - 1)).long()) % count[:, None]
    if K < 2:
        nan = x.new_full((V,), torch.nan)
        return nan, nan
    y = z if space == "depth" else 1 / z
    x1, x2, y1, y2 = x.gather(1, first), x.gather(1, second), y.gather(1, first), y.gather(1, second)
    scales = (y2 - y1) / (x2 - x1)
    shifts = y1 - scales * x1
    best = torch.full((V,), -1, dtype=torch.long, device=x.device)
    scale, shift = x.new_full((V,), torch.nan), x.new_full((V,), torch.nan)
    for h in range(HYPOTHESES):
        proper = torch.isfinite(scales[:, h]) & (scales[:, h] > 0)
        score = (_errors(x, z, ok, scales[:, h], shifts[:, h], space) < threshold).sum(1)
        better = proper & (score > best)
        best = torch.where(better, score, best)
        scale, shift = torch.where(better, scales[:, h], scale), torch.where(better, shifts[:, h], shift)
    return scale, shift


def _refit(x: Tensor, z: Tensor, inliers: Tensor, space: str) -> tuple[Tensor, Tensor]:
    """Weighted least squares ``scale``, ``shift`` ``(V,)`` over the ``inliers`` ``(V, K)``: residuals
    of the line divided by ``z`` (``depth``) or times ``z`` (``inverse``), the relative depth error
    to first order. NaN for a view with fewer than two distinct inliers."""
    y = z if space == "depth" else 1 / z
    w = torch.where(inliers, z**-2 if space == "depth" else z**2, 0.0)
    sw, sx, sy = w.sum(1), (w * x).sum(1), (w * y).sum(1)
    sxx, sxy = (w * x * x).sum(1), (w * x * y).sum(1)
    det = sw * sxx - sx * sx
    good = det > 1e-12 * sw * sxx
    det = torch.where(good, det, torch.nan)
    return (sw * sxy - sx * sy) / det, (sxx * sy - sx * sxy) / det


@dataclass(frozen=True)
class PriorReport:
    """How the aligned priors agree with the sparse points, per view ``V`` and over all views.

    From the :class:`Alignment`: ``residual``, ``points``, ``inliers``, ``valid`` ``(V,)``. Normals:
    ``patches (V,)`` int64, the patches with both a prior plane and a plane fitted to the points;
    ``angle_median``, ``angle_p90`` ``(V,)`` degrees (NaN without such patches) and ``angles``, every
    compared patch's angle (degrees) of all views; :meth:`summary` pools them.
    """

    residual: Tensor
    points: Tensor
    inliers: Tensor
    valid: Tensor
    patches: Tensor
    angle_median: Tensor
    angle_p90: Tensor
    angles: Tensor

    def summary(self) -> dict[str, float | int]:
        """Views aligned, the median and 90th percentile over views of the residual, and of the pooled angles."""
        residual = self.residual[self.valid].double()
        angles = self.angles.double()

        def quantile(x: Tensor, q: float) -> float:
            return float(x.quantile(q)) if x.numel() else float("nan")

        return {
            "views": len(self.valid),
            "views_aligned": int(self.valid.sum()),
            "residual_median": quantile(residual, 0.5),
            "residual_p90": quantile(residual, 0.9),
            "patches": int(self.patches.sum()),
            "angle_median_deg": quantile(angles, 0.5),
            "angle_p90_deg": quantile(angles, 0.9),
        }


def prior_report(alignment: Alignment, prior_planes: Tensor, sfm_planes: Tensor) -> PriorReport:
    """The alignment's residuals and the angles between the prior planes' and the SfM planes' normals.

    ``prior_planes``, ``sfm_planes`` ``(V, N, 3)``: plane vectors ``m`` (:class:`hrope.Planes`, camera
    frame) of the same ``N`` patches of each view, the plane at infinity (``m = 0``) where a patch has
    none: the priors' from ``fit_patch_planes(alignment.depth, cameras, p, normals=normals)`` (the
    ``external`` source with ``use_normals``), the points' from ``robust_patch_planes(sparse, cameras,
    p, fallback="infinity")`` (:mod:`hrope.nvs.sources.plane_fitting`; both take a leading batch dim).
    The angle between two planes is that between their normals, unsigned: ``acos(|m1·m2| / |m1||m2|)``
    in [0, 90] degrees.
    """
    V = len(alignment.valid)
    check_shapes(
        {"prior_planes": (prior_planes, "V N 3"), "sfm_planes": (sfm_planes, "V N 3")},
        error=AlignmentError,
        dims={"V": V},
        floating=True,
    )
    a, b = prior_planes.double(), sfm_planes.double()
    na, nb = a.norm(dim=-1), b.norm(dim=-1)
    both = (na > 0) & (nb > 0) & torch.isfinite(na) & torch.isfinite(nb)  # (V, N)
    cos = ((a * b).sum(-1).abs() / (na * nb)).clamp(max=1.0)
    angle = torch.where(both, torch.rad2deg(torch.arccos(cos)), torch.nan)
    return PriorReport(
        residual=alignment.residual,
        points=alignment.points,
        inliers=alignment.inliers,
        valid=alignment.valid,
        patches=both.sum(1),
        angle_median=angle.nanquantile(0.5, dim=1),
        angle_p90=angle.nanquantile(0.9, dim=1),
        angles=angle[both],
    )
