"""Binning, paired gains, Markdown and figure of the geometry sweep (experiments/geometry_sweep.py).

:func:`summarise` turns the per-cell sweeps of one dataset (``{row label: {seed: sweep}}``, each a
:func:`geometry_sweep.sweep_model` dict) into per-row, per-bin pooled PSNR and paired gains over the
reference row; the binning rules are in geometry_sweep.py's docstring.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from hrope.nvs.running.atomic import save_figure
from .intervals import METHOD, crossed_bootstrap
from hrope.nvs.running.provenance import describe
from .view_geometry import SLANT_EDGES, bin_index, quantile_edges

__all__ = ["psnr", "binned_rows", "summarise", "markdown", "tables", "plot"]

MSE_FLOOR = 1e-10  # a scene bin without error reads 100 dB instead of inf


def psnr(mse: Tensor) -> Tensor:
    """PSNR in dB of images in [0, 1] from their MSE (floored at :data:`MSE_FLOOR`)."""
    return -10.0 * torch.log10(mse.clamp_min(MSE_FLOOR))


def _tables(sweeps: dict[int, dict], angle_index: Tensor, angle_bins: int) -> dict[str, tuple[Tensor, Tensor]]:
    """Per kind (``angle``, ``slant``, ``all``): squared-error sums ``(seeds, scenes, bins)`` and pixel
    counts ``(scenes, bins)`` of one row's sweeps (seeds in sorted order)."""
    first = sweeps[min(sweeps)]
    ones = torch.full(angle_index.shape, float(first["pixels"]), dtype=torch.float64)
    angle_pixels = torch.zeros(len(angle_index), angle_bins, dtype=torch.float64).scatter_add_(1, angle_index, ones)
    angle_se, slant_se = [], []
    for seed in sorted(sweeps):
        target_se = torch.tensor(sweeps[seed]["target_se"], dtype=torch.float64)
        angle_se.append(torch.zeros_like(angle_pixels).scatter_add_(1, angle_index, target_se))
        slant_se.append(torch.tensor(sweeps[seed]["slant_se"], dtype=torch.float64))
    slant_pixels = torch.tensor(first["slant_pixels"], dtype=torch.float64)
    angle = torch.stack(angle_se)
    return {
        "angle": (angle, angle_pixels),
        "slant": (torch.stack(slant_se), slant_pixels),
        "all": (angle.sum(-1, keepdim=True), angle_pixels.sum(-1, keepdim=True)),
    }


def _bin(se: Tensor, pixels: Tensor, reference_se: Tensor | None, use: Tensor) -> dict:
    """One bin of one row: pooled MSE and PSNR (over scenes, mean over seeds) and the paired gain
    over the reference on the scenes ``use``. ``se (seeds, scenes)``, ``pixels (scenes,)``."""
    total = float(pixels.sum())
    if total == 0:
        return {"pixels": 0, "mse": None, "psnr": None, "vs_reference": None}
    mse = float((se.sum(1) / total).mean())
    out = {
        "pixels": int(total),
        "mse": mse,
        "psnr": float(psnr(torch.tensor(mse, dtype=torch.float64))),
        "vs_reference": None,
    }
    if reference_se is not None and bool(use.any()):
        scene_psnr = psnr(se[:, use] / pixels[use])
        out["vs_reference"] = crossed_bootstrap(scene_psnr.tolist(), psnr(reference_se[:, use] / pixels[use]).tolist())
    return out


def binned_rows(tables: dict[str, dict[str, tuple[Tensor, Tensor]]], reference: str, min_pixels: int) -> list[dict]:
    """Per row (``tables``: row label -> :func:`_tables`), per kind, per bin: :func:`_bin`, the
    reference's own bins without a gain. A scene enters a bin's gain when it has ``min_pixels``
    target pixels there."""
    out = []
    for label, kinds in tables.items():
        row: dict = {"row": label}
        for kind, (se, pixels) in kinds.items():
            reference_se = None if label == reference else tables[reference][kind][0]
            row[kind] = [
                _bin(
                    se[..., b],
                    pixels[:, b],
                    None if reference_se is None else reference_se[..., b],
                    pixels[:, b] >= min_pixels,
                )
                for b in range(pixels.shape[1])
            ]
        row["mse"] = row["all"][0]["mse"]
        out.append(row)
    return out


