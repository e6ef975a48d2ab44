"""Does the synthetic ordering of the planned rows hold on a real capture? A check on one stereo pair.

The Middlebury 2014 "Motorcycle" pair bundled with scikit-image (``pip install scikit-image``; read
from the installed package, nothing is downloaded) is cut into small posed scenes
(:mod:`hrope.nvs.data.real.stereo`): each scene is a 64x64 window at 1/8 of the full resolution,
two context views from the left image (at the window and 32 pixels to its right) and the target
from the right image at the window; the context views carry the ground-truth depth, the target
none. Training windows lie in the top 70% of the rows, test windows in the bottom 30%: no test
pixel is seen in training. Every row is trained with the same budget (``nvs_rows.py``) and seeds
on the same windows and scored on the same test windows; the report gives each row's PSNR, its
paired difference to ``prope (rays world)`` with the crossed-bootstrap 95% interval
(``intervals.crossed_bootstrap``), and whether the ordering seen on the synthetic scenes (urope
best, then hrope-lift with context depth, then prope with the same planes added to the tokens,
then prope with world rays, then prope) holds here. Two more rows are reported beside them: urope
anchored at each token's depth and hrope-lift-uv with the same depth (planned comparison P8).

No ``data.kind`` reads stereo windows: :class:`StereoCellRunner` supplies them to training and
evaluation itself. A cell's run config (its ``config.yaml``) describes them as far as the schema can:
``data.kind: folder`` at the folder the pair is read from (scikit-image's data folder, no scene
folder any loader reads, so ``hrope train`` or ``hrope eval`` on it fail rather than use other
data), ``data.depth: maps`` (the context views carry depth maps) and ``data.note`` saying that the
runner supplies the windows and how they are cut. The cells' cache keys keep the dataset name
``motorcycle`` and the cut (:data:`STEREO`).

    python -m experiments.real_stereo_check --threads 1               # full budget, seeds 0 1 2
    python -m experiments.real_stereo_check --steps 100 --seeds 0     # smoke run
    python -m experiments.real_stereo_check --steps 200 --allow-stale # reuse cells of earlier code (marked)
"""

from __future__ import annotations

import argparse
import shlex
import sys
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path


from .intervals import METHOD, crossed_bootstrap, interval_text
from .cells import CellRunner, StaleCellsError, StoppedCellError, trained_at
from .rows import BUDGETS, Budget, Cell, Row, cell_settings, config_hash
from .store import CELLS_NAME
from .plane_evidence import PLANNED_ROWS, row_report
from hrope.nvs.running.provenance import describe
from hrope.nvs.config import RunConfig
from hrope.nvs.running.atomic import write_json, write_text
from hrope.nvs.data.real.stereo import StereoScenes, motorcycle_from_skimage, stereo_windows

__all__ = ["ROWS", "REFERENCE", "SYNTHETIC_ORDER", "STEREO", "StereoCellRunner", "ordering", "run", "main"]

# The first five planned rows, whose synthetic order (best first, docs/results.md) is checked, then
# the P8 pair: urope anchored at each token's depth and hrope-lift-uv with the same depth and rays.
_EXTRA = ("worldrope (external, targets transfer, footprint False)", "hrope-lift-uv (external, targets transfer)")
ROWS = PLANNED_ROWS[:5] + tuple(row for label in _EXTRA for row in PLANNED_ROWS if row.label == label)
SYNTHETIC_ORDER = (ROWS[4], ROWS[2], ROWS[3], ROWS[1], ROWS[0])
REFERENCE = ROWS[1]  # prope (rays world)
DATASET = "motorcycle"
# How the pair is cut (module doc); part of every cell's cache key.
STEREO = {
    "downscale": 2,  # of the bundled 1/4-resolution pair: 1/8 of full resolution, disparities 3.6-30 px
    "size": 64,  # the tiny preset's image size
    "shift": 32,  # the second context crop: with the first it covers the target's content for d <= 32
    "train_stride": 8,
    "test_stride": 8,
    "train_fraction": 0.7,  # rows above this fraction train, rows below test
}


def stereo_datasets(settings: dict) -> dict[str, StereoScenes]:
    """The ``train`` and ``eval`` (test) scenes of the Motorcycle pair cut by ``settings`` (:data:`STEREO`)."""
    pair = motorcycle_from_skimage().downscale(settings["downscale"])
    height = pair.image_size[0]
    split = round(settings["train_fraction"] * height)
    size, shift = settings["size"], settings["shift"]
    train = stereo_windows(pair, size, shift, settings["train_stride"], (0, split))
    test = stereo_windows(pair, size, shift, settings["test_stride"], (split, height))
    return {"train": StereoScenes(pair, train, size), "eval": StereoScenes(pair, test, size)}


