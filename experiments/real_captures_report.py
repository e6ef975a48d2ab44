"""The report of a real-capture set (experiments/real_captures.py): ``OUT/real_captures.{json,md}``.

Per budget (steps) and row: PSNR (and SSIM, LPIPS where the evaluation gave them) as mean ± std
over seeds, the mean PSNR per capture, and the paired difference to the set's reference row (same
seed, same scene) with a 95% bootstrap interval; the set's extra pairs the same way; the context
views' angles (degrees: target to each context, between the contexts) over the scored scenes; for
a learning curve, the budget its rule supports (:func:`supported_budget`) and what the planned set
would cost there.
"""

from __future__ import annotations

import statistics
from datetime import datetime, timezone
from pathlib import Path

from hrope.nvs.running.atomic import write_json, write_text
from hrope.nvs.running.provenance import describe

from .intervals import hierarchical_bootstrap, interval_text
from .report import stat

__all__ = [
    "REPORT_NAME",
    "METHOD",
    "difference",
    "angle_ranges",
    "supported_budget",
    "budget_lines",
    "write_report",
    "markdown",
]

REPORT_NAME = "real_captures"
METHOD = (
    "a 95% percentile bootstrap of the mean paired difference (same seed, same scene) that resamples seeds, "
    "captures and scenes within captures, the capture and scene draws shared by all seeds, widened for few "
    "captures (t with captures - 1 degrees of freedom; experiments.intervals.hierarchical_bootstrap)"
)
WORKERS = 2  # processes the planned set is sized for (one torch thread each)


def _by_seed(records: list[dict]) -> dict[int, dict]:
    return {r["seed"]: r for r in records}


def difference(a: list[dict], b: list[dict]) -> dict | None:
    """Mean paired PSNR difference ``a - b`` over the seeds both rows have, with its 95% interval
    (:data:`METHOD`; ``captures``: the distinct captures of the scored scenes); None without common seeds."""
    first, second = _by_seed(a), _by_seed(b)
    seeds = sorted(set(first) & set(second))
    if not seeds:
        return None
    return hierarchical_bootstrap(
        [first[s]["per_scene"]["psnr"] for s in seeds],
        [second[s]["per_scene"]["psnr"] for s in seeds],
        first[seeds[0]]["scene_captures"],
    )


def _summary(values: list[float]) -> dict:
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def angle_ranges(record: dict) -> dict:
    """Min / median / max (degrees) of the target-to-context angles and of the angle between the
    contexts over a record's scored scenes, and the scenes per capture."""
    angles = record["context_angles"]
    return {
        "scenes": len(angles),
        "target_context": _summary([x for a in angles for x in a[:2]]),
        "between_contexts": _summary([a[2] for a in angles]),
        "scenes_per_capture": {c: record["scene_captures"].count(c) for c in dict.fromkeys(record["scene_captures"])},
    }


def _row(label: str, records: list[dict], reference: list[dict] | None, stale: list[str]) -> dict:
    """One row of one budget: metric stats, PSNR per capture, the difference to the reference."""
    numbers = [m for m, v in records[0]["metrics"].items() if isinstance(v, (int, float))]  # not "unavailable"
    metrics = {m: stat([r["metrics"][m] for r in records]) for m in numbers}
    per_capture: dict[str, list[float]] = {}
    for record in records:
        for capture, value in zip(record["scene_captures"], record["per_scene"]["psnr"]):
            per_capture.setdefault(capture, []).append(value)
    return {
        "row": label,
        "seeds": sorted(r["seed"] for r in records),
        "metrics": metrics,
        "psnr_per_capture": {c: statistics.fmean(v) for c, v in per_capture.items()},
        "train_seconds": stat([r["train_seconds"] for r in records if r.get("train_seconds") is not None]),
        "vs_reference": None if reference is None else difference(records, reference),
        "trained_at": stale,
    }


def supported_budget(rows_by_steps: dict[int, list[dict]]) -> dict:
    """The curve's rule (experiments/real_captures_sets.py): the smallest budget B such that at B and
    every larger budget the rows keep the order by mean PSNR they have at the largest budget and
    each row's difference to the reference lies in that difference's interval at the largest one."""
    budgets = sorted(rows_by_steps)
    largest = {row["row"]: row for row in rows_by_steps[budgets[-1]]}
    order = lambda rows: [r["row"] for r in sorted(rows, key=lambda r: -r["metrics"]["psnr"]["mean"])]  # noqa: E731
    checks = []
    for steps in budgets:
        rows = rows_by_steps[steps]
        same_order = order(rows) == order(largest.values())
        inside = {
            r["row"]: largest[r["row"]]["vs_reference"]["low"]
            <= r["vs_reference"]["mean"]
            <= largest[r["row"]]["vs_reference"]["high"]
            for r in rows
            if r["vs_reference"] is not None and largest.get(r["row"], {}).get("vs_reference") is not None
        }
        checks.append({"steps": steps, "order": order(rows), "same_order": same_order, "inside": inside})
    passing = [c["steps"] for c in checks if c["same_order"] and all(c["inside"].values())]
    supported = next(s for s in budgets if all(x in passing for x in budgets if x >= s))
    return {"checks": checks, "supported": supported}


