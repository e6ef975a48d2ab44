"""Gain over ``prope`` with world rays against the depth's quality: the ``noise`` set's figure and table.

Reads the cells (``cells.jsonl``) of the ``noise`` set (levels 1-3 and sparse points,
``plane_evidence.py --set noise``) and of the ``planned`` set (level 0: exact context depth, and
``prope`` with world rays), pairs every depth row with ``prope (rays world)`` (same seed, same
held-out scene, crossed-bootstrap 95% interval as in the reports: intervals.crossed_bootstrap) and
plots the mean gain with its interval per depth variant (x: 0, 1, 2, 3, sparse) for the depth
rows of ``plane_evidence.noise_rows`` (hrope-lift; prope + the additive plane embedding;
hrope-lift-uv; urope anchored at the token's depth). Cells are used only when they share the
steps and held-out scenes of the first reference cell found (noise folder first), so a quick run
never mixes with a full one.

    python -m experiments.noise_figure                   # benchmarks/results/{depth_noise,planned_room} -> docs/images
    python -m experiments.noise_figure --noise /tmp/noise_quick --planned /tmp/noise_quick --figure /tmp/noise.png
"""

from __future__ import annotations

import argparse
from pathlib import Path


from .store import CELLS_NAME, CellStore
from .plane_evidence import NOISE_REFERENCE, NOISE_VARIANTS, noise_rows, row_report
from hrope.nvs.running.atomic import save_figure, write_text

__all__ = ["gains", "markdown", "plot", "main"]

# the rows of noise_rows, in order
KINDS = ("hrope-lift", "prope + additive hrope-lift", "hrope-lift-uv (camera rays)", "urope at the token's depth")


def _records(folders: list[Path], dataset: str) -> dict[str, list[dict]]:
    """``{row label: [record per seed]}`` of ``dataset`` in the folders' cell stores, in folder order
    (the first folder's record of a seed wins)."""
    out: dict[str, dict[int, dict]] = {}
    for folder in folders:
        store = CellStore(folder / CELLS_NAME)
        for cell in store.ids():
            record = store.record(cell)
            if record is not None and record["dataset"] == dataset:
                out.setdefault(record["row"], {}).setdefault(record["seed"], record)
    return {label: list(by_seed.values()) for label, by_seed in out.items()}


def gains(folders: list[Path], dataset: str = "room") -> dict[str, dict[str, dict | None]]:
    """``{variant: {kind: vs_reference or None}}``: each depth row's paired PSNR gain over
    ``prope (rays world)`` (:func:`plane_evidence.row_report`), None where its cells are missing."""
    records = _records(folders, dataset)
    reference = records.get(NOISE_REFERENCE.label, [])
    if not reference:
        raise SystemExit(f"noise_figure.py: error: no {NOISE_REFERENCE.label!r} cells of {dataset} in {folders}")
    budget = {(reference[0]["steps"], reference[0]["eval_scenes"])}  # of the first folder holding the reference
    reference = [r for r in reference if (r["steps"], r["eval_scenes"]) in budget]
    out: dict[str, dict[str, dict | None]] = {}
    for variant in NOISE_VARIANTS:
        out[variant] = {}
        for kind, row in zip(KINDS, noise_rows(variant)):
            rows = [r for r in records.get(row.label, []) if (r["steps"], r["eval_scenes"]) in budget]
            out[variant][kind] = row_report(rows, reference).get("vs_reference") if rows else None
    return out


def markdown(table: dict[str, dict[str, dict | None]], dataset: str) -> str:
    """The gains as a Markdown table (mean [95% interval], dB; — where not measured)."""
    lines = [
        f"**{dataset}**: PSNR gain over `{NOISE_REFERENCE.label}` (dB, mean [95% crossed-bootstrap interval])",
        "",
        "| context depth | " + " | ".join(KINDS) + " |",
        "|---|" + "---|" * len(KINDS),
    ]
    for variant, row in table.items():
        cells = [
            "—"
            if g is None
            else f"{g['mean']:+.2f} [{g['low']:+.2f}, {g['high']:+.2f}] ({g['seeds']} seed(s), {g['scenes']} scenes)"
            for g in row.values()
        ]
        name = {"0": "exact (level 0)", "sparse": "sparse points"}.get(variant, f"noise level {variant}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(table: dict[str, dict[str, dict | None]], path: Path, dataset: str) -> Path:
    """The gain per variant for both rows, with the intervals as error bars, saved to ``path`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    figure, axes = plt.subplots(figsize=(6, 3.6))
    variants = list(table)
    for index, kind in enumerate(KINDS):
        colour = f"C{index}"
        for sparse in (False, True):  # the noise levels joined by a line; the sparse points apart
            points = [
                (x, table[v][kind])
                for x, v in enumerate(variants)
                if table[v][kind] is not None and (v == "sparse") == sparse
            ]
            if not points:
                continue
            x = [p[0] + (index - 0.5) * 0.12 for p in points]
            mean = [p[1]["mean"] for p in points]
            spread = [[p[1]["mean"] - p[1]["low"] for p in points], [p[1]["high"] - p[1]["mean"] for p in points]]
            style = {"marker": "s", "linestyle": "none"} if sparse else {"marker": "o", "label": kind}
            axes.errorbar(x, mean, yerr=spread, capsize=3, color=colour, **style)
    axes.axhline(0.0, color="grey", linewidth=0.8)
    axes.set_xticks(range(len(variants)), ["0 (exact)", "1", "2", "3", "sparse"][: len(variants)])
    axes.set_xlabel("context depth: noise level / sparse points")
    axes.set_ylabel(f"PSNR gain over {NOISE_REFERENCE.label} (dB)")
    axes.set_title(f"{dataset}: depth rows vs depth quality (95% crossed intervals)", fontsize=10)
    axes.legend(fontsize=8)
    figure.tight_layout()
    try:
        return save_figure(figure, path, dpi=120)
    finally:
        plt.close(figure)


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__)
    parser.add_argument("--noise", default="benchmarks/results/depth_noise", help="the noise set's output folder")
    parser.add_argument("--planned", default="benchmarks/results/planned_room", help="the planned set's output folder")
    parser.add_argument("--dataset", default="room")
    parser.add_argument("--figure", default="docs/images/depth_noise.png")
    parser.add_argument("--table", default=None, help="Markdown table (default: NOISE/depth_noise_gain.md)")
    args = parser.parse_args(argv)
    noise = Path(args.noise)
    table = gains([noise, Path(args.planned)], args.dataset)
    text = markdown(table, args.dataset)
    write_text(Path(args.table or noise / "depth_noise_gain.md"), text)
    plot(table, Path(args.figure), args.dataset)
    print(text, end="")
    return text


if __name__ == "__main__":
    main()