def _check_same_scenes(by_row: dict[str, dict[int, dict]]) -> dict:
    """The first sweep, after checking every sweep has its scene geometry (else the cells were
    scored on different scenes)."""
    sweeps = [sweep for seeds in by_row.values() for sweep in seeds.values()]
    first = sweeps[0]
    for sweep in sweeps[1:]:
        if any(sweep[key] != first[key] for key in ("angle", "distance", "slant_pixels", "pixels")):
            raise ValueError("the cells were scored on different test scenes (their view geometry differs)")
    return first


def summarise(by_row: dict[str, dict[int, dict]], reference: str, *, angle_bins: int, min_pixels: int) -> dict:
    """One dataset's sweep: the bins (edges, populations) and :func:`binned_rows` with, per row, its
    seeds, mean per-image PSNR and the largest difference of a cell's recomputed PSNR to its record."""
    first = _check_same_scenes(by_row)
    angles = torch.tensor(first["angle"], dtype=torch.float64)  # (scenes, targets)
    distances = torch.tensor(first["distance"], dtype=torch.float64)
    edges = quantile_edges(angles, angle_bins)
    index = bin_index(angles, edges)
    tables = {label: _tables(sweeps, index, angle_bins) for label, sweeps in by_row.items()}
    angle_pixels, slant_pixels = tables[reference]["angle"][1], tables[reference]["slant"][1]
    rows = binned_rows(tables, reference, min_pixels)
    for row in rows:
        cells = by_row[row["row"]]
        row["seeds"] = sorted(cells)
        row["psnr_images"] = sum(sum(c["psnr"]) / len(c["psnr"]) for c in cells.values()) / len(cells)
        row["max_psnr_difference_to_record"] = max(c["psnr_difference"] for c in cells.values())
        row["stale_cells"] = sum(c["stale"] for c in cells.values())
    angle = [
        {
            "label": f"{edges[b]:.0f}–{edges[b + 1]:.0f}°",
            "targets": int((index == b).sum()),
            "median_angle": float(angles[index == b].median()) if (index == b).any() else None,
            "mean_distance": float(distances[index == b].mean()) if (index == b).any() else None,
            "scenes": int((angle_pixels[:, b] >= min_pixels).sum()),
        }
        for b in range(angle_bins)
    ]
    labels = [f"{lo:.0f}–{hi:.0f}°" for lo, hi in zip(SLANT_EDGES, SLANT_EDGES[1:])] + ["no surface"]
    slant = [
        {
            "label": label,
            "pixel_share": float(slant_pixels[:, b].sum() / slant_pixels.sum()),
            "scenes": int((slant_pixels[:, b] >= min_pixels).sum()),
        }
        for b, label in enumerate(labels)
    ]
    return {"angle_edges": edges, "angle": angle, "slant": slant, "scenes": len(angles), "rows": rows}


def _cell(value: dict, reference: bool) -> str:
    """A table cell: the bin's pooled PSNR and, for other rows, the gain with its interval."""
    if value["psnr"] is None:
        return "—"
    text = f"{value['psnr']:.2f}"
    gain = value["vs_reference"]
    if reference or gain is None:
        return text
    delta = f"{gain['mean']:+.2f} [{gain['low']:+.2f}, {gain['high']:+.2f}]"
    return f"{text} ({'**' + delta + '**' if gain['excludes_zero'] else delta})"


def _table(summary: dict, kind: str, reference: str) -> list[str]:
    bins = summary[kind]
    keep = [b for b, info in enumerate(bins) if kind == "angle" or info["pixel_share"] > 0]
    header = "| row | all | " + " | ".join(bins[b]["label"] for b in keep) + " |"
    lines = [header, "|---" * (len(keep) + 2) + "|"]
    for row in summary["rows"]:
        is_reference = row["row"] == reference
        cells = [_cell(row["all"][0], is_reference)] + [_cell(row[kind][b], is_reference) for b in keep]
        lines.append(f"| {row['row']} | " + " | ".join(cells) + " |")
    if kind == "angle":
        what = "; ".join(
            f"{b['label']}: {b['targets']} targets, median {b['median_angle']:.1f}°, nearest context camera "
            f"{b['mean_distance']:.2f} away"
            for b in bins
            if b["targets"]
        )
    else:
        what = "; ".join(f"{bins[b]['label']}: {100 * bins[b]['pixel_share']:.1f}% of pixels" for b in keep)
    scenes = ", ".join(str(bins[b]["scenes"]) for b in keep)
    return lines + ["", f"Bins: {what}. Scenes in each bin's gain: {scenes} of {summary['scenes']}.", ""]


