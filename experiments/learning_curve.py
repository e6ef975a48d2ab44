"""Does a gap open with training? Held-out PSNR over long runs for ``prope`` and HRoPE variants.

Each row trains for ``--steps`` (default 3000, five times the ``full`` budget) per seed with the
``full`` budget's data, model, optimiser and learning-rate schedule (cosine over all steps), and is
evaluated on the same held-out scenes every ``--every`` steps (training stops at each point,
checkpoints, evaluates, and resumes exactly). At every point each row's PSNR is paired with the
first row's (same seed, same scene) and given the crossed-bootstrap 95% interval
(intervals.crossed_bootstrap). A finished run's curve (per-scene PSNR at every point, with the
commit that trained it) is kept in ``OUT/runs/seed<s>/<row>/curve.json`` (git-ignored, with the
run's checkpoints and logs) and in the report ``OUT/learning_curve.json`` (committed), and reused
from either, so (row, seed) runs can be split over separate processes, a last call writes the
report, and the report's command rebuilds it from the committed JSON alone. Writes
``OUT/learning_curve.{json,md,png}``.

    python -m experiments.learning_curve                                   # room, seeds 0 1 2, 3000 steps
    python -m experiments.learning_curve --set world                       # with world-frame rays
    python -m experiments.learning_curve --set world --seeds 1 --rows "prope" --no-report  # one part, alone
    python -m experiments.learning_curve --steps 600 --every 200 --seeds 0 # a quick look
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from dataclasses import replace
from pathlib import Path


from hrope.nvs.config import update_config
from hrope.nvs.running.atomic import save_figure, write_json, write_text
from hrope.nvs.build_data import build_dataset
from hrope.nvs.evaluation.evaluate import evaluate_model
from hrope.nvs.evaluation.plane_accuracy import PlaneAccuracy, measures_planes
from hrope.nvs.running.train import train
from .intervals import METHOD, crossed_bootstrap, interval_text
from .report import stat
from .rows import BUDGETS, Cell, Row, cell_config
from hrope.nvs.running.provenance import describe, provenance

__all__ = ["SETS", "run", "summarise", "main"]

REPORT_NAME = "learning_curve.json"

TRANSFER = (("targets", "transfer"),)
WORLD = (("rays", "world"),)
# later rows that the rows below them are also paired with (beside the first row)
EXTRA_REFERENCES = {"world": ("prope (rays world)",)}
SETS = {
    # camera-frame rays (model.rays auto): prope, the learned planes transferred to the targets, the fair oracle
    "camera": (Row("prope"), Row("hrope-lift", options=TRANSFER), Row("hrope-lift", "oracle", options=TRANSFER)),
    # world-frame rays in the tokens (docs/results.md): the best learned HRoPE and the fair oracle with them
    "world": (
        Row("prope"),
        Row("prope", model_options=WORLD),
        Row("hrope-lift", options=TRANSFER, model_options=WORLD),
        Row("hrope-lift", "oracle", options=TRANSFER, model_options=WORLD),
        # context depth, planes next to the camera capped (the best fair row at the full budget)
        Row("hrope-lift", "external", options=TRANSFER + (("max_inverse_distance", 2.0),), model_options=WORLD),
        # the fair oracle with the same cap (the default since RESULTS_VERSION 1)
        Row("hrope-lift", "oracle", options=TRANSFER + (("max_inverse_distance", 2.0),), model_options=WORLD),
    ),
}


def train_curve(
    steps: int, every: int, dataset_kind: str, seed: int, row: Row, folder: Path, datasets: dict, log=print
) -> dict:
    """Train one (row, seed) run to ``steps``, evaluating every ``every`` steps; its curve dict."""
    budget = replace(BUDGETS["full"], steps=steps, seeds=(seed,))
    config = update_config(
        cell_config(budget, Cell(dataset_kind, row, seed), folder), {"train": {"checkpoint_every": every}}
    )
    for split in ("train", "eval"):
        if split not in datasets:
            datasets[split] = build_dataset(config, split)
    points = []
    for stop in range(every, steps + 1, every):
        log(f"{row.label}, seed {seed}: training to step {stop} of {steps}")
        model = train(config, stop_at=stop, progress=False, dataset=datasets["train"]).model.eval()
        planes = PlaneAccuracy() if measures_planes(model) else None
        means, per_scene, _ = evaluate_model(
            model,
            datasets["eval"],
            config.data.num_context,
            batch_size=config.eval.batch_size,
            planes=planes,
        )
        point = {"step": stop, "psnr": means["psnr"], "ssim": means["ssim"], "per_scene_psnr": per_scene["psnr"]}
        if planes is not None:
            point["planes"] = planes.means()
        points.append(point)
    return {"row": row.label, "seed": seed, "provenance": provenance(), "budget": budget.as_dict(), "points": points}


def run(
    steps: int,
    every: int,
    dataset_kind: str,
    seeds: list[int],
    rows,
    out: Path,
    log=print,
    summarise_rows: bool = True,
    references: tuple[str, ...] = (),
) -> dict:
    """Every (row, seed) curve, trained or reused (from ``OUT/runs``, else from the report
    ``OUT/learning_curve.json``), and (``summarise_rows``) their summary against the first row."""
    datasets: dict[str, object] = {}
    report = out / REPORT_NAME
    kept = {(c["row"], c.get("seed")): c for c in json.loads(report.read_text())["curves"]} if report.is_file() else {}
    curves = []
    for seed in seeds:
        for row in rows:
            finished = out / "runs" / f"seed{seed}" / row.key / "curve.json"
            if finished.is_file():
                curve = json.loads(finished.read_text())
            elif (row.label, seed) in kept:
                curve, finished = kept[(row.label, seed)], report
            else:
                curve = train_curve(steps, every, dataset_kind, seed, row, finished.parent, datasets, log)
                write_json(finished, curve)
            if [p["step"] for p in curve["points"]] != list(range(every, steps + 1, every)):
                raise SystemExit(f"learning_curve.py: error: {finished} has other evaluation steps; use another --out")
            curves.append(curve)
    return {
        "command": "",
        "dataset": dataset_kind,
        "seeds": seeds,
        "steps": steps,
        "every": every,
        "rows": [row.label for row in rows],
        "curves": curves,
        "summary": summarise(curves, [r.label for r in rows], references) if summarise_rows else None,
    }


def summarise(curves: list[dict], labels: list[str], references: tuple[str, ...] = ()) -> list[dict]:
    """Per row and evaluation step: PSNR mean/std over seeds and the paired difference to the first
    row (``vs_reference``) and to each later row named in ``references`` (``vs[label]``)."""
    by_row = {label: sorted((c for c in curves if c["row"] == label), key=lambda c: c["seed"]) for label in labels}

    def paired(label: str, reference: str, index: int) -> dict:
        return crossed_bootstrap(
            [c["points"][index]["per_scene_psnr"] for c in by_row[label]],
            [c["points"][index]["per_scene_psnr"] for c in by_row[reference]],
        )

    others = [r for r in references if r in by_row and r != labels[0]]
    summary = []
    for label in labels:
        points = []
        for index, point in enumerate(by_row[label][0]["points"]):
            entry = {"step": point["step"], "psnr": stat([c["points"][index]["psnr"] for c in by_row[label]])}
            if label != labels[0]:
                entry["vs_reference"] = paired(label, labels[0], index)
            later = [r for r in others if labels.index(r) < labels.index(label)]
            if later:
                entry["vs"] = {r: paired(label, r, index) for r in later}
            planes = [c["points"][index]["planes"] for c in by_row[label] if c["points"][index].get("planes")]
            if planes:
                entry["planes"] = {
                    group: {
                        metric: stat([p[group][metric] for p in planes])["mean"]
                        for metric in ("normal_error_deg", "depth_rel_error")
                    }
                    for group in ("context", "target")
                }
            points.append(entry)
        summary.append({"row": label, "points": points})
    return summary


def _step_header(steps: list[int], first: str = "| row | ", rule: str = "|---|") -> list[str]:
    return [first + " | ".join(f"step {s}" for s in steps) + " |", rule + "---|" * len(steps)]


def _main_table(report: dict, steps: list[int]) -> list[str]:
    """The heading and the PSNR table (mean ± std over seeds, the paired difference to the first row)."""
    summary = report["summary"]
    commits = sorted({describe(c["provenance"]) for c in report["curves"]})
    seeds = ", ".join(str(s) for s in report["seeds"])
    lines = [
        "## Learning curves: held-out PSNR over training",
        "",
        f"Command: `{report['command']}`  ",
        f"Trained at: {', '.join(f'`{c}`' for c in commits)}  ",
        f"`{report['dataset']}`, seeds {seeds}, {report['steps']} steps (the `full` budget's model, data and "
        "optimiser; cosine schedule over all steps), 64 held-out scenes. PSNR mean ± std over seeds; below it "
        f"the paired difference to `{summary[0]['row']}` with {METHOD} "
        "(bold where it excludes zero).",
        "",
        *_step_header(steps),
    ]
    for row in summary:
        cells = []
        for point in row["points"]:
            psnr = point["psnr"]
            text = f"{psnr['mean']:.2f}" + (f" ± {psnr['std']:.2f}" if psnr["std"] is not None else "")
            if "vs_reference" in point:
                text += "<br>" + interval_text(point["vs_reference"])
            cells.append(text)
        lines.append(f"| {row['row']} | " + " | ".join(cells) + " |")
    return lines


def _reference_tables(summary: list[dict], steps: list[int]) -> list[str]:
    """One table of paired differences per later reference row (``vs``)."""
    lines = []
    for reference in sorted({r for row in summary for p in row["points"] for r in p.get("vs", {})}):
        lines += [
            "",
            f"Paired difference to `{reference}` (same seeds and scenes, 95% interval):",
            "",
            *_step_header(steps),
        ]
        for row in summary:
            if reference in row["points"][0].get("vs", {}):
                lines.append(
                    f"| {row['row']} | " + " | ".join(interval_text(p["vs"][reference]) for p in row["points"]) + " |"
                )
    return lines


def _plane_table(summary: list[dict], steps: list[int]) -> list[str]:
    """The learned plane errors per row, view group and step (none when no row learns planes)."""
    planes = [row for row in summary if "planes" in row["points"][-1]]
    if not planes:
        return []
    lines = [
        "",
        "Learned plane errors (last layer, mean over seeds; neutral: 90° and 1.0), per step:",
        "",
        *_step_header(steps, "| row | views | ", "|---|---|"),
    ]
    for row in planes:
        for group in ("context", "target"):
            values = [
                f"{p['planes'][group]['normal_error_deg']:.1f}° / {p['planes'][group]['depth_rel_error']:.3f}"
                for p in row["points"]
            ]
            lines.append(f"| {row['row']} | {group} | " + " | ".join(values) + " |")
    return lines


def _plot(summary: list[dict], steps: list[int], path: Path) -> None:
    """Held-out PSNR (mean over seeds) against the training step, one line per row."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6, 4))
    for row in summary:
        axis.plot(steps, [p["psnr"]["mean"] for p in row["points"]], marker="o", label=row["row"])
    axis.set_xlabel("training step")
    axis.set_ylabel("held-out PSNR (dB), mean over seeds")
    axis.legend(fontsize=7)
    figure.tight_layout()
    save_figure(figure, path, dpi=120)
    plt.close(figure)