def _planned_cost(rows: list[dict], cells: int) -> float | None:
    """Hours the planned set's ``cells`` cells would take on :data:`WORKERS` workers at these rows' mean cell time."""
    seconds = [row["train_seconds"]["mean"] for row in rows if row["train_seconds"]]
    return statistics.fmean(seconds) * cells / WORKERS / 3600 if seconds else None


def write_report(spec, records: dict, stale: dict, out: Path, *, steps, seeds, command: str, facts: dict) -> dict:
    """Build the report of the finished ``records`` (``{(steps, arm): [record per seed]}``; ``stale``:
    the same keys, the code versions of their cells trained by other code), write
    ``OUT/real_captures.{json,md}`` and return it. ``facts``: ``captures`` (name: camera fingerprint),
    ``provenance``, ``planned_cells`` (the planned set's cells, for the curve's cost estimate),
    ``missing`` (the cells not finished, in words)."""
    reference = spec.arms[0]
    rows_by_steps, pairs, angles, description, sfm = {}, {}, None, None, None
    for n in steps:
        ref = records.get((n, reference))
        rows_by_steps[n] = [
            _row(arm.label, records[(n, arm)], ref, stale[(n, arm)]) for arm in spec.arms if (n, arm) in records
        ]
        pairs[n] = [
            {"a": spec.arms[i].label, "b": spec.arms[j].label, **delta}
            for i, j in spec.pairs
            if (n, spec.arms[i]) in records
            and (n, spec.arms[j]) in records
            and (delta := difference(records[(n, spec.arms[i])], records[(n, spec.arms[j])])) is not None
        ]
        if angles is None and ref:
            angles, description = angle_ranges(ref[0]), ref[0].get("data")
        sfm = sfm or next((r["sfm"] for (m, _), rs in records.items() if m == n for r in rs if r.get("sfm")), None)
    report = {
        "title": spec.title,
        "set": spec.name,
        "command": command,
        "provenance": facts["provenance"],
        "generated": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "split": "test" if spec.split == "eval" else "validation",
        "protocol": spec.protocol,
        "held_out": list(spec.held_out),
        "test_every": spec.test_every,
        "captures": facts["captures"],
        "reference": reference.label,
        "seeds": seeds,
        "steps": steps,
        "context_angles": angles,
        "data": description,
        "sfm": sfm,
        "budgets": {str(n): rows for n, rows in rows_by_steps.items()},
        "pairs": {str(n): p for n, p in pairs.items()},
        "missing_cells": facts["missing"],
    }
    complete = {n: rows for n, rows in rows_by_steps.items() if len(rows) == len(spec.arms)}
    if len(steps) > 1 and len(complete) == len(steps):
        budget = supported_budget(complete)
        budget["planned_hours"] = {str(n): _planned_cost(rows, facts["planned_cells"]) for n, rows in complete.items()}
        report["budget"] = budget
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / f"{REPORT_NAME}.json", report)
    write_text(out / f"{REPORT_NAME}.md", markdown(report))
    return report


def _interval(d: dict | None) -> str:
    return "—" if d is None else interval_text(d)


def _stat(s: dict | None, digits: int = 2) -> str:
    if not s:
        return "—"
    return f"{s['mean']:.{digits}f}" + (f" ± {s['std']:.{digits}f}" if s["std"] is not None else "")


def _budget_table(report: dict, steps: str, rows: list[dict]) -> list[str]:
    captures = sorted(report["captures"])
    lines = [
        f"**{steps} steps**",
        "",
        f"| row | PSNR ↑ | SSIM ↑ | LPIPS ↓ | Δ PSNR vs {report['reference']} [95% CI] | "
        + " | ".join(captures)
        + " | seeds |",
        "|---|---|---|---|---|" + "---|" * len(captures) + "---|",
    ]
    for row in rows:
        m = row["metrics"]
        delta = None if row["row"] == report["reference"] else row["vs_reference"]
        per_capture = " | ".join(
            f"{row['psnr_per_capture'][c]:.2f}" if c in row["psnr_per_capture"] else "—" for c in captures
        )
        label = row["row"] + (" ‡" if row["trained_at"] else "")
        lines.append(
            f"| {label} | {_stat(m.get('psnr'))} | {_stat(m.get('ssim'), 3)} | {_stat(m.get('lpips'), 3)} | "
            f"{_interval(delta)} | {per_capture} | {len(row['seeds'])} |"
        )
    for pair in report["pairs"].get(steps, []):
        lines.append(f"\n{pair['a']} − {pair['b']}: {_interval(pair)}")
    return lines + [""]


