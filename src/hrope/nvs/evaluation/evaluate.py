"""Evaluation of a checkpoint on held-out scenes: metrics JSON + Markdown + qualitative grids.

Metrics per target image (:mod:`hrope.nvs.evaluation.metrics`), averaged per scene, then over scenes (LVSM's
protocol). LPIPS (LPIPS-Alex or LPIPS-VGG, ``eval.lpips_net``) is computed only when
``eval.lpips_weights`` names a local weights file; otherwise it is reported as ``"unavailable"``.
ST-LPIPS (alex), a different perceptual distance whose weights ship with the
``stlpips-pytorch`` package (the ``perceptual`` extra), is computed by
:func:`evaluate` whenever that package is installed and the images are at least 24 pixels a
side (``"unavailable"`` otherwise) and has its own column (``metrics["st_lpips"]``); the
lower-level functions compute it only when given a module.
For predicted planes (a plane encoding with a learned or backbone source) on data with
ground-truth planes, ``results["planes"]`` holds their accuracy (:mod:`hrope.nvs.evaluation.plane_accuracy`:
context and target views, scene-weighted means).

Outputs in ``out`` (default: ``<run folder>/eval``): ``results.json``, ``results.md``,
``grid.png`` (one row per scene: context views | prediction | ground truth) and ``config.yaml``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple
from itertools import islice
from pathlib import Path

import torch

from ..running.atomic import write_json, write_text
from ..build_data import build_dataset, collate
from ..running.checkpoints import run_folder
from ..config import RunConfig, save_config, update_config
from .metrics import LPIPS, ST_LPIPS_NAME, STLPIPS, image_metrics, lpips_label, st_lpips_weights
from .plane_accuracy import GROUPS, METRICS, PlaneAccuracy
from ..pretrained import load_trained
from ..viz.figures import save_image_grid

__all__ = [
    "Evaluation",
    "evaluate",
    "evaluate_model",
    "evaluate_scenes",
    "batch_metrics",
    "run_name",
    "apply_data_overrides",
    "apply_eval_options",
    "markdown_table",
    "configured_lpips",
    "lpips_fields",
    "planes_table",
    "available_st_lpips",
    "UNAVAILABLE",
]

UNAVAILABLE = "unavailable"


class Evaluation(NamedTuple):
    """``means {metric: float or "unavailable"}`` over scenes, ``per_scene {metric: [value per
    scene]}`` (each scene's mean over its target images, in scene order; empty lists for a metric
    not computed) and grid ``rows`` of the first scenes."""

    means: dict
    per_scene: dict[str, list[float]]
    rows: list


def batch_metrics(
    model,
    scenes,
    num_context: int,
    device,
    lpips: LPIPS | None = None,
    *,
    return_prediction: bool = False,
    planes: PlaneAccuracy | None = None,
    st_lpips: STLPIPS | None = None,
):
    """Per-scene metric means ``{metric: [value per scene]}`` of one batch of ``scenes`` (each target
    image scored, then averaged per scene); LPIPS only with ``lpips``, ST-LPIPS only with
    ``st_lpips``; the batch's plane errors are
    added to ``planes`` when given. With ``return_prediction`` also returns ``(batch, prediction
    (B, Vt, 3, H, W))``."""
    batch = collate(scenes, num_context, torch.device(device))
    with torch.no_grad():
        output = model(batch)
        prediction = output.images.float()
        target = batch.images[:, num_context:].float()
        B, Vt = target.shape[:2]
        values = image_metrics(prediction.flatten(0, 1), target.flatten(0, 1), lpips, st_lpips)
    if planes is not None:
        planes.add(output.parameters, batch, model)
    per_scene = {name: value.reshape(B, Vt).mean(1).tolist() for name, value in values.items()}
    return (per_scene, batch, prediction) if return_prediction else per_scene


def evaluate_scenes(
    model,
    scenes: Iterable,
    num_context: int,
    *,
    batch_size: int = 4,
    lpips: LPIPS | None = None,
    device: str | torch.device = "cpu",
    num_grid_scenes: int = 0,
    planes: PlaneAccuracy | None = None,
    st_lpips: STLPIPS | None = None,
):
    """Score ``scenes`` (any iterable of :class:`hrope.nvs.data.Scene`, read ``batch_size`` at a time);
    with ``planes``, also accumulate the accuracy of predicted planes there.

    Returns an :class:`Evaluation` (grid rows of the first ``num_grid_scenes`` scenes).
    """
    model.eval()
    per_scene: dict[str, list[float]] = {"psnr": [], "ssim": [], "lpips": []}
    if st_lpips is not None:
        per_scene["st_lpips"] = []
    rows: list[list[torch.Tensor]] = []
    scenes = iter(scenes)
    while chunk := list(islice(scenes, batch_size)):
        values, batch, prediction = batch_metrics(
            model, chunk, num_context, device, lpips, return_prediction=True, planes=planes, st_lpips=st_lpips
        )
        for name, value in values.items():
            per_scene[name] += value
        for b in range(len(chunk)):
            if len(rows) < num_grid_scenes:
                rows.append([*batch.images[b, :num_context], prediction[b, 0], batch.images[b, num_context]])
    means = {name: (sum(v) / len(v) if v else UNAVAILABLE) for name, v in per_scene.items()}
    return Evaluation(means, per_scene, rows)


def evaluate_model(
    model,
    dataset,
    num_context: int,
    *,
    batch_size: int = 4,
    lpips: LPIPS | None = None,
    device: str | torch.device = "cpu",
    num_grid_scenes: int = 0,
    planes: PlaneAccuracy | None = None,
    st_lpips: STLPIPS | None = None,
):
    """:func:`evaluate_scenes` over the scenes of ``dataset``; with ``planes``, the accuracy of
    predicted planes is accumulated there (``planes.means()``). Returns an :class:`Evaluation`."""
    scenes = (dataset[i] for i in range(len(dataset)))
    return evaluate_scenes(
        model,
        scenes,
        num_context,
        batch_size=batch_size,
        lpips=lpips,
        device=device,
        num_grid_scenes=num_grid_scenes,
        planes=planes,
        st_lpips=st_lpips,
    )


def available_st_lpips(device: str | torch.device = "cpu", image_size: int | None = None) -> STLPIPS | None:
    """ST-LPIPS (alex) on ``device`` when the ``stlpips-pytorch`` package is installed and the images
    (``image_size`` pixels a side, when given) are large enough for it, else None."""
    if st_lpips_weights() is None or (image_size is not None and image_size < STLPIPS.MIN_SIZE):
        return None
    return STLPIPS().to(device)


def configured_lpips(config: RunConfig, device: str | torch.device = "cpu") -> LPIPS | None:
    """The LPIPS of a run config's ``eval`` section (local ``lpips_weights`` of the backbone
    ``lpips_net``) on ``device``; None without weights."""
    weights = config.eval.lpips_weights
    return LPIPS(weights, config.eval.lpips_net).to(device) if weights else None


def lpips_fields(config: RunConfig, lpips: LPIPS | None) -> dict:
    """A results dict's LPIPS fields: ``lpips_net`` (``eval.lpips_net``, which names the column) and
    ``lpips_backbone`` (``alexnet`` / ``vgg16``, None when LPIPS was unavailable)."""
    net = config.eval.lpips_net
    return {"lpips_net": net, "lpips_backbone": LPIPS.BACKBONES[net] if lpips is not None else None}


def run_name(config: RunConfig, model) -> str:
    """A run's label: its encoding, plus the predictor for encodings with parameters and where its
    target views' values come from (e.g. ``hrope-lift (oracle, with target geometry)``)."""
    name = config.model.encoding
    if model.source is not None:
        name += f" ({model.source.describe(config.model.predictor)})"
    return name