def write(report: dict, out: Path) -> None:
    """``OUT/learning_curve.json`` (the report), ``.png`` (the curves) and ``.md`` (the tables)."""
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / REPORT_NAME, report)
    summary = report["summary"]
    steps = [p["step"] for p in summary[0]["points"]]
    _plot(summary, steps, out / "learning_curve.png")
    lines = _main_table(report, steps) + _reference_tables(summary, steps) + _plane_table(summary, steps)
    write_text(out / "learning_curve.md", "\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__
    )
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--every", type=int, default=500)
    parser.add_argument("--dataset", default="room")
    parser.add_argument("--seeds", default="0,1,2", help="comma list of training seeds")
    parser.add_argument("--set", choices=sorted(SETS), default="camera")
    parser.add_argument(
        "--rows",
        nargs="+",
        default=None,
        help="row labels, each one argument (default: the set's rows; its first row is always kept as the reference)",
    )
    parser.add_argument("--out", default=None, help="default benchmarks/results/learning_curve_<set>")
    parser.add_argument(
        "--no-report",
        action="store_true",
        help="only train the given rows and seeds (the reference too only if listed); a later call "
        "without it writes the report",
    )
    args = parser.parse_args(argv)
    if args.steps % args.every:
        parser.error("--steps must be a multiple of --every")
    choices = SETS[args.set]
    unknown = sorted(set(args.rows or ()) - {r.label for r in choices})
    if unknown:
        parser.error(f"unknown rows {unknown}; rows: {', '.join(r.label for r in choices)}")
    keep_reference = not args.no_report
    rows = [
        r for i, r in enumerate(choices) if (i == 0 and keep_reference) or args.rows is None or r.label in args.rows
    ]
    out = Path(args.out or f"benchmarks/results/learning_curve_{args.set}")
    report = run(
        args.steps,
        args.every,
        args.dataset,
        [int(s) for s in args.seeds.split(",")],
        rows,
        out,
        log=lambda text: print(text, flush=True),
        summarise_rows=keep_reference,
        references=EXTRA_REFERENCES.get(args.set, ()),
    )
    if args.no_report:
        return report
    report["command"] = shlex.join(["python", "-m", "experiments.learning_curve", *argv])
    write(report, out)
    return report


if __name__ == "__main__":
    main()
