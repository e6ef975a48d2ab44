"""Where do homographies matter? The gain of each row over a reference row against the angle between
the target and context views and against the surface slant, from trained plane_evidence cells.

Reads finished cells (``checkpoint.safetensors`` + ``metrics.json``) of a plane_evidence cache
(``--cache``; the cell folders of nvs_cells.CellRunner for ``--budget``), refusing missing ones, and
scores each model again on the held-out test scenes its report used (the same ``build_dataset``
call), keeping the squared error of every target pixel (clamped to [0, 1] as hrope.nvs.evaluation.metrics.psnr,
mean over colour channels). Two analysis-only quantities from the renderer's ground truth
(view_geometry.py) sort the error; the model never sees them (its batch has no normals):

- **view angle**: per target view, the angle between its viewing direction and the nearest
  context view's; binned at its quantiles over the test scenes (``--angle-bins``, so the bins
  hold about as many target views; the edges depend on the scenes only, so all rows and seeds
  share them). The nearest context camera's distance (unit context baseline) is reported per bin.
- **surface slant**: per target pixel, the angle between the surface normal and the ray back to
  the camera, binned 0-30, 30-60, 60-90 degrees; pixels that see no surface form a last bin
  ("no surface") so the bins partition every pixel.

Per row and bin: PSNR of the bin's pooled MSE (every pixel of the bin, over scenes and seeds, so the
pixel-weighted mean of the bins' MSE is the row's pooled MSE), and the paired gain over the reference
row (``--reference``, default ``prope (rays world)``): the mean over seeds and scenes of the
difference of per-scene binned PSNR (PSNR of a scene's MSE over its pixels in the bin), with the
crossed seed x scene bootstrap interval (intervals.crossed_bootstrap). Scenes lacking a bin: a
scene enters a bin's paired gain only when the bin holds at least ``--min-pixels`` of its target
pixels (a scene whose target lies in another angle bin holds none of that bin); bin membership
depends only on the scene, so the same scenes are dropped for every row and seed, and the number of
scenes kept is reported per bin. Each cell's recomputed mean per-image PSNR is compared with its
``metrics.json`` (the largest difference is reported: it checks the model and scenes are the ones
reported).

    python -m experiments.geometry_sweep --datasets room --seeds 0,1,2 --threads 1
    python -m experiments.geometry_sweep --cache /tmp/cache --budget quick --seeds 0 --out /tmp/sweep
"""

from __future__ import annotations

import argparse
import shlex
import sys
from dataclasses import replace
from datetime import datetime, timezone
from itertools import islice
from pathlib import Path

import torch


from hrope.nvs.running.atomic import write_json, write_text
from hrope.nvs.build_data import collate
from hrope.nvs.running.checkpoints import CHECKPOINT_NAME
from hrope.nvs.pretrained import load_trained
from .geometry_sweep_report import markdown, plot, summarise
from .cells import CellRunner, StaleCellsError
from .rows import BUDGETS, Budget, Cell, Row
from .plane_evidence import SETS
from .view_geometry import SLANT_EDGES, bin_index, nearest_context_angle, nearest_context_distance, surface_slant

__all__ = ["DEFAULT_ROWS", "DEFAULT_REFERENCE", "SweepError", "sweep_model", "run", "main"]

DEFAULT_REFERENCE = "prope (rays world)"
DEFAULT_ROWS = (
    "hrope-lift (external, targets transfer, rays world)",
    "prope (external, targets transfer, rays world, additive hrope-lift)",
    "urope",
    "worldrope (external, targets transfer, footprint False)",
)
SLANT_BINS = len(SLANT_EDGES)  # the slant bins and the "no surface" bin


class SweepError(RuntimeError):
    """Cells asked for are not finished in the cache (no ``metrics.json`` or no checkpoint), or their
    test scenes have no normals."""