def markdown(report: dict) -> str:
    budget, reference = report["budget"], report["reference"]
    lines = [
        f"## {report['title']}",
        "",
        f"Command: `{report['command']}`  ",
        f"Commit: `{describe(report['provenance'])}`; generated {report['generated']}.  ",
        f"Cells of budget `{budget['name']}` ({budget['steps']} steps, {budget['eval_scenes']} held-out test scenes), "
        f"seeds {report['seeds']}, scored again on the test scenes.  ",
        "Each cell: PSNR of the bin's pooled MSE (all its pixels, all scenes, mean MSE over seeds); in brackets "
        f"the mean paired gain over `{reference}` of per-scene binned PSNR (same seed, same scene) with {METHOD}; "
        f"**bold** where it excludes zero. A scene enters a bin's gain with at least {report['min_pixels']} target "
        "pixels in it. View angle: between the target's viewing direction and the nearest context view's, "
        f"{report['angle_bins']} quantile bins. Surface slant: between the ground-truth normal and the pixel's ray "
        "(renderer normals, analysis only; no model sees them).",
        "",
    ]
    return "\n".join(lines) + "\n" + tables(report)


def tables(report: dict) -> str:
    """The per-dataset angle and slant tables of a sweep report (Markdown; also docs/results.md's)."""
    reference, lines = report["reference"], []
    for dataset, summary in report["datasets"].items():
        checks = [row["max_psnr_difference_to_record"] for row in summary["rows"]]
        stale = sum(row["stale_cells"] for row in summary["rows"])
        lines += [f"**{dataset}** — gain vs view angle", ""] + _table(summary, "angle", reference)
        lines += [f"**{dataset}** — gain vs surface slant", ""] + _table(summary, "slant", reference)
        lines += [
            f"Recomputed mean per-image PSNR vs the cells' metrics.json: largest difference {max(checks):.2e} dB"
            + (f"; {stale} cells were trained by other code (--allow-stale)." if stale else "."),
            "",
        ]
    return "\n".join(lines)


def _panel(axis, summary: dict, kind: str, reference: str) -> None:
    """Gain (with its interval) per bin, one line per row, all rows on the same axes."""
    bins = summary[kind]
    if kind == "angle":
        xs = [b["median_angle"] for b in bins]
        keep = [i for i, x in enumerate(xs) if x is not None]
    else:
        keep = list(range(len(SLANT_EDGES) - 1))  # the "no surface" bin has no slant
        xs = [(lo + hi) / 2 for lo, hi in zip(SLANT_EDGES, SLANT_EDGES[1:])]
    others = [row for row in summary["rows"] if row["row"] != reference]
    spread = (max(xs[i] for i in keep) - min(xs[i] for i in keep)) or 1.0
    for number, row in enumerate(others):
        points = [(xs[i], row[kind][i]["vs_reference"]) for i in keep if row[kind][i]["vs_reference"]]
        shift = (number - (len(others) - 1) / 2) * 0.015 * spread
        axis.errorbar(
            [x + shift for x, _ in points],
            [g["mean"] for _, g in points],
            yerr=[[g["mean"] - g["low"] for _, g in points], [g["high"] - g["mean"] for _, g in points]],
            marker="o",
            capsize=3,
            label=row["row"],
        )
    axis.axhline(0.0, color="grey", linewidth=0.8)
    axis.set_xlabel("view angle to nearest context view (°, bin median)" if kind == "angle" else "surface slant (°)")
    axis.set_ylabel(f"PSNR gain over {reference} (dB)")


def plot(report: dict, path: Path) -> None:
    """One row of two panels per dataset: gain vs view angle, gain vs surface slant."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    datasets = list(report["datasets"])
    figure, axes = plt.subplots(len(datasets), 2, figsize=(11, 4 * len(datasets)), squeeze=False, sharey="row")
    for axis_row, dataset in zip(axes, datasets):
        for axis, kind in zip(axis_row, ("angle", "slant")):
            _panel(axis, report["datasets"][dataset], kind, report["reference"])
            axis.set_title(f"{dataset}: gain vs {'view angle' if kind == 'angle' else 'surface slant'}")
    axes[0][0].legend(fontsize=7)
    figure.tight_layout()
    save_figure(figure, path, dpi=120)
    plt.close(figure)
