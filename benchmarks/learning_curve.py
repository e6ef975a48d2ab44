"""Does a gap open with training? Held-out PSNR over a long run for ``prope`` and HRoPE variants.

Each row trains once for ``--steps`` (default 3000, five times the ``full`` budget) with the
``full`` budget's data, model, optimiser and learning-rate schedule (cosine over all steps), and is
evaluated on the same held-out scenes every ``--every`` steps (training stops at each point,
checkpoints, evaluates, and resumes exactly). A finished row's curve is kept in
``OUT/runs/<row>/curve.json`` and reused (rows can run in separate processes). Writes
``OUT/learning_curve.{json,md,png}``.

    python benchmarks/learning_curve.py                          # room, seed 0, 3000 steps
    python benchmarks/learning_curve.py --steps 600 --every 200  # a quick look
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling nvs_* modules

from hrope.nvs.datasets import build_dataset  # noqa: E402
from hrope.nvs.evaluate import evaluate_model  # noqa: E402
from hrope.nvs.plane_accuracy import PlaneAccuracy, measures_planes  # noqa: E402
from hrope.nvs.train import train  # noqa: E402
from nvs_rows import BUDGETS, Cell, Row, cell_config  # noqa: E402
from provenance import describe, provenance  # noqa: E402

__all__ = ["ROWS", "run", "main"]

ROWS = (
    Row("prope"),
    Row("hrope-lift", options=(("targets", "transfer"),)),  # the best learned HRoPE (docs/results.md)
    Row("hrope-lift", "oracle", options=(("targets", "transfer"),)),  # the fair (context-only) oracle
)


def run(steps: int, every: int, dataset_kind: str, seed: int, rows, out: Path, log=print) -> dict:
    budget = replace(BUDGETS["full"], steps=steps, seeds=(seed,))
    curves = []
    datasets: dict[str, object] = {}
    for row in rows:
        folder = out / "runs" / row.key
        finished = folder / "curve.json"
        if finished.is_file():
            curves.append(json.loads(finished.read_text()))
            continue
        config = cell_config(budget, Cell(dataset_kind, row, seed), folder)
        config["train"]["checkpoint_every"] = every
        for split in ("train", "eval"):
            if split not in datasets:
                datasets[split] = build_dataset(config, split)
        points = []
        for stop in range(every, steps + 1, every):
            log(f"{row.label}: training to step {stop} of {steps}")
            model = train(config, stop_at=stop, progress=False, dataset=datasets["train"]).model.eval()
            planes = PlaneAccuracy() if measures_planes(model) else None
            means, _, _ = evaluate_model(model, datasets["eval"], config["data"]["num_context"],
                                         batch_size=config["eval"]["batch_size"], planes=planes)
            point = {"step": stop, "psnr": means["psnr"], "ssim": means["ssim"]}
            if planes is not None:
                point["planes"] = planes.means()
            points.append(point)
            model.train()
        curves.append({"row": row.label, "points": points})
        finished.write_text(json.dumps(curves[-1], indent=2))
    report = {"command": "", "provenance": provenance(), "dataset": dataset_kind, "seed": seed, "steps": steps,
              "every": every, "budget": budget.as_dict(), "curves": curves}
    return report


def write(report: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    (out / "learning_curve.json").write_text(json.dumps(report, indent=2))
    steps = [p["step"] for p in report["curves"][0]["points"]]
    lines = ["## Learning curves: held-out PSNR over training", "",
             f"Command: `{report['command']}`  ", f"Commit: `{describe(report['provenance'])}`  ",
             f"`{report['dataset']}`, seed {report['seed']}, {report['steps']} steps (the `full` budget's model, data and "
             "optimiser; cosine schedule over all steps), 64 held-out scenes.", "",
             "| row | " + " | ".join(f"step {s}" for s in steps) + " |", "|---|" + "---|" * len(steps)]
    figure, axis = plt.subplots(figsize=(6, 4))
    for curve in report["curves"]:
        psnr = [p["psnr"] for p in curve["points"]]
        lines.append(f"| {curve['row']} | " + " | ".join(f"{v:.2f}" for v in psnr) + " |")
        axis.plot(steps, psnr, marker="o", label=curve["row"])
    axis.set_xlabel("training step")
    axis.set_ylabel("held-out PSNR (dB)")
    axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(out / "learning_curve.png", dpi=120)
    plt.close(figure)
    (out / "learning_curve.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--every", type=int, default=500)
    parser.add_argument("--dataset", default="room")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rows", nargs="+", default=None, help="row labels (default: all)")
    parser.add_argument("--out", default="benchmarks/results/learning_curve")
    args = parser.parse_args(argv)
    if args.steps % args.every:
        parser.error("--steps must be a multiple of --every")
    rows = [r for r in ROWS if args.rows is None or r.label in args.rows]
    report = run(args.steps, args.every, args.dataset, args.seed, rows, Path(args.out),
                 log=lambda text: print(text, flush=True))
    report["command"] = shlex.join(["python", "benchmarks/learning_curve.py", *argv])
    write(report, Path(args.out))
    return report


if __name__ == "__main__":
    main()