def budget_lines(budget: dict) -> list[str]:
    lines = ["**Budget** (the rule in experiments/real_captures_sets.py):", ""]
    for check in budget["checks"]:
        outside = [row for row, ok in check["inside"].items() if not ok]
        lines.append(
            f"- {check['steps']} steps: order {' > '.join(f'`{r}`' for r in check['order'])}; "
            + ("same order as" if check["same_order"] else "another order than")
            + " the largest budget; "
            + (
                f"Δ outside the largest budget's interval: {', '.join(outside)}"
                if outside
                else "every Δ inside the largest budget's interval"
            )
            + (
                f"; planned set ≈ {budget['planned_hours'][str(check['steps'])]:.1f} h on {WORKERS} workers"
                if budget["planned_hours"].get(str(check["steps"]))
                else ""
            )
        )
    return lines + ["", f"The curve supports **{budget['supported']} steps**.", ""]


def _range(summary: dict) -> str:
    return f"{summary['min']:.1f}–{summary['max']:.1f}° (median {summary['median']:.1f}°)"


def _angles_line(angles: dict) -> str:
    return (
        f"Context views ({angles['scenes']} scored scenes): target to context {_range(angles['target_context'])}, "
        f"between the contexts {_range(angles['between_contexts'])}; scenes per capture "
        f"{angles['scenes_per_capture']}."
    )


def _capture_lines(description: dict | None, sfm: dict) -> list[str]:
    """Per capture: its scored scenes and their angles (none for a capture that only trains), and its
    SfM points where a row used them."""
    if not description:
        return []
    lines = [
        "| capture | scored scenes | test every | target to context | between contexts | SfM points | median "
        "reprojection (px) | mean track length |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in [*description["captures"], *(n for n in sfm if n not in description["captures"])]:
        facts, points = description["captures"].get(name, {}), sfm.get(name, {})
        angles = facts.get("angles", {})
        spans = [_range(angles[k]) if angles.get("scenes") else "—" for k in ("target_context", "between_contexts")]
        numbers = [points.get(k) for k in ("points", "median_reprojection_px", "mean_track_length")]
        numbers_text = " | ".join("—" if x is None else f"{x:.3g}" if isinstance(x, float) else str(x) for x in numbers)
        lines.append(
            f"| {name} | {facts.get('scenes', 0)} | {facts.get('test_every', '—')} | {spans[0]} | {spans[1]} | "
            f"{numbers_text} |"
        )
    return lines + [""]


def markdown(report: dict) -> str:
    angles = report["context_angles"]
    captures = ", ".join(f"`{name}`" for name in sorted(report["captures"]))
    lines = [
        f"## {report['title']}",
        "",
        f"Command: `{report['command']}`  ",
        f"Commit: `{describe(report['provenance'])}`; generated {report['generated']}.  ",
        f"Captures {captures}; protocol `{report['protocol']}`"
        + (f" (held out: {', '.join(report['held_out'])})" if report["held_out"] else "")
        + f"; scored on the **{report['split']}** split"
        + f" (every {report['test_every']}th view unless the table below says otherwise)"
        + f"; seeds {report['seeds']}; the `full` budget's tiny model at "
        + f"{', '.join(map(str, report['steps']))} steps.  ",
        f"Δ: {METHOD}; **bold** where it excludes zero. "
        "Per-capture columns: mean PSNR over seeds and the capture's scenes.",
        "",
    ]
    if angles:
        lines += [_angles_line(angles), ""]
    lines += _capture_lines(report.get("data"), report.get("sfm") or {})
    if any("background composite" in row["row"] for rows in report["budgets"].values() for row in rows):
        lines += [
            "Rows with `background composite` are scored against composited targets (the object over a plain "
            "colour): their PSNR is of other images than the photo rows', and the plain background is easy to "
            "predict.",
            "",
        ]
    if report["missing_cells"]:
        lines += [f"Not finished (left out below): {'; '.join(report['missing_cells'])}.", ""]
    for steps, rows in report["budgets"].items():
        lines += _budget_table(report, steps, rows)
    if any(row["trained_at"] for rows in report["budgets"].values() for row in rows):
        lines += ["‡ trained by an earlier code version (reused with `--allow-stale`).", ""]
    if "budget" in report:
        lines += budget_lines(report["budget"])
    return "\n".join(lines)
