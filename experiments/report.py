"""Aggregation, noise rule, Markdown and plots of the NVS benchmark (``experiments/nvs_table.py``).

Everything here works from the cell records (``metrics.json``) and Fig. 6 protocol results; the
Markdown and the PNGs are generated from the report JSON only, never typed by hand.

Noise rule: two rows differ "within seed noise" when ``|Δ mean| <= max(pooled std, floor)``,
with ``pooled std = sqrt((s_a² + s_b²) / 2)``, ``s`` the sample standard deviation over seeds,
and a floor (0.05 dB PSNR, 0.002 SSIM) because a std from 2 seeds can be tiny by chance (a
one-sigma screen, not a significance test). With fewer than 2 finished seeds per row there is no
std and the difference is reported as "1 seed".

Where both rows' cells carry per-scene PSNR (results version 1 on), a PSNR difference also gets its
95% crossed-bootstrap interval over seeds and scenes (:func:`psnr_interval`), and a claim's verdict
follows the interval (holds / reversed when it excludes zero, else within noise) instead of the
screen.

Rows, Fig. 6 curves and claims built on a cell trained on an earlier code version (reused with
``--allow-stale``, record flag ``stale``) are marked † in the Markdown and ``stale`` in the JSON.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path


from .intervals import crossed_bootstrap, interval_text
from .rows import ABLATIONS, APE_ABLATIONS, VIEW_COUNTS, Row, Table
from hrope.nvs.evaluation.metrics import lpips_name
from hrope.nvs.running.provenance import describe
from hrope.nvs.running.atomic import save_figure

__all__ = [
    "stat",
    "compare",
    "psnr_interval",
    "table_report",
    "fig6_report",
    "claims",
    "markdown",
    "plots",
    "NOISE_RULE",
    "NOISE_FLOOR",
]

NOISE_FLOOR = {"psnr": 0.05, "ssim": 0.002}
NOISE_RULE = (
    "differences with |Δ mean| <= max(pooled std over seeds, floor) are marked '≈' (within seed "
    "noise); pooled std = sqrt((s_a² + s_b²)/2), floor 0.05 dB PSNR / 0.002 SSIM; a one-sigma "
    "screen, not a significance test"
)
LPIPS_NAME = lpips_name("alex")  # the cells score LPIPS-Alex (experiments.cells)
METRICS = (("psnr", "PSNR ↑", 2), ("ssim", "SSIM ↑", 3), ("lpips", f"{LPIPS_NAME} ↓", 3))
STALE_MARK = " †"


def stat(values: list[float]) -> dict | None:
    """``{"mean", "std" (sample; None for one value), "n"}``, or None without values."""
    if not values:
        return None
    return {
        "mean": statistics.fmean(values),
        "std": statistics.stdev(values) if len(values) > 1 else None,
        "n": len(values),
    }


def compare(a: dict | None, b: dict | None, floor: float = 0.0) -> dict | None:
    """``a - b`` of two stats with the noise verdict: "higher", "lower", "within noise", "1 seed"."""
    if a is None or b is None:
        return None
    delta = a["mean"] - b["mean"]
    if a["std"] is None or b["std"] is None:
        return {"delta": delta, "pooled_std": None, "verdict": "1 seed"}
    pooled = math.sqrt((a["std"] ** 2 + b["std"] ** 2) / 2)
    verdict = "within noise" if abs(delta) <= max(pooled, floor) else ("higher" if delta > 0 else "lower")
    return {"delta": delta, "pooled_std": pooled, "verdict": verdict}


def psnr_interval(a: list[dict], b: list[dict]) -> dict | None:
    """The crossed-bootstrap PSNR difference ``a − b`` (:func:`experiments.intervals.crossed_bootstrap`)
    of two rows' cell records over the seeds both finished; None without common seeds or when one of
    those cells has no per-scene PSNR (results version 0)."""
    first, second = ({r["seed"]: r for r in records} for records in (a, b))
    seeds = sorted(first.keys() & second.keys())
    tables = [[(rows[s].get("per_scene") or {}).get("psnr") for s in seeds] for rows in (first, second)]
    if not seeds or any(scenes is None for table in tables for scenes in table):
        return None
    return crossed_bootstrap(*tables)


def _metric_stat(records: list[dict], name: str):
    values = [r["metrics"][name] for r in records]
    if any(isinstance(v, str) for v in values):
        return "unavailable"
    return stat(values)


def row_summary(records: list[dict], row: Row) -> dict:
    """Mean/std over the finished seeds of one row on one dataset."""
    times = [r["train_seconds"] for r in records if r["train_seconds"] is not None]
    summary = {
        "row": row.label,
        "encoding": row.encoding,
        "predictor": row.predictor,
        "num_context": row.num_context,
        "seeds": sorted(r["seed"] for r in records),
        "parameters": records[0]["parameters"] if records else None,
        "train_seconds": stat(times),
    }
    stale = [r for r in records if r.get("stale")]
    summary["stale"] = (
        None
        if not stale
        else {
            "seeds": sorted(r["seed"] for r in stale),
            "note": "trained on an earlier code version (" + ", ".join(sorted({r["trained_at"] for r in stale})) + ")",
        }
    )
    for name, _, _ in METRICS:
        summary[name] = _metric_stat(records, name) if records else None
    return summary


def table_report(table: Table, records: dict[tuple, list[dict]]) -> dict:
    """``records[(dataset, row)]``: finished cell records. Adds Δ PSNR/SSIM vs the reference row."""
    out = {"title": table.title, "datasets": {}}
    for dataset in table.datasets:
        rows = []
        for row in table.rows:
            own, theirs = records.get((dataset, row), []), records.get((dataset, table.reference(row)), [])
            summary = row_summary(own, row)
            reference = row_summary(theirs, table.reference(row))
            summary["reference"] = reference["row"]
            summary["psnr_interval"] = None if row == table.reference(row) else psnr_interval(own, theirs)
            for name in ("psnr", "ssim"):
                summary[f"delta_{name}"] = (
                    None if row == table.reference(row) else compare(summary[name], reference[name], NOISE_FLOOR[name])
                )
            rows.append(summary)
        out["datasets"][dataset] = rows
    return out


def fig6_report(results: dict[tuple, list[dict]], stale_rows=()) -> dict:
    """``results[(dataset, row, protocol)]``: protocol result dicts of the seeds -> mean/std per point.
    ``stale_rows``: (dataset, row) pairs with a cell trained on an earlier code version (listed
    per protocol as ``stale``)."""
    out: dict = {}
    for (dataset, row, protocol), runs in results.items():
        values = sorted({p["value"] for run in runs for p in run["points"]})
        points = []
        for value in values:
            entry = {"value": value}
            for name, _, _ in METRICS:
                per_seed = [p["metrics"][name] for run in runs for p in run["points"] if p["value"] == value]
                entry[name] = "unavailable" if any(isinstance(v, str) for v in per_seed) else stat(per_seed)
            points.append(entry)
        axis = runs[0].get("axis", protocol)
        block = out.setdefault(dataset, {}).setdefault(protocol, {"axis": axis, "rows": {}, "stale": []})
        block["rows"][row.label] = points
        if (dataset, row) in stale_rows:
            block["stale"].append(row.label)
    return out


# ----------------------------------------------------------------------------- claims
def _cells(report: dict, dataset: str, label: str) -> list[dict]:
    """The report's cell records of one row on one dataset."""
    return [r for r in report.get("cells", []) if r["dataset"] == dataset and r["row"] == label]


