"""The demo's figures: ``comparison.png`` (images under a label per column) and ``results_bar.png``
(the results table as bars).

Both are drawn with matplotlib (Agg, its bundled font: nothing is fetched) and written atomically
(a temporary file in the same folder, then a rename).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from torch import Tensor

from ..running.atomic import save_figure
from ..evaluation.metrics import ST_LPIPS_NAME, lpips_name

__all__ = ["save_comparison", "save_results_bar", "BAR_METRICS"]

# (metrics key, axis label, better when higher, smallest axis span); a metric is drawn when every row has a
# number for it. The span keeps differences within run-to-run noise (docs/results.md) from filling the axis.
BAR_METRICS = (
    ("psnr", "PSNR (dB) ↑", True, 1.0),
    ("ssim", "SSIM ↑", True, 0.02),
    ("lpips", f"{lpips_name('alex')} ↓", False, 0.02),  # the demo's runs keep eval.lpips_net's default
    ("st_lpips", f"{ST_LPIPS_NAME} ↓", False, 0.02),
)
LABEL_WIDTH = 22  # characters per line of a column label


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_comparison(rows: list[list[Tensor]], labels: list[str], path: str | Path, cell_inches: float = 2.0) -> Path:
    """Rows of ``(3, H, W)`` images in [0, 1] as one PNG, ``labels[j]`` (wrapped) over column ``j``;
    each image ``cell_inches`` wide at 100 dpi, upscaled without smoothing (pixels stay visible)."""
    if not rows or any(len(row) != len(labels) for row in rows):
        raise ValueError(f"every row needs one image per label ({len(labels)}), got {[len(r) for r in rows]}")
    plt = _pyplot()
    lines = max(len(textwrap.wrap(label, LABEL_WIDTH)) for label in labels)
    title = 0.2 * lines + 0.15  # inches above the first row
    figure, axes = plt.subplots(
        len(rows),
        len(labels),
        figsize=(cell_inches * len(labels), cell_inches * len(rows) + title),
        squeeze=False,
        gridspec_kw={"wspace": 0.04, "hspace": 0.04},
    )
    for i, row in enumerate(rows):
        for j, image in enumerate(row):
            axis = axes[i][j]
            axis.imshow(image.detach().float().cpu().clamp(0, 1).permute(1, 2, 0).numpy(), interpolation="nearest")
            axis.set_xticks([])
            axis.set_yticks([])
            if i == 0:
                axis.set_title("\n".join(textwrap.wrap(labels[j], LABEL_WIDTH)), fontsize=10)
    height = cell_inches * len(rows) + title
    figure.subplots_adjust(left=0.005, right=0.995, bottom=0.005, top=1 - (title + 0.05) / height)
    try:
        return save_figure(figure, path, dpi=100)
    finally:
        plt.close(figure)


def save_results_bar(results: list[dict], path: str | Path, title: str = "") -> Path:
    """The results table (``name`` + ``metrics`` per row) as horizontal bars, one panel per metric
    that every row has a number for; each bar is labelled with its value, the best in bold. The axes
    are zoomed to the values' range (they do not start at 0: the differences are small next to the
    values), but span at least the metric's smallest span in :data:`BAR_METRICS`."""
    metrics = [m for m in BAR_METRICS if all(isinstance(r["metrics"].get(m[0]), float | int) for r in results)]
    if not results or not metrics:
        raise ValueError("no metric with a number for every row")
    plt = _pyplot()
    from matplotlib.ticker import MaxNLocator

    names = ["\n".join(textwrap.wrap(r["name"], 34)) for r in results]
    figure, axes = plt.subplots(1, len(metrics), figsize=(3.2 * len(metrics) + 2.6, 0.55 * len(results) + 1.4))
    axes = axes if len(metrics) > 1 else [axes]
    colours = [f"C{i}" for i in range(len(results))]
    for axis, (key, label, higher, span) in zip(axes, metrics):
        values = [float(r["metrics"][key]) for r in results]
        middle = (min(values) + max(values)) / 2
        low, high = min(min(values), middle - span / 2), max(max(values), middle + span / 2)
        margin = (high - low) * 0.15
        positions = list(range(len(results)))[::-1]  # first row on top
        axis.barh(positions, [v - (low - margin) for v in values], left=low - margin, color=colours)
        best = max(values) if higher else min(values)
        digits = 2 if key == "psnr" else 3
        for y, value in zip(positions, values):
            weight = "bold" if value == best else "normal"
            axis.text(value, y, f" {value:.{digits}f}", va="center", fontsize=8, fontweight=weight)
        axis.set_xlim(low - margin, high + 2 * margin)
        axis.xaxis.set_major_locator(MaxNLocator(4))
        axis.set_xlabel(label)
        axis.set_yticks(positions)
        axis.set_yticklabels(names if axis is axes[0] else [], fontsize=8)
        axis.grid(axis="x", alpha=0.3)
    if title:
        figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    try:
        return save_figure(figure, path, dpi=120)
    finally:
        plt.close(figure)
