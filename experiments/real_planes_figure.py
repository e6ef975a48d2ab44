"""Planes on a real view: from SfM points, from the aligned priors and learned, side by side.

For one context view of one test scene of a capture (the scenes of the learned run's data section:
for the ``priors`` set's cell, protocol ``views``, every 4th view of scan24 a test target, the
run's image size), the planes per patch that

- (i) the SfM rows are given: the ``external`` source (``fit: robust``) on the sparse depth of the
  SfM points the view sees (``data.geometry: sfm``),
- (ii) the priors rows are given: the ``external`` source (``use_normals: true``) on the monocular
  depth aligned to those points, with the prior normals (``data.geometry: priors``),
- (iii) the learned-plane ``hrope-lift`` model predicts (the run given, e.g. the ``priors`` set's cell).

(i) and (ii) are the planes the ``priors`` set's ``hrope-lift`` depth cells read: their model
(:func:`experiments.rows.cell_settings` of the set's arm, at the run's size, random weights, which
no plane of a geometry source depends on) run on the view's scene, its planes read as for (iii) by
:func:`hrope.nvs.viz.figures.context_planes`. The figure: normals coloured ``(n + 1) / 2`` (camera
axes, OpenCV: x red, y green, z blue) in the first row; in the second, the inverse depth ``1 / z``
where each plane crosses its patch-centre ray (scene units of the normalised scene: the context
baseline is 1), beside the SfM points the view sees. ``×``: no plane (m = 0, the plane at
infinity); ``·`` in (i): fewer SfM points than the robust fit's ``min_points``, so its fallback
plane (fronto-parallel at the median depth).

    CELLS=benchmarks/results/real_captures/priors/cache/none-photo/hrope-lift.learned.ctx2.targets-transfer
    python -m experiments.real_planes_figure --capture ../shared/realdata/scan24 --learned $CELLS/seed0-HASH \\
        --out docs/images/real_planes.png [--scene 0] [--view 0]
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch import Tensor

from hrope.errors import InputError
from hrope.geometry import patchify
from hrope.nvs.build_data import build_dataset, collate
from hrope.nvs.config import RunConfig
from hrope.nvs.model import build_model
from hrope.nvs.pretrained import load_trained
from hrope.nvs.running.atomic import save_figure
from hrope.nvs.viz.figures import context_planes, normal_colours

from .real_captures_sets import SETS, Arm
from .rows import BUDGETS, Cell, cell_settings

__all__ = ["Panel", "ViewPlanes", "depth_arm", "depth_config", "view_planes", "plot", "main"]

GEOMETRIES = ("sfm", "priors")
TITLES = {
    "sfm": "(i) SfM points, robust fit",
    "priors": "(ii) aligned priors, prior normals",
}


@dataclass
class Panel:
    """One source's planes of the view, as :meth:`hrope.Planes.normal_and_depth` gives them: unit
    normals ``(P, 3)`` and the z-depth ``(P,)`` where each crosses its patch-centre ray (inf: no
    plane; negative: crossed behind the camera), camera frame, token order."""

    title: str
    normals: Tensor
    depth: Tensor


@dataclass
class ViewPlanes:
    """The figure's data: the view's ``image (3, H, W)``, the SfM points' sparse z-depth it sees
    ``sfm_depth (H, W)`` (inf elsewhere), the panels (i), (ii), (iii), the model's ``grid`` and
    ``patch_size``, the robust fit's ``min_points`` and a ``label`` of the view."""

    image: Tensor
    sfm_depth: Tensor
    panels: list[Panel]
    grid: tuple[int, int]
    patch_size: int
    min_points: int
    label: str


def depth_arm(geometry: str) -> Arm:
    """The ``priors`` set's ``hrope-lift`` depth arm on ``geometry`` (sfm or priors)."""
    return next(a for a in SETS["priors"].arms if a.row.encoding == "hrope-lift" and a.data.geometry == geometry)