def markdown_table(results: list[dict]) -> str:
    """A Markdown table of result dicts (``name`` + ``metrics``): its LPIPS column named by the
    results' backbone (:func:`hrope.nvs.evaluation.metrics.lpips_label`), an ST-LPIPS column when
    every result has ``metrics["st_lpips"]`` (a value or ``"unavailable"``)."""
    columns = [("psnr", 2, "PSNR ↑"), ("ssim", 3, "SSIM ↑"), ("lpips", 3, f"{lpips_label(results)} ↓")]
    if results and all("st_lpips" in r["metrics"] for r in results):
        columns.append(("st_lpips", 3, f"{ST_LPIPS_NAME} ↓"))
    lines = ["| model | " + " | ".join(c[2] for c in columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for r in results:
        cells = []
        for name, digits, _ in columns:
            value = r["metrics"][name]
            cells.append(value if isinstance(value, str) else f"{value:.{digits}f}")
        lines.append(f"| {r['name']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def planes_table(planes: dict) -> str:
    """A Markdown table of ``results["planes"]``: a row per view group, a column per metric."""
    lines = ["| views | normal error (°) ↓ | neutral | depth rel. error ↓ | neutral |", "|---|---|---|---|---|"]
    for group in GROUPS:
        values = planes[group]
        cells = [f"{values[m]:.1f}" if m.startswith("normal") else f"{values[m]:.3f}" for m in METRICS]
        lines.append(f"| {group} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def apply_data_overrides(config: RunConfig, data: dict | None) -> RunConfig:
    """``config`` with keys of its ``data`` section replaced by ``data`` (unknown keys raise)."""
    return update_config(config, {"data": data}) if data else config


def apply_eval_options(config: RunConfig, **options) -> RunConfig:
    """``config`` with the ``eval`` keys of ``options`` that are not None replaced (validated like
    the config: a :class:`hrope.nvs.config.ConfigError` names a bad one)."""
    return update_config(config, {"eval": {k: v for k, v in options.items() if v is not None}})


def evaluate(
    checkpoint: str | Path,
    out: str | Path | None = None,
    *,
    num_scenes: int | None = None,
    device: str = "cpu",
    lpips_weights: str | None = None,
    data: dict | None = None,
    split: str | None = None,
) -> dict:
    """Evaluate ``checkpoint`` (file, run folder or saved model folder, :mod:`hrope.nvs.pretrained`)
    and write the outputs; returns the results dict.

    ``data`` overrides keys of the run's ``data`` config section (e.g. a real dataset to test on);
    ``split`` the scenes scored (``eval.split``: "eval", the test scenes, or "val").
    """
    model, config = load_trained(checkpoint, device)
    config = apply_eval_options(
        apply_data_overrides(config, data), num_scenes=num_scenes, lpips_weights=lpips_weights, split=split
    )
    lpips = configured_lpips(config, device)
    st_lpips = available_st_lpips(device, model.config.image_size)
    dataset = build_dataset(config, config.eval.split)
    num_context = config.data.num_context
    accuracy = PlaneAccuracy()
    means, _, rows = evaluate_model(
        model,
        dataset,
        num_context,
        batch_size=config.eval.batch_size,
        lpips=lpips,
        device=device,
        num_grid_scenes=config.eval.num_grid_scenes,
        planes=accuracy,
        st_lpips=st_lpips,
    )
    means.setdefault("st_lpips", UNAVAILABLE)
    checkpoint = Path(checkpoint)
    out = Path(out) if out is not None else run_folder(checkpoint) / "eval"
    results = {
        "name": run_name(config, model),
        "checkpoint": str(checkpoint),
        "num_scenes": len(dataset),
        "num_context": num_context,
        "num_target": config.data.num_target,
        "metrics": means,
        **lpips_fields(config, lpips),
    }
    table = markdown_table([results])
    if (planes := accuracy.means()) is not None:
        results["planes"] = planes
        table += "\nPredicted planes (neutral: the planes a zero head output decodes to):\n\n" + planes_table(planes)
    save_config(config, out)
    write_json(out / "results.json", results)
    write_text(out / "results.md", table)
    if rows:
        save_image_grid(rows, out / "grid.png")
    return results
