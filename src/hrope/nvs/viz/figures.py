"""Figures: image grids, predicted plane normals (the paper's Fig. 5), plane accuracy over training.

``hrope viz planes CHECKPOINT`` (a run or a saved model folder): for the run's held-out scenes
(synthetic or real), every context view as input | input overlaid with the model's normals | its
per-patch normal map (the planes it predicts or, for the ``external`` source, fits) | the data's
planes, a column drawn only when the data has them (``batch.planes``: exact synthetic planes, or a
least-squares fit to the data's depth). Normals are in the camera frame, facing the camera,
coloured ``(n + 1) / 2`` (x red, y green, z blue; OpenCV axes); a patch without a plane (m = 0) is
grey.

``hrope viz plane-accuracy RUN``: the run's ``plane_accuracy.jsonl`` (written by training,
:mod:`hrope.nvs.evaluation.plane_accuracy`) over steps: normal error and depth error, context and target
views, predicted (solid) and neutral planes (dashed), and the plane heads' gradient norm when the
run logged it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import Tensor

from ...errors import InputError
from ...planes import Planes
from ..running.atomic import save_figure, save_image
from ..build_data import build_dataset, collate
from ..running.checkpoints import run_folder
from ..config import Field
from ..evaluation.plane_accuracy import GROUPS, LOG_NAME, read_log
from ..pretrained import load_trained

__all__ = [
    "save_image_grid",
    "normal_colours",
    "context_planes",
    "plane_normal_rows",
    "visualize_planes",
    "plot_plane_accuracy",
    "VizError",
]

PAD = 2
OVERLAY_ALPHA = 0.6


class VizError(InputError):
    """A checkpoint or input that cannot be visualised as asked."""


def save_image_grid(rows: list[list[Tensor]], path: str | Path) -> Path:
    """Save rows of ``(3, H, W)`` images in [0, 1] as one PNG (white padding between cells)."""
    if not rows or not rows[0]:
        raise VizError("nothing to draw")
    H, W = rows[0][0].shape[-2:]
    columns = max(len(r) for r in rows)
    canvas = torch.ones(3, len(rows) * (H + PAD) + PAD, columns * (W + PAD) + PAD)
    for i, row in enumerate(rows):
        for j, image in enumerate(row):
            y, x = PAD + i * (H + PAD), PAD + j * (W + PAD)
            canvas[:, y : y + H, x : x + W] = image.detach().float().cpu().clamp(0, 1)
    path = Path(path)
    array = (canvas.permute(1, 2, 0).numpy() * 255 + 0.5).astype(np.uint8)
    save_image(Image.fromarray(array), path)
    return path


def normal_colours(normals: Tensor, grid: tuple[int, int], patch_size: int) -> Tensor:
    """Per-token normals ``(P, 3)`` of one view -> ``(3, H, W)`` colour image, one block per patch."""
    image = ((normals + 1) / 2).T.reshape(3, *grid)
    return F.interpolate(image[None], scale_factor=patch_size, mode="nearest")[0].clamp(0, 1)


def context_planes(model, batch, layer: int = -1, head: int = 0) -> tuple[Tensor, Tensor]:
    """The planes ``model`` gives every context view of ``batch``, as its attention reads them (from
    the first target's sequence, ``layer`` of the predicted parameters, attention head ``head`` of a
    per-head source): unit normals facing the camera ``(B, Vc, P, 3)`` and the z-depth where each
    plane crosses its patch-centre ray ``(B, Vc, P)`` (inf for m = 0, the plane at infinity), in
    each context camera's frame; P = grid_h * grid_w (:meth:`hrope.Planes.normal_and_depth`)."""
    config = model.config
    if model.source is None or "planes" not in {s.name for s in model.source.specs}:
        raise VizError(f"encoding {config.encoding!r} takes no planes; nothing to visualise")
    with torch.no_grad():
        output = model(batch)
    count = len(output.parameters)
    if not -count <= layer < count:
        raise VizError(
            f"layer {layer} is out of range: the model predicts planes {count} time(s) (layers {-count}..{count - 1})"
        )
    P = config.grid[0] * config.grid[1]
    Vc = int(batch.num_context)
    Vt = batch.images.shape[1] - Vc
    cameras = model.fold_cameras(batch.cameras, Vc).to(dtype=torch.float32)
    m = output.parameters[layer]["planes"]
    heads = model.source.attention_heads
    if not -heads <= head < heads:
        raise VizError(f"head {head} is out of range: the model predicts planes for {heads} head(s)")
    if heads > 1:
        m = m[:, :, head]
    normal, depth = Planes.from_m(m.float()).normal_and_depth(cameras, config.grid)  # (B*Vt, (Vc+1)P, ...)
    return normal[::Vt, : Vc * P].unflatten(1, (Vc, P)), depth[::Vt, : Vc * P].unflatten(1, (Vc, P))


