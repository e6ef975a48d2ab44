"""Reports of the evaluation protocols (:mod:`hrope.nvs.evaluation.protocols`): Markdown tables and plots of
one protocol's results for one or more runs.

Public API::

    write_results(results, out) -> dict[str, Path]   (results: run_protocol's dicts, one protocol)
    markdown(results) -> str
"""

from __future__ import annotations

from pathlib import Path

from ..running.atomic import save_figure, write_json, write_text
from .metrics import lpips_label

__all__ = ["METRICS", "metric_labels", "markdown", "write_results"]

METRICS = ("psnr", "ssim", "lpips")


def metric_labels(results: list[dict]) -> dict[str, str]:
    """``{metric: label}`` of the results' metrics (the LPIPS one named by its backbone:
    :func:`hrope.nvs.evaluation.metrics.lpips_label`)."""
    return {"psnr": "PSNR ↑", "ssim": "SSIM ↑", "lpips": f"{lpips_label(results)} ↓"}


def _has_lpips(results: list[dict]) -> bool:
    return all(not isinstance(p["metrics"]["lpips"], str) for r in results for p in r["points"])


def _labels(results: list[dict]) -> list[str]:
    """Run names, with the run folder added where two runs share an encoding label."""
    names = [r["name"] for r in results]
    labels = []
    for r in results:
        path = Path(r["checkpoint"] or "model")
        folder = path.parent.name if path.suffix == ".safetensors" else path.name
        labels.append(f"{r['name']} [{folder}]" if names.count(r["name"]) > 1 else r["name"])
    return labels


def _format(value, metric: str) -> str:
    return value if isinstance(value, str) else f"{value:.{2 if metric == 'psnr' else 3}f}"


def markdown(results: list[dict]) -> str:
    """One table per metric: a row per run, a column per protocol point."""
    protocol = results[0]["protocol"]
    values = [p["value"] for p in results[0]["points"]]
    labels, names = _labels(results), metric_labels(results)
    lines = [
        f"# Protocol `{protocol}`",
        "",
        f"Columns: {results[0]['axis']}. Scenes: "
        + ", ".join(f"{label} {r['num_scenes']} ({r['num_skipped']} skipped)" for label, r in zip(labels, results))
        + ".",
        "",
    ]
    for metric in METRICS:
        lines += [
            f"**{names[metric]}**",
            "",
            "| model | " + " | ".join(f"{v:g}" for v in values) + " |",
            "|---|" + "---|" * len(values),
        ]
        for label, r in zip(labels, results):
            lines.append(
                f"| {label} | " + " | ".join(_format(p["metrics"][metric], metric) for p in r["points"]) + " |"
            )
        lines.append("")
    if not _has_lpips(results):
        lpips = lpips_label(results)
        lines.append(f"{lpips} unavailable (no local LPIPS weights): the PSNR–{lpips} trade-off plot is not drawn.")
    return "\n".join(lines) + "\n"


def _plot_metrics(results: list[dict], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = [m for m in METRICS if m != "lpips" or _has_lpips(results)]
    names = metric_labels(results)
    figure, axes = plt.subplots(1, len(metrics), figsize=(4.2 * len(metrics), 3.4), squeeze=False)
    for axis, metric in zip(axes[0], metrics):
        for label, r in zip(_labels(results), results):
            xs = [p["value"] for p in r["points"]]
            axis.plot(xs, [p["metrics"][metric] for p in r["points"]], marker="o", label=label)
        axis.set_xlabel(results[0]["axis"])
        axis.set_ylabel(names[metric])
        axis.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    figure.suptitle(f"protocol: {results[0]['protocol']}")
    figure.tight_layout()
    save_figure(figure, path, dpi=120)
    plt.close(figure)
    return path


def _plot_tradeoff(results: list[dict], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(4.5, 3.6))
    for label, r in zip(_labels(results), results):
        axis.plot(
            [p["metrics"]["lpips"] for p in r["points"]],
            [p["metrics"]["psnr"] for p in r["points"]],
            marker="o",
            label=label,
        )
    names = metric_labels(results)
    axis.set_xlabel(names["lpips"])
    axis.set_ylabel(names["psnr"])
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    save_figure(figure, path, dpi=120)
    plt.close(figure)
    return path


def write_results(results: list[dict], out) -> dict[str, Path]:
    """Write one protocol's results of one or more runs into ``out``: ``results.json`` (the list),
    ``results.md`` (tables), ``metrics.png`` (each metric vs the protocol's axis, a line per run;
    not for ``standard``) and ``psnr_lpips.png`` (only when LPIPS is available)."""
    if not results or len({r["protocol"] for r in results}) != 1:
        raise ValueError("write_results needs results of one protocol")
    out = Path(out)
    paths = {"json": out / "results.json", "markdown": out / "results.md"}
    write_json(paths["json"], results)
    write_text(paths["markdown"], markdown(results))
    if len(results[0]["points"]) > 1:
        paths["metrics_plot"] = _plot_metrics(results, out / "metrics.png")
    if _has_lpips(results):
        paths["tradeoff_plot"] = _plot_tradeoff(results, out / "psnr_lpips.png")
    return paths