def _batch_sweep(model, scenes: list, num_context: int, device: str) -> dict:
    """The per-scene sweep values (see :func:`sweep_model`) of one batch of scenes."""
    batch = collate(scenes, num_context, torch.device(device))
    with torch.no_grad():
        prediction = model(replace(batch, normals=None)).images.float().clamp(0, 1)
    target = batch.images[:, num_context:].float().clamp(0, 1)
    error = (prediction - target).square().mean(2).double()  # (B, Vt, H, W)
    if batch.normals is None:
        raise SweepError("the test scenes have no normals: the surface slant needs a synthetic dataset")
    targets = batch.cameras.select_views(slice(num_context, None))
    slant = surface_slant(batch.normals[:, num_context:], targets.K)
    bins = bin_index(slant, SLANT_EDGES).flatten(1)  # (B, Vt * H * W)
    slant_se = torch.zeros(len(scenes), SLANT_BINS, dtype=torch.float64).scatter_add_(1, bins, error.flatten(1))
    slant_pixels = torch.zeros(len(scenes), SLANT_BINS, dtype=torch.int64).scatter_add_(1, bins, torch.ones_like(bins))
    mse = error.mean((2, 3))  # (B, Vt)
    return {
        "angle": nearest_context_angle(batch.cameras, num_context).tolist(),
        "distance": nearest_context_distance(batch.cameras, num_context).tolist(),
        "target_se": error.sum((2, 3)).tolist(),
        "slant_se": slant_se.tolist(),
        "slant_pixels": slant_pixels.tolist(),
        "psnr": (-10.0 * torch.log10(mse)).mean(1).tolist(),
    }


def sweep_model(model, dataset, num_context: int, *, batch_size: int = 8, device: str = "cpu") -> dict:
    """Score ``model`` on every scene of ``dataset``, keeping per scene: ``angle`` and ``distance``
    (per target view, degrees and scene units, :mod:`view_geometry`), ``target_se`` (per target
    view, the sum of its pixels' squared errors), ``slant_se`` / ``slant_pixels`` (per slant bin,
    :data:`view_geometry.SLANT_EDGES` then "no surface": squared-error sum and pixel count over the
    scene's target views) and ``psnr`` (the mean per-image PSNR, as hrope.nvs.evaluation.evaluate reports it);
    plus ``pixels`` (pixels of one image)."""
    model.eval()
    out: dict = {"angle": [], "distance": [], "target_se": [], "slant_se": [], "slant_pixels": [], "psnr": []}
    scenes = (dataset[i] for i in range(len(dataset)))
    while chunk := list(islice(scenes, batch_size)):
        for key, values in _batch_sweep(model, chunk, num_context, device).items():
            out[key] += values
    first = dataset[0].images
    out["pixels"] = first.shape[-2] * first.shape[-1]
    return out


def check_cells(runner: CellRunner, cells: list[Cell], *, log=print) -> list[dict]:
    """The records of ``cells``; :class:`SweepError` (one line) when some are not finished,
    :class:`nvs_cells.StaleCellsError` for cells of other code unless the runner allows them."""
    missing = [
        runner.cell_id(cell)
        for cell in cells
        if runner.cached(cell) is None or not (runner.folder(cell) / CHECKPOINT_NAME).is_file()
    ]
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise SweepError(
            f"{len(missing)} of {len(cells)} cells are not finished under {runner.cache} (no metrics.json or "
            f"checkpoint): {', '.join(missing[:3])}{more}; train them with experiments/plane_evidence.py first"
        )
    runner.check_stale(cells, log=log)
    return [runner.cached(cell) for cell in cells]


def _sweep_cell(runner: CellRunner, cell: Cell, record: dict, device: str) -> dict:
    """:func:`sweep_model` of one finished cell on its test scenes, with its recorded PSNR."""
    model, config = load_trained(runner.folder(cell), device)
    dataset = runner.dataset(config, "eval")
    sweep = sweep_model(model, dataset, config.data.num_context, batch_size=config.eval.batch_size, device=device)
    recomputed = sum(sweep["psnr"]) / len(sweep["psnr"])
    sweep["psnr_difference"] = abs(recomputed - record["metrics"]["psnr"])
    sweep["stale"] = runner.is_stale(record)
    return sweep