def _find(report: dict, table: str, dataset: str, label: str) -> dict | None:
    rows = report["tables"].get(table, {}).get("datasets", {}).get(dataset, [])
    return next((r for r in rows if r["row"] == label), None)


def _verdict(screen: dict | None, interval: dict | None) -> str:
    """A claim's verdict: from the interval when there is one (it excludes zero or not), else the noise screen."""
    if screen is None:
        return "pending"
    if interval is None:
        return {"higher": "holds", "lower": "reversed"}.get(screen["verdict"], screen["verdict"])
    return "holds" if interval["low"] > 0 else "reversed" if interval["high"] < 0 else "within noise"


def claims(report: dict) -> list[dict]:
    """The paper's ordering claims checked on PSNR, one entry per (claim, dataset) whose rows were planned."""
    pairs = []
    for dataset in report["tables"].get("table1", {}).get("datasets", {}):
        for ours in ("hrope", "hrope-lift"):
            for other in ("urope", "rayrope", "prope", "gta", "none"):
                pairs.append(("table1", dataset, ours, other))
    for dataset in report["tables"].get("table3", {}).get("datasets", {}):
        for encoding in ("hrope", "hrope-lift"):
            for source in ("oracle", "external"):
                pairs.append(("table3", dataset, f"{encoding} ({source})", encoding))
    for dataset in report["tables"].get("fig4a", {}).get("datasets", {}):
        for other in (a for a in ABLATIONS if a != "hrope"):
            pairs.append(("fig4a", dataset, "hrope", other))
        for encoding in APE_ABLATIONS:
            pairs.append(("fig4a", dataset, encoding, f"{encoding}-ape"))
    for dataset in report["tables"].get("table2", {}).get("datasets", {}):
        for views in VIEW_COUNTS:
            suffix = "" if views == 2 else f", {views} views"
            pairs.append(("table2", dataset, f"hrope{suffix}", f"prope{suffix}"))
            pairs.append(("table2", dataset, f"prope{suffix}", f"none{suffix}"))
    out = []
    for table, dataset, a, b in pairs:
        row_a, row_b = _find(report, table, dataset, a), _find(report, table, dataset, b)
        if row_a is None or row_b is None:  # a row left out with --rows
            continue
        result = compare(row_a["psnr"], row_b["psnr"], NOISE_FLOOR["psnr"])
        interval = psnr_interval(*(_cells(report, dataset, label) for label in (a, b)))
        out.append(
            {
                "table": table,
                "dataset": dataset,
                "claim": f"{a} > {b}",
                "verdict": _verdict(result, interval),
                "delta_psnr": None if result is None else result["delta"],
                "pooled_std": None if result is None else result["pooled_std"],
                "interval": interval,
                "stale": bool(row_a.get("stale") or row_b.get("stale")),
            }
        )
    return out


