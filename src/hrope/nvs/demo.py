"""``python -m hrope.nvs.demo`` (``make demo``): the whole pipeline on CPU in minutes.

Trains five ``tiny`` LVSM models on synthetic room scenes for the same steps and batches, the
rows the 3-seed evidence in docs/results.md supports: ``none`` (LVSM baseline), ``prope``,
``prope`` with world-frame rays in the tokens (what most of HRoPE's measured gain turned out to
be), and ``hrope-lift`` with the same rays and planes from the context views only, carried into
the target camera — learned, or fitted to the context views' depth (what a model with a depth
estimator has at test time). No row sees the target view's geometry. Each is evaluated on
held-out scenes; ``runs/demo`` gets ``results.md`` / ``results.json`` (PSNR, SSIM, LPIPS
unavailable without local weights, the learned planes' accuracy against the neutral planes, and a
one-sentence reading), ``comparison.png`` (per scene: context views | ground truth | each model's
prediction) and ``normals.png`` (the learned plane normals next to the ground truth). Re-running
resumes or reuses finished runs. Single-threaded torch per run (fast and predictable on a shared
2-core box).
"""

from __future__ import annotations

import argparse
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from .atomic import write_json, write_text
from .build_data import build_dataset, collate
from .config import resolve
from .evaluate import evaluate_model, markdown_table, planes_table
from .plane_accuracy import PlaneAccuracy, measures_planes
from .train import train
from .viz import plane_normal_rows, save_image_grid

__all__ = ["DemoModel", "DEMO_MODELS", "demo_config", "reading", "main"]


@dataclass(frozen=True)
class DemoModel:
    """One demo row: its label, encoding, parameter source, ``predictor_options`` and ``model.rays``."""

    name: str
    encoding: str
    predictor: str = "learned"
    options: dict = field(default_factory=dict)
    rays: str = "auto"


DEMO_MODELS = (
    DemoModel("none", "none"),
    DemoModel("prope", "prope"),
    DemoModel("prope (world rays)", "prope", rays="world"),
    DemoModel(
        "hrope-lift (learned planes, transferred, world rays)",
        "hrope-lift",
        options={"targets": "transfer"},
        rays="world",
    ),
    DemoModel(
        "hrope-lift (context depth, transferred, world rays)",
        "hrope-lift",
        "external",
        {"use_normals": False, "targets": "transfer"},
        rays="world",
    ),
)
REFERENCE = "prope"
SAME_RAYS = "prope (world rays)"  # what the world-rays rows' planes add to
TRAIN_SCENES, EVAL_SCENES, BATCH_SIZE = 256, 32, 4


