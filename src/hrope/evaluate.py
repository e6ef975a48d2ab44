"""Evaluation of a checkpoint on held-out scenes: metrics JSON + Markdown + qualitative grids.

Metrics per target image (:mod:`hrope.metrics`), averaged per scene, then over scenes (LVSM's
protocol). LPIPS is computed only when ``eval.lpips_weights`` names a local weights file;
otherwise it is reported as ``"unavailable"``.

Outputs in ``out`` (default: ``<run folder>/eval``): ``results.json``, ``results.md``,
``grid.png`` (one row per scene: context views | prediction | ground truth) and ``config.yaml``.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from .config import save_config
from .metrics import LPIPS, image_metrics
from .viz import save_image_grid

__all__ = ["evaluate", "evaluate_model", "markdown_table", "UNAVAILABLE"]

UNAVAILABLE = "unavailable"


def evaluate_model(model, dataset, num_context: int, *, batch_size: int = 4, lpips: LPIPS | None = None,
                   device: str | torch.device = "cpu", num_grid_scenes: int = 0):
    """Per-metric means over the scenes of ``dataset`` and grid rows of the first scenes.

    Returns ``(means {metric: float or "unavailable"}, rows)``.
    """
    from .train import collate

    model.eval()
    per_scene: dict[str, list[float]] = {"psnr": [], "ssim": [], "lpips": []}
    rows = []
    with torch.no_grad():
        for start in range(0, len(dataset), batch_size):
            scenes = [dataset[i] for i in range(start, min(start + batch_size, len(dataset)))]
            batch = collate(scenes, num_context, torch.device(device))
            prediction = model(batch).images.float()
            target = batch.images[:, num_context:].float()
            B, Vt = target.shape[:2]
            values = image_metrics(prediction.flatten(0, 1), target.flatten(0, 1), lpips)
            for name, value in values.items():
                per_scene[name] += value.reshape(B, Vt).mean(1).tolist()
            for b in range(B):
                if len(rows) < num_grid_scenes:
                    rows.append([*batch.images[b, :num_context], prediction[b, 0], target[b, 0]])
    means = {name: (sum(v) / len(v) if v else UNAVAILABLE) for name, v in per_scene.items()}
    return means, rows


def markdown_table(results: list[dict]) -> str:
    """A Markdown table of result dicts (``name`` + ``metrics``)."""
    lines = ["| model | PSNR ↑ | SSIM ↑ | LPIPS ↓ |", "|---|---|---|---|"]
    for r in results:
        cells = []
        for name, digits in (("psnr", 2), ("ssim", 3), ("lpips", 3)):
            value = r["metrics"][name]
            cells.append(value if isinstance(value, str) else f"{value:.{digits}f}")
        lines.append(f"| {r['name']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def evaluate(checkpoint: str | Path, out: str | Path | None = None, *, num_scenes: int | None = None,
             device: str = "cpu", lpips_weights: str | None = None) -> dict:
    """Evaluate ``checkpoint`` (file or run folder) and write the outputs; returns the results dict."""
    from .train import build_dataset, load_model

    model, config = load_model(checkpoint, device)
    if num_scenes is not None:
        config["eval"]["num_scenes"] = int(num_scenes)
    if lpips_weights is not None:
        config["eval"]["lpips_weights"] = lpips_weights
    weights = config["eval"]["lpips_weights"]
    lpips = LPIPS(weights).to(device) if weights else None
    dataset = build_dataset(config, "eval")
    num_context = config["data"]["num_context"]
    means, rows = evaluate_model(model, dataset, num_context, batch_size=config["eval"]["batch_size"],
                                 lpips=lpips, device=device, num_grid_scenes=config["eval"]["num_grid_scenes"])
    checkpoint = Path(checkpoint)
    out = Path(out) if out is not None else (checkpoint if checkpoint.is_dir() else checkpoint.parent) / "eval"
    name = config["model"]["encoding"]
    if model.source is not None:
        name += f" ({config['model']['predictor']})"
    results = {"name": name, "checkpoint": str(checkpoint), "num_scenes": len(dataset),
               "num_context": num_context, "num_target": config["data"]["num_target"], "metrics": means,
               "lpips_backbone": "alexnet" if lpips is not None else None}
    save_config(config, out)
    (out / "results.json").write_text(json.dumps(results, indent=2))
    (out / "results.md").write_text(markdown_table([results]))
    if rows:
        save_image_grid(rows, out / "grid.png")
    return results