def plane_normal_rows(model, batch, layer: int = -1, head: int = 0) -> list[list[Tensor]]:
    """Rows ``[input, overlay, predicted normals, ground-truth normals]`` for every context view of
    every scene of ``batch`` (the model's planes by :func:`context_planes`); without ground truth
    (``batch.planes(p)`` None) the rows end after the predicted normals."""
    grid, p = model.config.grid, model.config.patch_size
    P = grid[0] * grid[1]
    predicted, _ = context_planes(model, batch, layer, head)  # (B, Vc, P, 3)
    B, Vc = predicted.shape[:2]
    truth_planes = batch.planes(p)
    if truth_planes is not None:
        truth, _ = truth_planes.normal_and_depth(batch.cameras.to(dtype=torch.float32), grid)  # (B, V*P, 3)
    rows = []
    for b in range(B):
        for v in range(Vc):
            image = batch.images[b, v].float().cpu()
            pred = normal_colours(predicted[b, v].cpu(), grid, p)
            overlay = (1 - OVERLAY_ALPHA) * image + OVERLAY_ALPHA * pred
            rows.append([image, overlay, pred])
            if truth_planes is not None:
                rows[-1].append(normal_colours(truth[b, v * P : (v + 1) * P].cpu(), grid, p))
    return rows


def visualize_planes(
    checkpoint: str | Path,
    out: str | Path | None = None,
    num_scenes: int = 4,
    layer: int = -1,
    device: str = "cpu",
    head: int = 0,
) -> Path:
    """Write ``planes.png`` (see module doc) for ``num_scenes`` held-out scenes; returns its path."""
    Field("int", low=1).check("num_scenes", num_scenes, VizError)
    model, config = load_trained(checkpoint, device)
    dataset = build_dataset(config, "eval")
    scenes = [dataset[i] for i in range(min(num_scenes, len(dataset)))]
    batch = collate(scenes, config.data.num_context, torch.device(device))
    rows = plane_normal_rows(model, batch, layer, head)
    out = Path(out) if out is not None else run_folder(checkpoint) / "viz"
    return save_image_grid(rows, out / "planes.png")


def plot_plane_accuracy(run: str | Path, out: str | Path | None = None) -> Path:
    """Write ``plane_accuracy.png`` (see module doc) from ``run``'s ``plane_accuracy.jsonl`` (``run``: the run
    folder or its checkpoint file) into ``out`` (default ``<run>/viz``); returns its path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not Path(run).exists():
        raise VizError(f"run not found: {run}")
    log = run_folder(run) / LOG_NAME
    if not log.is_file():
        raise VizError(
            f"no {log}: only training runs of plane encodings with a learned or backbone source on "
            f"data with ground-truth planes log plane accuracy"
        )
    records = read_log(log)
    steps = [r["step"] for r in records]
    marker = "." if len(steps) <= 50 else None  # a short log: show its points
    with_grads = all("parameter_grad_norm" in r for r in records)
    figure, axes = plt.subplots(1, 3 if with_grads else 2, figsize=(13.5 if with_grads else 9, 3.4))
    panels = (("normal_error_deg", "normal error (degrees)"), ("depth_rel_error", "relative depth error"))
    if with_grads:  # the plane heads' gradient norm, before clipping
        axes[2].plot(steps, [r["parameter_grad_norm"] for r in records], color="tab:green", marker=marker)
        axes[2].set_xlabel("step")
        axes[2].set_ylabel("plane heads' gradient norm")
        axes[2].set_yscale("log")
        axes[2].grid(alpha=0.3)
    for axis, (metric, label) in zip(axes, panels):
        for group, colour in zip(GROUPS, ("tab:blue", "tab:orange")):
            axis.plot(steps, [r[group][metric] for r in records], color=colour, marker=marker, label=group)
            axis.plot(
                steps,
                [r[group][metric + "_neutral"] for r in records],
                color=colour,
                marker=marker,
                linestyle="--",
                label=f"{group} (neutral)",
            )
        axis.set_xlabel("step")
        axis.set_ylabel(label)
        axis.grid(alpha=0.3)
    figure.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=4, fontsize=8)
    figure.tight_layout(rect=(0, 0.08, 1, 1))
    path = Path(out) if out is not None else run_folder(run) / "viz"
    save_figure(figure, path / "plane_accuracy.png", dpi=120)
    plt.close(figure)
    return path / "plane_accuracy.png"
