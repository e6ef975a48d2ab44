"""``python -m hrope.nvs.demo`` (``make demo``): the whole pipeline on CPU in minutes.

Trains four ``tiny`` LVSM models on synthetic room scenes — ``none`` (LVSM baseline), ``prope``,
``hrope`` with learned planes and ``hrope`` with oracle (ground-truth) planes — for the same
number of steps and batches, evaluates each on held-out scenes, and writes into ``runs/demo``:
``results.md`` / ``results.json`` (PSNR, SSIM, LPIPS unavailable without local weights),
``comparison.png`` (per scene: context views | ground truth | each model's prediction) and
``normals.png`` (hrope's learned plane normals next to the ground truth). Re-running resumes or
reuses finished runs. Single-threaded torch per run (fast and predictable on a shared 2-core box).
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path


from ..encodings import ENCODINGS
from .config import resolve
from .datasets import build_dataset, collate
from .evaluate import evaluate_model, markdown_table
from .train import train
from .viz import plane_normal_rows, save_image_grid

__all__ = ["DEMO_MODELS", "demo_config", "main"]

DEMO_MODELS = (("none", "learned"), ("prope", "learned"), ("hrope", "learned"), ("hrope", "oracle"))
TRAIN_SCENES, EVAL_SCENES, BATCH_SIZE = 256, 32, 4


def demo_config(encoding: str, predictor: str, out: Path, steps: int) -> dict:
    """The resolved config of one demo run."""
    return resolve({
        "model": {"preset": "tiny", "encoding": encoding, "predictor": predictor},
        "data": {"kind": "room", "num_scenes": TRAIN_SCENES, "num_context": 2, "num_target": 1},
        "train": {"out": str(out), "steps": steps, "batch_size": BATCH_SIZE, "lr": 1e-3, "warmup": 50,
                  "checkpoint_every": max(1, steps // 4), "image_every": max(1, steps // 4), "threads": 1},
        "eval": {"num_scenes": EVAL_SCENES, "num_grid_scenes": 4},
    })


def run_name(encoding: str, predictor: str) -> str:
    """The encoding, with the plane source for encodings that take per-token inputs."""
    return f"{encoding}-{predictor}" if ENCODINGS[encoding].takes_token_inputs() else encoding


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m hrope.nvs.demo", description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=1000, help="training steps per model")
    parser.add_argument("--out", default="runs/demo")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    out = Path(args.out)
    results, predictions, reference_rows, normal_rows = [], [], None, None
    start = time.perf_counter()
    # every run has the same data config: render the training and held-out scenes once
    first = demo_config(*DEMO_MODELS[0], out, args.steps)
    train_scenes, eval_scenes = build_dataset(first, "train"), build_dataset(first, "eval")
    for index, (encoding, predictor) in enumerate(DEMO_MODELS):
        name = run_name(encoding, predictor)
        print(f"[{index + 1}/{len(DEMO_MODELS)}] {name}: training {args.steps} steps "
              f"(elapsed {time.perf_counter() - start:.0f} s)", flush=True)
        config = demo_config(encoding, predictor, out / name, args.steps)
        model = train(config, dataset=train_scenes).model.eval()
        device = next(model.parameters()).device  # train.device "auto" picks CUDA when available
        print(f"[{index + 1}/{len(DEMO_MODELS)}] {name}: evaluating on {config['eval']['num_scenes']} held-out "
              "scenes", flush=True)
        metrics, _, rows = evaluate_model(model, eval_scenes, config["data"]["num_context"], device=device,
                                       num_grid_scenes=config["eval"]["num_grid_scenes"])
        results.append({"name": name, "metrics": metrics})
        print(f"    PSNR {metrics['psnr']:.2f}  SSIM {metrics['ssim']:.3f}", flush=True)
        predictions.append([row[-2] for row in rows])
        reference_rows = rows
        if (encoding, predictor) == ("hrope", "learned"):
            batch = collate([eval_scenes[i] for i in range(2)], config["data"]["num_context"], device)
            normal_rows = plane_normal_rows(model, batch)
    elapsed = time.perf_counter() - start
    comparison = [[*row[:-2], row[-1], *(p[i] for p in predictions)] for i, row in enumerate(reference_rows)]
    save_image_grid(comparison, out / "comparison.png")
    if normal_rows is not None:
        save_image_grid(normal_rows, out / "normals.png")
    columns = " | ".join(["context views", "ground truth", *(r["name"] for r in results)])
    text = (
        "# Demo results\n\n"
        f"Command: `make demo` (`python -m hrope.nvs.demo --steps {args.steps}`). Tiny LVSM (64x64, patch 8, d 128, "
        f"4 layers), {args.steps} steps of batch {BATCH_SIZE} on {TRAIN_SCENES} synthetic room scenes (2 context + "
        f"1 target views), evaluated on {EVAL_SCENES} held-out scenes. Total time {elapsed / 60:.1f} min on {device}.\n\n"
        + markdown_table(results)
        + "\nLPIPS is unavailable: no local LPIPS weights are configured.\n\n"
        f"`comparison.png` columns: {columns}. `normals.png`: input | overlay | hrope (learned) normals | "
        "ground-truth normals, per context view.\n"
    )
    (out / "results.md").write_text(text)
    (out / "results.json").write_text(json.dumps({"steps": args.steps, "seconds": elapsed, "results": results},
                                                 indent=2))
    print(text)


if __name__ == "__main__":
    main()