# ----------------------------------------------------------------------------- Markdown
def _fmt(value, digits: int) -> str:
    if value is None:
        return "pending"
    if isinstance(value, str):
        return value
    if value["std"] is None:
        return f"{value['mean']:.{digits}f} (1 seed)"
    return f"{value['mean']:.{digits}f} ± {value['std']:.{digits}f}"


def _fmt_delta(delta: dict | None, digits: int) -> str:
    if delta is None:
        return "—"
    mark = {"within noise": " ≈", "1 seed": " (1 seed)"}.get(delta["verdict"], "")
    return f"{delta['delta']:+.{digits}f}{mark}"


def _table_markdown(name: str, table: dict) -> list[str]:
    lines = [f"### {table['title']}", ""]
    for dataset, rows in table["datasets"].items():
        reference = "the same encoding with learned planes" if name == "table3" else "`none` (same views)"
        lines += [
            f"**{dataset}** (Δ vs {reference}; Δ PSNR [95% CI]: crossed bootstrap over seeds and scenes, bold "
            "when it excludes zero; without per-scene cells, ≈ = within seed noise)",
            "",
            f"| row | PSNR ↑ | Δ PSNR | SSIM ↑ | Δ SSIM | {LPIPS_NAME} ↓ | params | train s | seeds |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for r in rows:
            seconds = r["train_seconds"]
            lines.append(
                f"| {r['row']}{STALE_MARK if r.get('stale') else ''} | {_fmt(r['psnr'], 2)} | "
                f"{interval_text(r['psnr_interval']) if r.get('psnr_interval') else _fmt_delta(r['delta_psnr'], 2)} | "
                f"{_fmt(r['ssim'], 3)} | "
                f"{_fmt_delta(r['delta_ssim'], 3)} | {_fmt(r['lpips'], 3)} | "
                f"{'pending' if r['parameters'] is None else format(r['parameters'], ',')} | "
                f"{'pending' if seconds is None else format(seconds['mean'], '.0f')} | {len(r['seeds'])} |"
            )
        lines.append("")
    return lines


def _fig6_markdown(fig6: dict) -> list[str]:
    lines = ["### Fig. 6 analogue: out-of-distribution targets (Table 1 checkpoints, no retraining)", ""]
    if fig6.get("status") != "ok":
        return lines + [f"Not available: {fig6.get('status')}", ""]
    for dataset, protocols in fig6["datasets"].items():
        for protocol, block in protocols.items():
            values = sorted({p["value"] for points in block["rows"].values() for p in points})
            lines += [
                f"**{dataset}, {protocol}** (PSNR ↑ / SSIM ↑ against {block['axis']})",
                "",
                "| row | " + " | ".join(str(v) for v in values) + " |",
                "|---|" + "---|" * len(values),
            ]
            for label, points in block["rows"].items():
                by_value = {p["value"]: p for p in points}
                cells = [
                    f"{_fmt(by_value[v]['psnr'], 2)} / {_fmt(by_value[v]['ssim'], 3)}" if v in by_value else "pending"
                    for v in values
                ]
                mark = STALE_MARK if label in block.get("stale", ()) else ""
                lines.append(f"| {label}{mark} | " + " | ".join(cells) + " |")
            lines.append("")
    if fig6.get("note"):
        lines += [f"Note: {fig6['note']}.", ""]
    return lines


def _provenance_line(record: dict | None) -> str:
    if not record:
        return "Commit: not recorded  "
    return (
        f"Commit: `{describe(record)}` (source fingerprint `{record.get('source_fingerprint')}`, results version "
        f"{record.get('results_version')}, torch {record.get('torch')})  "
    )


def _claims_markdown(claims: list[dict]) -> list[str]:
    """The table of the paper's ordering claims and the count of each verdict."""
    lines = [
        "### The paper's ordering claims (PSNR)",
        "",
        "| table | dataset | claim | Δ PSNR | 95% CI | pooled std | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in claims:
        delta = "—" if c["delta_psnr"] is None else f"{c['delta_psnr']:+.2f}"
        interval = "—" if c.get("interval") is None else f"[{c['interval']['low']:+.2f}, {c['interval']['high']:+.2f}]"
        pooled = "—" if c["pooled_std"] is None else f"{c['pooled_std']:.2f}"
        mark = STALE_MARK if c.get("stale") else ""
        lines.append(
            f"| {c['table']} | {c['dataset']} | {c['claim']}{mark} | {delta} | {interval} | {pooled} | {c['verdict']} |"
        )
    counts = {
        v: sum(c["verdict"] == v for c in claims) for v in ("holds", "reversed", "within noise", "1 seed", "pending")
    }
    return lines + ["", "Verdicts: " + ", ".join(f"{v} {n}" for v, n in counts.items()) + ".", ""]


def markdown(report: dict) -> str:
    """The whole report as Markdown (generated from the report dict)."""
    budget = report["budget"]
    done, total = report["progress"]["finished"], report["progress"]["planned"]
    lines = [
        f"## NVS benchmark, `{budget['name']}` budget",
        "",
        f"Command: `{report['command']}`  ",
        _provenance_line(report.get("provenance")),
        f"Cells finished: {done} of {total} planned; generated {report['generated']}.  ",
        f"Budget: model {budget['model']}, {budget['steps']} steps of batch {budget['batch_size']}, AdamW lr "
        f"{budget['lr']} (warmup {budget['warmup']}, cosine), {budget['train_scenes']} training scenes, "
        f"{budget['eval_scenes']} held-out scenes (Fig. 6: {budget['protocol_scenes']}), seeds "
        f"{list(budget['seeds'])}, 1 target view per scene. Train time: wall seconds for all steps on "
        f"`{report['device']}` with {report['threads']} torch thread(s) (shared machine; indicative only).  ",
        f"Noise rule: {NOISE_RULE}. {LPIPS_NAME}: {report['lpips']}.",
        "",
    ]
    stale = report.get("stale_cells") or {}
    if stale.get("count"):
        versions = ", ".join(f"{version}: {n}" for version, n in stale["trained_at"].items())
        lines += [
            f"**† Trained on an earlier code version** ({versions}): {stale['count']} of {done} finished cells "
            "were reused with `--allow-stale`, not retrained with the commit above; every row, Fig. 6 curve "
            "and claim that uses one is marked †.",
            "",
        ]
    obsolete = report.get("obsolete_cells") or {}
    if obsolete:
        lines += [
            "Skipped cached cells of encodings that no longer exist: "
            + ", ".join(f"`{folder}` ({n})" for folder, n in obsolete.items())
            + ".",
            "",
        ]
    for name, table in report["tables"].items():
        lines += _table_markdown(name, table)
    if "fig6" in report:
        lines += _fig6_markdown(report["fig6"])
    if report["claims"]:
        lines += _claims_markdown(report["claims"])
    if report.get("plots"):
        lines += ["Plots: " + ", ".join(f"`{p}`" for p in report["plots"]), ""]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- plots
def _bars(ax, rows: list[dict], metric: str = "psnr") -> None:
    labels = [r["row"] for r in rows]
    means = [r[metric]["mean"] if isinstance(r[metric], dict) else float("nan") for r in rows]
    errors = [(r[metric]["std"] or 0.0) if isinstance(r[metric], dict) else 0.0 for r in rows]
    ax.bar(range(len(rows)), means, yerr=errors, capsize=3, color="tab:blue")
    ax.set_xticks(range(len(rows)), labels, rotation=60, ha="right", fontsize=7)
    finite = [m for m in means if math.isfinite(m)]
    if finite:
        spread = max(finite) - min(finite)
        ax.set_ylim(min(finite) - spread - 0.1, max(finite) + spread + 0.1)


def _context_curves(ax, rows: list[dict]) -> None:
    """Table 2: PSNR (mean ± std over seeds) against the number of context views, per encoding."""
    for encoding in ("none", "prope", "hrope"):
        points = [
            (r["num_context"], r["psnr"]) for r in rows if r["encoding"] == encoding and isinstance(r["psnr"], dict)
        ]
        if points:
            ax.errorbar(
                [p[0] for p in points],
                [p[1]["mean"] for p in points],
                yerr=[p[1]["std"] or 0.0 for p in points],
                marker="o",
                capsize=3,
                label=encoding,
            )
    ax.set_xlabel("context views")
    if ax.get_legend_handles_labels()[0]:
        ax.legend()


def _table_figure(plt, name: str, table: dict, path: Path) -> None:
    """One table's PNG: a panel per dataset (bars per row; Table 2: curves over context views)."""
    datasets = table["datasets"]
    fig, axes = plt.subplots(1, len(datasets), figsize=(5 * len(datasets), 4), squeeze=False)
    for ax, (dataset, rows) in zip(axes[0], datasets.items()):
        if name == "table2":
            _context_curves(ax, rows)
        else:
            _bars(ax, rows)
        ax.set_title(f"{name}: {dataset}")
        ax.set_ylabel("PSNR (dB), mean ± std over seeds")
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    plt.close(fig)


def _fig6_figure(plt, dataset: str, protocols: dict, path: Path) -> None:
    """One dataset's Fig. 6 PNG: a panel per protocol, PSNR against its axis, a line per row."""
    fig, axes = plt.subplots(1, len(protocols), figsize=(5 * len(protocols), 4), squeeze=False)
    for ax, (protocol, block) in zip(axes[0], protocols.items()):
        for label, points in block["rows"].items():
            points = [p for p in points if isinstance(p["psnr"], dict)]
            ax.plot(
                [p["value"] for p in points],
                [p["psnr"]["mean"] for p in points],
                marker="o",
                label=label,
                linestyle="-" if label in ("hrope", "hrope-lift") else "--",
            )
        ax.set_title(f"fig6 {dataset}: {protocol}")
        ax.set_xlabel(block["axis"])
        ax.set_ylabel("PSNR (dB), mean over seeds")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    plt.close(fig)


def plots(report: dict, out: Path) -> list[str]:
    """One PNG per table (PSNR ± std per row and dataset) and per Fig. 6 protocol; returns file names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for name, table in report["tables"].items():
        _table_figure(plt, name, table, out / f"{name}.png")
        written.append(f"{name}.png")
    fig6 = report.get("fig6", {})
    if fig6.get("status") == "ok":
        for dataset, protocols in fig6["datasets"].items():
            _fig6_figure(plt, dataset, protocols, out / f"fig6_{dataset}.png")
            written.append(f"fig6_{dataset}.png")
    return written
