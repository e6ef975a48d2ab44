"""How well a capture's monocular priors agree with its SfM points: alignment residuals and normal angles.

For one capture with monocular priors (e.g. DTU scan24 in MonoSDF's layout): SfM points from the
training views only (:func:`hrope.nvs.data.real.sfm.triangulate`; test targets are the views with
index % test_every == 0, validation targets index % test_every == test_every // 2, the rest train),
each training view's relative depth aligned to the sparse depth of the points it observes
(:func:`hrope.nvs.data.real.prior_alignment.align_depth`), then per view and pooled
(:func:`~hrope.nvs.data.real.prior_alignment.prior_report`):

- the alignment residual (median relative depth error at the points);
- the angle between the prior planes (mean prior normal per patch, offset from the aligned depth: the
  ``external`` source's fit with ``use_normals``) and the planes fitted robustly to the points
  (``robust_patch_planes``, patches with fewer than ``min_points`` inliers left out); beside it the
  same angle for fronto-parallel planes, the orientation a patch gets without normals, as a baseline;
- the two alignment models compared by held-out error: each view's points split in two halves at
  random (``--splits`` draws), fitted on one, the median relative error measured on the other.

    python -m experiments.priors_alignment --capture shared/realdata/scan24 --test-every 4

It writes ``benchmarks/results/real_captures/priors_alignment.json`` (``--out``); the SfM points
are cached in the git-ignored ``cache/`` beside it (``--sfm-cache``).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from hrope.cameras import Cameras
from hrope.nvs.data import load_scene
from hrope.nvs.data.real.loaders import scene_frames
from hrope.nvs.data.real.prior_alignment import (
    DEFAULT_SPACE,
    MIN_POINTS,
    SPACES,
    THRESHOLD,
    Alignment,
    PriorReport,
    align_depth,
    prior_report,
)
from hrope.nvs.data.real.sfm import triangulate, sparse_depth
from hrope.nvs.data.real.view_splits import split_views
from hrope.nvs.running.atomic import write_json
from hrope.nvs.running.provenance import provenance
from hrope.nvs.sources.plane_fitting import fit_patch_planes, robust_patch_planes

OUT = Path("benchmarks/results/real_captures/priors_alignment.json")


def held_out_errors(relative: Tensor, sparse: Tensor, space: str, splits: int) -> Tensor:
    """``(splits, V)``: per random halving of each view's points, the median relative depth error at
    the held-out half of the alignment fitted to the other half (NaN where either half is too small)."""
    has = torch.isfinite(sparse)
    errors = []
    for seed in range(splits):
        half = torch.rand(sparse.shape, generator=torch.Generator().manual_seed(seed)) < 0.5
        aligned = align_depth(relative, torch.where(half, sparse, torch.inf), space=space).depth.double()
        error = torch.where(has & ~half, (aligned - sparse).abs() / sparse, torch.nan)
        errors.append(error.flatten(1).nanmedian(1).values)
    return torch.stack(errors)


def compare_spaces(relative: Tensor, sparse: Tensor, splits: int) -> dict[str, Any]:
    """Held-out errors of the two models (:data:`SPACES`): medians and how often ``depth`` is the lower."""
    errors = {space: held_out_errors(relative, sparse, space, splits) for space in SPACES}
    both = errors["depth"].isfinite() & errors["inverse"].isfinite()
    depth, inverse = errors["depth"][both], errors["inverse"][both]
    return {
        "splits": splits,
        "pairs": int(both.sum()),
        "held_out_median": {space: float(errors[space][both].median()) for space in SPACES},
        "depth_lower_share": float((depth < inverse).double().mean()),
        "median_difference_inverse_minus_depth": float((inverse - depth).median()),
    }


def plane_report(
    alignment: Alignment, sparse: Tensor, normals: Tensor, cameras: Cameras, patch: int, min_points: int
) -> tuple[PriorReport, PriorReport]:
    """:func:`prior_report` of the prior planes and of fronto-parallel planes against the points' robust planes."""
    cameras = cameras.to(dtype=torch.float32)
    V, H, W = sparse.shape
    grid = (H // patch, W // patch)
    prior = fit_patch_planes(alignment.depth[None].float(), cameras, patch, normals=normals[None].float())
    points = robust_patch_planes(sparse[None].float(), cameras, patch, min_points=min_points, fallback="infinity")
    prior_m, points_m = prior.m(cameras, grid).reshape(V, -1, 3), points.m(cameras, grid).reshape(V, -1, 3)
    fronto = torch.where(prior_m.norm(dim=-1, keepdim=True) > 0, torch.tensor([0.0, 0.0, 1.0]), 0.0)
    return prior_report(alignment, prior_m, points_m), prior_report(alignment, fronto, points_m)


def per_view(views: list[int], report: PriorReport, fronto: PriorReport, alignment: Alignment) -> list[dict[str, Any]]:
    """One row per training view: its alignment and the normal angles (NaN as None)."""

    def value(x: Tensor) -> float | int | bool | None:
        item = x.item()
        return None if isinstance(item, float) and item != item else item

    return [
        {
            "view": view,
            "points": value(report.points[v]),
            "inliers": value(report.inliers[v]),
            "aligned": value(report.valid[v]),
            "scale": value(alignment.scale[v]),
            "shift": value(alignment.shift[v]),
            "residual": value(report.residual[v]),
            "patches": value(report.patches[v]),
            "angle_median_deg": value(report.angle_median[v]),
            "angle_p90_deg": value(report.angle_p90[v]),
            "fronto_angle_median_deg": value(fronto.angle_median[v]),
        }
        for v, view in enumerate(views)
    ]


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The report of ``args.capture`` (module doc) as a JSON-ready dict."""
    views = split_views(len(scene_frames(args.capture)), args.test_every)["train"]
    points = triangulate(args.capture, views, cache_dir=args.sfm_cache)
    scene = load_scene(args.capture, views=views, priors=True)
    if scene.relative_depth is None or scene.normals is None:
        raise SystemExit(f"{args.capture}: the capture has no depth and normal priors")
    sparse = sparse_depth(points, scene, views).double()
    alignment = align_depth(scene.relative_depth, sparse, space=args.space)
    report, fronto = plane_report(alignment, sparse, scene.normals, scene.cameras, args.patch, args.min_points)
    return {
        "command": "python -m experiments.priors_alignment " + shlex.join(args.argv),
        "provenance": provenance(),
        "capture": Path(args.capture).name,
        "image_size": list(scene.image_size),
        "training_views": views,
        "sfm": points.stats,
        "alignment": {"space": args.space, "threshold": THRESHOLD, "min_points": MIN_POINTS},
        "planes": {"patch": args.patch, "robust_min_points": args.min_points, "fit": "robust_patch_planes"},
        "spaces": compare_spaces(scene.relative_depth, sparse, args.splits),
        "summary": report.summary(),
        "fronto_parallel_summary": fronto.summary(),
        "views": per_view(views, report, fronto, alignment),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__)
    parser.add_argument("--capture", required=True, help="a capture folder with monocular priors")
    parser.add_argument("--test-every", type=int, default=8, help="every N-th view is a test target (scan24: 4)")
    parser.add_argument("--space", choices=SPACES, default=DEFAULT_SPACE, help="the alignment model")
    parser.add_argument("--patch", type=int, default=24, help="patch size in pixels of the images read")
    parser.add_argument("--min-points", type=int, default=5, help="inliers a patch needs for a plane from the points")
    parser.add_argument("--splits", type=int, default=10, help="random halvings for the held-out comparison")
    parser.add_argument("--sfm-cache", type=Path, default=OUT.parent / "cache" / "sfm")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else argv
    result = run(args)
    write_json(args.out, result)
    print(f"wrote {args.out}: {result['summary']}")
    return result


if __name__ == "__main__":
    main()