def demo_config(row: DemoModel, out: Path, steps: int) -> dict:
    """The resolved config of one demo run."""
    return resolve(
        {
            "model": {
                "preset": "tiny",
                "encoding": row.encoding,
                "predictor": row.predictor,
                "predictor_options": dict(row.options),
                "rays": row.rays,
            },
            "data": {"kind": "room", "num_scenes": TRAIN_SCENES, "num_context": 2, "num_target": 1},
            "train": {
                "out": str(out),
                "steps": steps,
                "batch_size": BATCH_SIZE,
                "lr": 1e-3,
                "warmup": 50,
                "checkpoint_every": max(1, steps // 4),
                "image_every": max(1, steps // 4),
                "threads": 1,
            },
            "eval": {"num_scenes": EVAL_SCENES, "num_grid_scenes": 4},
        }
    )


def reading(results: list[dict]) -> str:
    """The demo table in one sentence: the best row against ``prope`` (and, for a world-rays
    HRoPE row, against ``prope`` with the same rays), and what one seed can say."""
    psnr = {r["name"]: r["metrics"]["psnr"] for r in results}
    best = max(results, key=lambda r: r["metrics"]["psnr"])["name"]
    if best == REFERENCE:
        lead = f"`{REFERENCE}` scores highest"
    else:
        lead = f"`{best}` scores highest, {psnr[best] - psnr[REFERENCE]:+.2f} dB over `{REFERENCE}`"
        if "world rays" in best and best != SAME_RAYS and SAME_RAYS in psnr:
            lead += f" and {psnr[best] - psnr[SAME_RAYS]:+.2f} dB over `{SAME_RAYS}` (the same rays without planes)"
    return (
        f"{lead}; this is one seed at a tiny budget, where differences of a few tenths of a dB are within "
        "run-to-run spread, so see docs/results.md (3 seeds, paired confidence intervals) before reading a "
        "ranking into it."
    )


def _train_and_score(row: DemoModel, index: int, out: Path, steps: int, scenes: tuple, start: float) -> tuple:
    """Train demo row ``index`` (into ``out/<row name>``) on ``scenes = (train, eval)`` and score it on
    the held-out ones: ``(result, grid rows, model, device)``, ``result`` its entry of ``results.json``;
    ``start``: when the demo started (for the progress lines)."""
    train_scenes, eval_scenes = scenes
    folder = row.name.replace(" ", "_").replace("(", "").replace(")", "").replace(",", "")
    print(
        f"[{index + 1}/{len(DEMO_MODELS)}] {row.name}: training {steps} steps "
        f"(elapsed {time.perf_counter() - start:.0f} s)",
        flush=True,
    )
    config = demo_config(row, out / folder, steps)
    model = train(config, dataset=train_scenes).model.eval()
    device = next(model.parameters()).device  # train.device "auto" picks CUDA when available
    print(
        f"[{index + 1}/{len(DEMO_MODELS)}] {row.name}: evaluating on {config['eval']['num_scenes']} held-out scenes",
        flush=True,
    )
    planes = PlaneAccuracy() if measures_planes(model) else None
    metrics, _, rows = evaluate_model(
        model,
        eval_scenes,
        config["data"]["num_context"],
        device=device,
        num_grid_scenes=config["eval"]["num_grid_scenes"],
        planes=planes,
    )
    result = {"name": row.name, "metrics": metrics}
    if planes is not None:
        result["planes"] = planes.means()
    print(f"    PSNR {metrics['psnr']:.2f}  SSIM {metrics['ssim']:.3f}", flush=True)
    return result, rows, model, device


def _report(steps: int, elapsed: float, device, results: list[dict], normals_of: str | None) -> str:
    """The text of ``results.md``: the setup, the table and its reading, the plane accuracy of the
    rows that predict planes and the figures' legend (``normals_of``: the row in ``normals.png``)."""
    columns = " | ".join(["context views", "ground truth", *(r["name"] for r in results)])
    accuracy = "".join(
        f"\nPlane accuracy of `{r['name']}` (held-out scenes, last layer; neutral = the planes at zero "
        f"head output):\n\n{planes_table(r['planes'])}"
        for r in results
        if r.get("planes")
    )
    return (
        "# Demo results\n\n"
        f"Command: `make demo` (`python -m hrope.nvs.demo --steps {steps}`). Tiny LVSM (64x64, patch 8, d 128, "
        f"4 layers), {steps} steps of batch {BATCH_SIZE} on {TRAIN_SCENES} synthetic room scenes (2 context + "
        f"1 target views), evaluated on {EVAL_SCENES} held-out scenes. "
        f"Total time {elapsed / 60:.1f} min on {device}.\n\n"
        + markdown_table(results)
        + f"\nReading: {reading(results)}\n\n"
        "LPIPS is unavailable: no local LPIPS weights are configured. The context-depth row fits planes to the "
        "renderer's depth of the context views only (a stand-in for a depth estimator) and carries them into the "
        "target camera; the learned row carries its context planes over the same way; no row sees the target "
        'view\'s geometry. "world rays": the Plücker rays in the tokens are in the world frame (scene '
        "normalised to the first context camera) instead of each token's camera frame.\n"
        + accuracy
        + f"\n`comparison.png` columns: {columns}. `normals.png`: input | overlay | `{normals_of}` normals | "
        "ground-truth normals, per context view.\n"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m hrope.nvs.demo", description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=1000, help="training steps per model")
    parser.add_argument("--out", default="runs/demo")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    out = Path(args.out)
    results: list[dict] = []
    predictions: list[list] = []
    reference_rows: list[list] = []
    normal_rows, normals_of = None, None
    start = time.perf_counter()
    # every run has the same data config: render the training and held-out scenes once
    first = demo_config(DEMO_MODELS[0], out, args.steps)
    scenes = build_dataset(first, "train"), build_dataset(first, "eval")
    for index, row in enumerate(DEMO_MODELS):
        result, rows, model, device = _train_and_score(row, index, out, args.steps, scenes, start)
        results.append(result)
        predictions.append([r[-2] for r in rows])
        reference_rows = rows
        if "planes" in result and normal_rows is None:
            batch = collate([scenes[1][i] for i in range(2)], first["data"]["num_context"], device)
            normal_rows, normals_of = plane_normal_rows(model, batch), row.name
    elapsed = time.perf_counter() - start
    comparison = [[*row[:-2], row[-1], *(p[i] for p in predictions)] for i, row in enumerate(reference_rows)]
    save_image_grid(comparison, out / "comparison.png")
    if normal_rows is not None:
        save_image_grid(normal_rows, out / "normals.png")
    text = _report(args.steps, elapsed, device, results, normals_of)
    write_text(out / "results.md", text)
    write_json(out / "results.json", {"steps": args.steps, "seconds": elapsed, "results": results})
    print(text)


if __name__ == "__main__":
    main()