class StereoCellRunner(CellRunner):
    """:class:`experiments.cells.CellRunner` on the stereo scenes: the same cells, caching and records;
    the stereo settings are part of each cell's key. Its cells' run configs describe the scenes in
    :meth:`data_section`; :meth:`dataset` supplies them."""

    def __init__(self, budget: Budget, cache: Path, datasets: dict[str, StereoScenes], settings: dict, **options):
        super().__init__(budget, cache, **options)
        self.stereo_scenes, self.settings = datasets, settings

    def key(self, cell: Cell) -> str:
        return config_hash(
            {**cell_settings(self.budget, cell, self.lpips_weights, self.split), "stereo": self.settings}
        )

    def data_section(self, cell: Cell) -> dict:
        """The run config's data section of ``cell`` (module doc): no loader reads it."""
        from skimage.data import data_dir

        return {
            **cell_settings(self.budget, cell, self.lpips_weights, self.split)["data"],
            "kind": "folder",
            "root": data_dir,
            "depth": "maps",
            "cache": False,
            "note": f"{DATASET}: stereo windows of the Middlebury 2014 Motorcycle pair in data.root "
            f"(skimage.data.stereo_motorcycle), cut {', '.join(f'{k} {v}' for k, v in self.settings.items())}, "
            "supplied by experiments.real_stereo_check (StereoCellRunner); no loader reads data.root",
        }

    def dataset(self, config: RunConfig, split: str) -> StereoScenes:
        return self.stereo_scenes[split]


def ordering(records: dict[Row, list[dict]]) -> dict:
    """Whether the rows keep :data:`SYNTHETIC_ORDER`: for each consecutive pair (better, worse) the
    paired difference ``better - worse`` with its interval; ``holds``: every mean difference > 0,
    ``significant``: every interval excludes zero."""
    pairs = []
    for better, worse in zip(SYNTHETIC_ORDER, SYNTHETIC_ORDER[1:]):
        if better not in records or worse not in records:
            continue
        a = {r["seed"]: r["per_scene"]["psnr"] for r in records[better]}
        b = {r["seed"]: r["per_scene"]["psnr"] for r in records[worse]}
        seeds = sorted(set(a) & set(b))
        diff = crossed_bootstrap([a[s] for s in seeds], [b[s] for s in seeds])
        pairs.append({"better": better.label, "worse": worse.label, **diff})
    observed = sorted(records, key=lambda row: -sum(r["metrics"]["psnr"] for r in records[row]) / len(records[row]))
    return {
        "pairs": pairs,
        "holds": bool(pairs) and all(p["mean"] > 0 for p in pairs),
        "significant": bool(pairs) and all(p["mean"] > 0 and p["excludes_zero"] for p in pairs),
        "observed_order": [row.label for row in observed],
    }


def verdict(order: dict) -> str:
    """The one-sentence answer of :func:`ordering`."""
    observed = " > ".join(f"`{label}`" for label in order["observed_order"])
    if order["significant"]:
        return f"The synthetic ordering holds on the real pair, every step outside noise (observed: {observed})."
    if order["holds"]:
        return f"The synthetic ordering holds in the means, but not every step is outside noise (observed: {observed})."
    flipped = [f"`{p['better']}` vs `{p['worse']}` ({p['mean']:+.2f} dB)" for p in order["pairs"] if p["mean"] <= 0]
    return (
        f"The synthetic ordering does not hold on the real pair: reversed {', '.join(flipped)} (observed: {observed})."
    )