def depth_config(run: RunConfig, arm: Arm) -> RunConfig:
    """``run``'s config with the model and geometry of the benchmark's depth ``arm``: its encoding,
    predictor and options as :func:`experiments.rows.cell_settings` gives the arm's cells, at the
    run's model size."""
    row = cell_settings(replace(BUDGETS["full"], model={}), Cell(arm.data.name, arm.row, 0))["model"]
    values = run.to_dict()
    model = {k: v for k, v in values["model"].items() if k not in ("predictor_options", "encoding_options")}
    values["model"] = {**model, **row}
    values["data"] = {**values["data"], "geometry": arm.data.geometry}
    return RunConfig.from_dict(values)


def _on_capture(config: RunConfig, capture: Path) -> RunConfig:
    """``config`` reading the one capture folder ``capture`` (its ``test_every_by_capture`` kept for it)."""
    if config.data.kind != "captures":
        raise InputError(f"--learned: the run was trained on data.kind {config.data.kind!r}, not 'captures'")
    values = config.to_dict()
    by_capture = {k: v for k, v in (values["data"].get("test_every_by_capture") or {}).items() if k == capture.name}
    values["data"] = {**values["data"], "root": str(capture), "test_every_by_capture": by_capture}
    return RunConfig.from_dict(values)


def _panel(title: str, model, config: RunConfig, scene: int, view: int, device: torch.device):
    """The panel of ``model`` on test scene ``scene``'s context view ``view``, and that scene's batch."""
    data = build_dataset(config, "eval")
    if not 0 <= scene < len(data):
        raise InputError(f"--scene {scene} is out of range: the capture has {len(data)} test scenes")
    batch = collate([data[scene]], config.data.num_context, device)
    normals, depth = context_planes(model.eval(), batch)
    return Panel(title, normals[0, view].cpu(), depth[0, view].cpu()), batch, data.cuts[scene]


def view_planes(
    learned: str | Path, capture: str | Path, scene: int = 0, view: int = 0, device: str = "cpu"
) -> ViewPlanes:
    """The planes (i)-(iii) (module doc) of context view ``view`` of test scene ``scene`` of ``capture``."""
    if view not in (0, 1):
        raise InputError(f"--view must be 0 or 1 (a scene's two context views), got {view}")
    model, run = load_trained(learned, device)
    run = _on_capture(run, Path(capture))
    panels, batches, sources = [], {}, {}
    for geometry in GEOMETRIES:
        config = depth_config(run, depth_arm(geometry))
        source = build_model(config).to(device)
        panel, batches[geometry], cut = _panel(TITLES[geometry], source, config, scene, view, torch.device(device))
        panels.append(panel)
        sources[geometry] = source.source
    steps, seed = run.train.steps, run.train.seed
    title = f"(iii) learned, {steps} steps, seed {seed}"
    panels.append(_panel(title, model, run, scene, view, torch.device(device))[0])
    sfm = batches["sfm"]
    return ViewPlanes(
        image=sfm.images[0, view].float().cpu(),
        sfm_depth=sfm.depth[0, view].float().cpu(),
        panels=panels,
        grid=run.model.grid,
        patch_size=run.model.patch_size,
        min_points=sources["sfm"].min_points,
        label=f"{cut.capture}: test target {cut.target}, its context {view} (view {cut.context[view]})",
    )


def point_counts(planes: ViewPlanes) -> Tensor:
    """``(P,)`` the SfM points (pixels with depth) in each patch of the view, token order."""
    seen = torch.isfinite(planes.sfm_depth)[None, None, None].float()  # (1, 1, 1, H, W)
    return patchify(seen, planes.patch_size).sum(-1).flatten()