def run(
    budget: Budget,
    cache: Path,
    datasets: list[str],
    rows: list[Row],
    reference: Row,
    out: Path,
    *,
    angle_bins: int = 4,
    min_pixels: int = 16,
    device: str = "cpu",
    allow_stale: bool = False,
    command: str = "",
    figure: Path | None = None,
    log=print,
) -> dict:
    """Sweep every (dataset, row, seed) cell of ``budget.seeds`` and write ``OUT/geometry_sweep.{json,md}`` and
    the figure ``figure`` (default ``OUT/geometry_sweep.png``)."""
    runner = CellRunner(budget, cache, device=device, allow_stale=allow_stale)
    rows = [reference] + [r for r in rows if r != reference]
    cells = [Cell(d, row, s) for d in datasets for row in rows for s in budget.seeds]
    records = check_cells(runner, cells, log=log)
    sweeps: dict[str, dict[str, dict[int, dict]]] = {}
    for index, (cell, record) in enumerate(zip(cells, records)):
        log(f"[{index + 1}/{len(cells)}] {cell.dataset} {cell.row.label} seed {cell.seed}")
        sweeps.setdefault(cell.dataset, {}).setdefault(cell.row.label, {})[cell.seed] = _sweep_cell(
            runner, cell, record, device
        )
    report = {
        "title": "Where do homographies matter? Gain vs view angle and surface slant",
        "command": command,
        "reference": reference.label,
        "provenance": runner.provenance,
        "budget": budget.as_dict(),
        "seeds": list(budget.seeds),
        "angle_bins": angle_bins,
        "min_pixels": min_pixels,
        "generated": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "datasets": {
            dataset: summarise(by_row, reference.label, angle_bins=angle_bins, min_pixels=min_pixels)
            for dataset, by_row in sweeps.items()
        },
    }
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "geometry_sweep.json", report)
    write_text(out / "geometry_sweep.md", markdown(report))
    plot(report, figure or out / "geometry_sweep.png")
    return report


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__
    )
    parser.add_argument("--cache", default="benchmarks/results/plane_evidence/cache", help="plane_evidence cell cache")
    parser.add_argument("--budget", choices=sorted(BUDGETS), default="full", help="the budget the cells trained at")
    parser.add_argument("--datasets", default="room", help="comma list of room, object")
    parser.add_argument("--seeds", default="0,1,2", help="comma list of training seeds")
    parser.add_argument(
        "--rows",
        nargs="+",
        default=list(DEFAULT_ROWS),
        help="row labels of experiments/plane_evidence.py, each one argument",
    )
    parser.add_argument("--reference", default=DEFAULT_REFERENCE, help="the row every other row is paired with")
    parser.add_argument("--angle-bins", type=int, default=4, help="quantile bins of the view angle")
    parser.add_argument(
        "--min-pixels", type=int, default=16, help="target pixels a scene needs in a bin to enter its paired gain"
    )
    parser.add_argument("--out", default="benchmarks/results/geometry_sweep")
    parser.add_argument("--figure", default="docs/images/geometry_sweep.png", help="the figure (docs/results.md's)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--allow-stale", action="store_true", help="sweep cells trained by other code (noted)")
    return parser


def _rows(parser: argparse.ArgumentParser, labels: list[str]) -> list[Row]:
    known = {row.label: row for rows in SETS.values() for row in rows}
    unknown = [label for label in labels if label not in known]
    if unknown:
        parser.error(f"unknown rows {unknown}; rows: {', '.join(known)}")
    return [known[label] for label in labels]


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    parser = _parser()
    args = parser.parse_args(argv)
    rows, (reference,) = _rows(parser, args.rows), _rows(parser, [args.reference])
    if args.angle_bins < 1 or args.min_pixels < 1:
        parser.error("--angle-bins and --min-pixels must be >= 1")
    torch.set_num_threads(args.threads)
    budget = replace(BUDGETS[args.budget], seeds=tuple(int(s) for s in args.seeds.split(",")))
    try:
        return run(
            budget,
            Path(args.cache),
            [d.strip() for d in args.datasets.split(",")],
            rows,
            reference,
            Path(args.out),
            angle_bins=args.angle_bins,
            min_pixels=args.min_pixels,
            device=args.device,
            allow_stale=args.allow_stale,
            command=shlex.join(["python", "-m", "experiments.geometry_sweep", *argv]),
            figure=Path(args.figure),
            log=lambda text: print(text, flush=True),
        )
    except (SweepError, StaleCellsError) as error:
        raise SystemExit(f"geometry_sweep.py: error: {error}") from None


if __name__ == "__main__":
    main()
