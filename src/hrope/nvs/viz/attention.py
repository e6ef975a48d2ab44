"""``hrope viz attention RUN [RUN ...] --query X,Y``: the attention of one target patch over the context views.

For one held-out scene (of the first run's evaluation split) and one target patch (x, y) on the
patch grid, every run's model is probed (:func:`hrope.nvs.evaluation.attention_probe.probe`) and the figure
shows, per layer (rows), that patch's attention weights over each context view's patches as a
heat map over the context image, one group of columns per run (side by side: e.g. prope, urope,
hrope-lift on the same scene). The first column is the target view (ground truth) with the query
patch boxed. Markers in each context view: a white cross where the query patch's centre ray meets
the data's plane for that patch (where it should look), a cyan circle where it meets the model's
own plane for the target token (plane encodings). Weights are averaged over the heads (``head``:
one head); each panel's corner gives the share of the query's attention on that view. The colour
scale of a row runs from 0 to the largest weight in that row, so runs compare within a layer.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ..running.atomic import save_figure
from ..evaluation.attention_probe import Probe, probe
from .figures import VizError

__all__ = ["attention_figure", "visualize_attention", "parse_query"]

TRUTH_STYLE = dict(marker="x", color="white", markersize=9, markeredgewidth=2.5)
PLANE_STYLE = dict(marker="o", markerfacecolor="none", markeredgecolor="cyan", markersize=9, markeredgewidth=2)


def parse_query(text: str) -> tuple[int, int]:
    """``"X,Y"`` -> ``(x, y)`` patch column and row."""
    parts = text.split(",")
    if len(parts) != 2 or not all(p.strip().lstrip("-").isdigit() for p in parts):
        raise VizError(f"--query must be two integers X,Y (patch column, row), got {text!r}")
    return int(parts[0]), int(parts[1])


def _panel_weights(result: Probe, layer: int, head: int | None, grid, num_context: int) -> np.ndarray:
    """``(Vc, gh, gw)`` weights of the query over each context view's patches."""
    weights = result.weights[layer]
    if head is not None:
        if not -weights.shape[0] <= head < weights.shape[0]:
            raise VizError(f"--head {head} is out of range: {result.name} has {weights.shape[0]} heads")
        weights = weights[head]
    else:
        weights = weights.mean(0)
    P = grid[0] * grid[1]
    return weights[: num_context * P].reshape(num_context, *grid).numpy()


def attention_figure(results: list[Probe], images: torch.Tensor, query, grid, path, head: int | None = None) -> Path:
    """Draw ``results`` over ``images (Vc+1, 3, H, W)`` (context views, then the target) into ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    Vc = images.shape[0] - 1
    H, W = images.shape[-2:]
    layers = results[0].weights.shape[0]
    columns = 1 + len(results) * Vc
    figure, axes = plt.subplots(layers, columns, figsize=(1.9 * columns, 1.9 * layers + 0.4), squeeze=False)
    pictures = images.float().clamp(0, 1).permute(0, 2, 3, 1).cpu().numpy()
    extent = (0, W, H, 0)
    cell_h, cell_w = H / grid[0], W / grid[1]
    for layer in range(layers):
        panels = [_panel_weights(r, layer, head, grid, Vc) for r in results]
        top = max(float(p.max()) for p in panels) or 1.0
        target_axis = axes[layer, 0]
        target_axis.imshow(pictures[-1], extent=extent)
        box = Rectangle((query[0] * cell_w, query[1] * cell_h), cell_w, cell_h, fill=False, color="red", lw=2)
        target_axis.add_patch(box)
        target_axis.set_ylabel(f"layer {layer}", fontsize=9)
        for r, (result, weights) in enumerate(zip(results, panels)):
            for v in range(Vc):
                axis = axes[layer, 1 + r * Vc + v]
                axis.imshow(pictures[v], extent=extent)
                axis.imshow(weights[v], extent=extent, cmap="magma", alpha=0.7, vmin=0, vmax=top)
                axis.text(1, 1, f"{weights[v].sum():.0%}", color="white", fontsize=7, va="top", ha="left")
                for points, style in ((result.truth, TRUTH_STYLE), (result.planes[layer], PLANE_STYLE)):
                    if points is not None and torch.isfinite(points[v]).all():
                        axis.plot(*points[v].tolist(), **style)
                axis.set_xlim(0, W)
                axis.set_ylim(H, 0)
                if layer == 0:
                    axis.set_title(f"{result.name}\ncontext {v}", fontsize=8)
    axes[0, 0].set_title(f"target, patch ({query[0]}, {query[1]})", fontsize=8)
    for axis in axes.flat:
        axis.set_xticks([])
        axis.set_yticks([])
    figure.tight_layout()
    return _save(figure, Path(path))


def _save(figure, path: Path) -> Path:
    """Save ``figure`` as PNG whole (:func:`hrope.nvs.running.atomic.save_figure`) and close it."""
    import matplotlib.pyplot as plt

    try:
        return save_figure(figure, path, dpi=110)
    finally:
        plt.close(figure)


def visualize_attention(
    runs: list[str | Path],
    query: tuple[int, int],
    out: str | Path | None = None,
    scene: int = 0,
    head: int | None = None,
    device: str = "cpu",
) -> Path:
    """Write ``attention.png`` (module doc) for ``runs`` (run folders or checkpoints) on held-out
    scene ``scene`` of the first run; returns its path (default folder: ``<first run>/viz``)."""
    from ..build_data import build_dataset, collate
    from ..running.checkpoints import run_folder
    from ..pretrained import load_trained

    models = [load_trained(run, device) for run in runs]
    first = models[0][0].config
    for (model, _), run in zip(models, runs):
        shape, first_shape = (
            (model.config.image_size, model.config.patch_size, model.config.layers),
            (
                first.image_size,
                first.patch_size,
                first.layers,
            ),
        )
        if shape != first_shape:
            raise VizError(
                f"{run}: (image size, patch size, layers) {shape} differ from the first run's {first_shape}; "
                "runs shown together must share them"
            )
    config = models[0][1]
    dataset = build_dataset(config, "eval")
    if not 0 <= scene < len(dataset):
        raise VizError(f"--scene {scene} is out of range: the held-out split has {len(dataset)} scenes")
    num_context = config.data.num_context
    batch = collate([dataset[scene]], num_context, torch.device(device))
    results = [probe(model, batch, query, _name(model, run)) for (model, _), run in zip(models, runs)]
    images = batch.images[0, : num_context + 1]
    folder = Path(out) if out is not None else run_folder(runs[0]) / "viz"
    return attention_figure(results, images, query, first.grid, folder / "attention.png", head)


def _name(model, run) -> str:
    """A column title: the encoding, and the run folder's name when it says something else."""
    from ..running.checkpoints import run_folder

    folder = run_folder(run).name
    return model.config.encoding if folder == model.config.encoding else f"{model.config.encoding} ({folder})"