def _marks(axis, planes: ViewPlanes, missing: Tensor, marker: str) -> None:
    """``marker`` at the centres of the patches where ``missing (P,)``."""
    gw, p = planes.grid[1], planes.patch_size
    index = missing.nonzero().flatten()
    x, y = (index % gw + 0.5) * p, (index // gw + 0.5) * p
    axis.plot(x.numpy(), y.numpy(), linestyle="none", marker=marker, color="black", markersize=4)


def _limits(values: Tensor) -> tuple[float, float]:
    """The colour range of ``values``: their 2nd and 98th percentiles ((0, 1) when there are none)."""
    if not values.numel():
        return 0.0, 1.0
    low, high = (torch.quantile(values.double(), q).item() for q in (0.02, 0.98))
    return low, max(high, low + 1e-6)


def _column(axes, planes: ViewPlanes, index: int, limits: tuple[float, float]):
    """Panel ``index``'s normals and inverse depth into the two ``axes``; returns the depth image."""
    panel, box = planes.panels[index], (0, planes.image.shape[-1], planes.image.shape[-2], 0)
    colours = normal_colours(panel.normals, planes.grid, planes.patch_size)
    axes[0].imshow(colours.permute(1, 2, 0).numpy(), extent=box)
    axes[0].set_title(panel.title, fontsize=8)
    inverse = torch.where(torch.isfinite(panel.depth), 1.0 / panel.depth, 0.0).reshape(planes.grid)
    shown = axes[1].imshow(inverse.numpy(), cmap="viridis", vmin=limits[0], vmax=limits[1], extent=box)
    for axis in axes:
        _marks(axis, planes, ~torch.isfinite(panel.depth), "x")
        if index == 0:  # (i): the robust fit's fallback where too few points
            _marks(axis, planes, (point_counts(planes) < planes.min_points) & torch.isfinite(panel.depth), ".")
    return shown


def plot(planes: ViewPlanes, path: str | Path) -> Path:
    """The figure (module doc) as a PNG at ``path``: (i), (ii) and the SfM points share one colour
    scale of inverse depth, (iii) has its own (its planes are never fitted to depth)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    H, W = planes.image.shape[-2:]
    box = (0, W, H, 0)  # pixel i covers [i, i + 1)
    seen = torch.isfinite(planes.sfm_depth)
    points = 1.0 / planes.sfm_depth[seen]
    fitted = [1.0 / p.depth[torch.isfinite(p.depth)] for p in planes.panels]
    shared = _limits(torch.cat([points, *fitted[:2]]))
    figure, axes = plt.subplots(2, 4, figsize=(11, 6.2), layout="constrained")
    axes[0, 0].imshow(planes.image.permute(1, 2, 0).numpy(), extent=box)
    axes[0, 0].set_title(planes.label, fontsize=8)
    axes[1, 0].imshow(0.4 * planes.image.permute(1, 2, 0).numpy() + 0.6, extent=box)
    rows, columns = seen.nonzero(as_tuple=True)
    axes[1, 0].scatter(columns + 0.5, rows + 0.5, c=points, s=3, cmap="viridis", vmin=shared[0], vmax=shared[1])
    axes[1, 0].set_title(f"SfM points the view sees ({len(points)})", fontsize=8)
    for index in range(3):
        shown = _column(axes[:, index + 1], planes, index, shared if index < 2 else _limits(fitted[2]))
        if index >= 1:
            cover = axes[1, :3].tolist() if index == 1 else axes[1, 3]
            label = "1 / z (context baseline = 1)" + ("" if index == 1 else ", own scale")
            figure.colorbar(shown, ax=cover, location="bottom", shrink=0.8, extend="both", label=label)
    for axis in axes.flat:
        axis.set_xticks([])
        axis.set_yticks([])
    axes[0, 1].set_ylabel("normal (n + 1) / 2", fontsize=8)
    axes[1, 1].set_ylabel("1 / z on the patch ray", fontsize=8)
    try:
        return save_figure(figure, path, dpi=120)
    finally:
        plt.close(figure)


def main(argv: list[str] | None = None) -> ViewPlanes:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__
    )
    parser.add_argument("--capture", required=True, help="the capture folder (scan24: it carries priors)")
    parser.add_argument("--learned", required=True, help="the learned-plane hrope-lift run folder")
    parser.add_argument("--out", required=True, help="the figure (PNG)")
    parser.add_argument("--scene", type=int, default=0, help="the test scene (index in the test split)")
    parser.add_argument("--view", type=int, default=0, help="its context view: 0 or 1")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    try:
        planes = view_planes(args.learned, args.capture, args.scene, args.view, args.device)
    except InputError as error:
        raise SystemExit(f"real_planes_figure.py: error: {error}") from None
    path = plot(planes, Path(args.out))
    counts = point_counts(planes)
    print(
        f"{planes.label}: {int(counts.sum())} SfM points, {int((counts >= planes.min_points).sum())} of "
        f"{counts.numel()} patches with at least {planes.min_points}"
    )
    print(f"figure: {path}")
    return planes


if __name__ == "__main__":
    main()