def run(
    budget: Budget,
    seeds: list[int],
    out: Path,
    *,
    threads: int,
    command: str,
    allow_stale: bool = False,
    report_only: bool = False,
    log=print,
) -> dict:
    """Train (or read) every row's cells, write ``OUT/real_stereo.{json,md}`` and return the report;
    ``report_only``: read finished cells only (from the cache or ``OUT/cells.jsonl``), train nothing."""
    datasets = stereo_datasets(STEREO)
    budget = replace(budget, seeds=tuple(seeds), train_scenes=len(datasets["train"]), eval_scenes=len(datasets["eval"]))
    runner = StereoCellRunner(
        budget, out / "cache", datasets, STEREO, store=out / CELLS_NAME, threads=threads, allow_stale=allow_stale
    )
    cells = [Cell(DATASET, row, seed) for row in ROWS for seed in seeds]
    records: dict[Row, list[dict]] = {}
    for index, cell in enumerate(cells):
        if report_only:
            record = runner.cached(cell)
            if record is None:
                raise StoppedCellError(f"{cell.row.label} seed {cell.seed} has no finished cell to report")
        else:
            log(f"[{index + 1}/{len(cells)}] {cell.row.label} seed {cell.seed}")
            record = runner.run(cell)
        records.setdefault(cell.row, []).append(record)
    order = ordering(records)
    report = {
        "title": "Real-image check: the planned rows on the Middlebury 2014 Motorcycle stereo pair",
        "command": command,
        "reference": REFERENCE.label,
        "provenance": runner.provenance,
        "budget": budget.as_dict(),
        "stereo": STEREO,
        "train_windows": len(datasets["train"]),
        "test_windows": len(datasets["eval"]),
        "seeds": seeds,
        "train_seconds": {row.label: [r["train_seconds"] for r in records[row]] for row in ROWS},
        "generated": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "rows": [
            {
                "row": row.label,
                "trained_at": sorted({trained_at(r) for r in records[row] if runner.is_stale(r)}),
                **row_report(records[row], records[REFERENCE]),
            }
            for row in ROWS
        ],
        "ordering": order,
        "verdict": verdict(order),
    }
    out.mkdir(parents=True, exist_ok=True)
    runner.save()
    write_json(out / "real_stereo.json", report)
    write_text(out / "real_stereo.md", markdown(report))
    return report


def _delta(delta: dict | None) -> str:
    return "—" if delta is None else interval_text(delta)


def markdown(report: dict) -> str:
    budget, reference = report["budget"], report["reference"]
    lines = [
        f"## {report['title']}",
        "",
        f"Command: `{report['command']}`  ",
        f"Commit: `{describe(report['provenance'])}`; generated {report['generated']}.  ",
        f"Model {budget['model']}, {budget['steps']} steps of batch {budget['batch_size']} (lr {budget['lr']}, warmup "
        f"{budget['warmup']}); {report['train_windows']} training windows (top rows), {report['test_windows']} test "
        f"windows (bottom rows, overlapping); seeds {report['seeds']}; stereo cut {report['stereo']}.  ",
        f"Δ: mean paired PSNR difference to `{reference}` (same seed, same test window), with {METHOD}; **bold** where "
        "it excludes zero (the test windows overlap, so the interval is narrower than independent windows would give).",
        "",
        f"| row | PSNR ↑ | Δ vs {reference} [95% CI] | seeds |",
        "|---|---|---|---|",
    ]
    for row in report["rows"]:
        psnr = row["psnr"]
        spread = f" ± {psnr['std']:.2f}" if psnr["std"] is not None else ""
        delta = None if row["row"] == reference else row.get("vs_reference")
        label = row["row"] + (" ‡" if row.get("trained_at") else "")
        lines.append(f"| {label} | {psnr['mean']:.2f}{spread} | {_delta(delta)} | {len(row['seeds'])} |")
    earlier = sorted({c for row in report["rows"] for c in row.get("trained_at", [])})
    if earlier:
        lines += ["", f"‡ trained by an earlier code version ({', '.join(earlier)}; reused with `--allow-stale`)."]
    lines += ["", "Synthetic ordering, step by step (better − worse, same seeds and windows):", ""]
    lines += ["| better | worse | Δ [95% CI] |", "|---|---|---|"]
    lines += [f"| {p['better']} | {p['worse']} | {_delta(p)} |" for p in report["ordering"]["pairs"]]
    lines += ["", report["verdict"], ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__
    )
    parser.add_argument("--seeds", default="0,1,2", help="comma list of training seeds")
    parser.add_argument("--steps", type=int, default=None, help="training steps (default: the full budget's)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default="benchmarks/results/real_stereo")
    parser.add_argument("--allow-stale", action="store_true", help="reuse cells trained by other code (marked ‡)")
    parser.add_argument("--report-only", action="store_true", help="report the finished cells; train nothing")
    args = parser.parse_args(argv)
    budget = BUDGETS["full"]
    if args.steps is not None:
        budget = replace(budget, name="full-steps", steps=args.steps, warmup=min(budget.warmup, args.steps // 10))
    try:
        return run(
            budget,
            [int(s) for s in args.seeds.split(",")],
            Path(args.out),
            threads=args.threads,
            allow_stale=args.allow_stale,
            report_only=args.report_only,
            command=shlex.join(["python", "-m", "experiments.real_stereo_check", *argv]),
            log=lambda text: print(text, flush=True),
        )
    except (StaleCellsError, StoppedCellError) as error:
        raise SystemExit(f"real_stereo_check.py: error: {error}") from None


if __name__ == "__main__":
    main()
