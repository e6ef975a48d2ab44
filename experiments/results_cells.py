"""Committed cells as docs/results.md reads them (experiments/results_page.py): rows, PSNR and differences as text.

A row is ``(experiment, dataset, row label)`` of ``benchmarks/results/<experiment>/cells.jsonl``
(store.py); its PSNR is the mean ± std over its seeds. A difference between two rows of one
experiment is paired by seed and scene: the crossed bootstrap for synthetic scenes, the
hierarchical one (captures resampled too) for scenes cut from real captures (intervals.py).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

from hrope.nvs.running.provenance import describe

from .intervals import crossed_bootstrap, interval_text
from .real_captures_report import difference
from .store import CELLS_NAME, CellStore

__all__ = [
    "RESULTS",
    "Ref",
    "Used",
    "cells",
    "row_records",
    "psnr_text",
    "interval_text",
    "delta_text",
    "clustered_delta",
    "use",
    "commits",
]

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"


@dataclass(frozen=True)
class Ref:
    """One row of one experiment's committed cells; ``name``: how the tables call it."""

    experiment: str
    row: str
    name: str


def cells(experiment: str) -> list[dict]:
    """The finished cell records of an experiment (none when it has no ``cells.jsonl`` yet)."""
    store = CellStore(RESULTS / experiment / CELLS_NAME)
    return [record for cell in store.ids() if (record := store.record(cell)) is not None]


def row_records(ref: Ref, dataset: str, steps: int | None = None) -> dict[int, dict]:
    """``{seed: record}`` of the row on ``dataset`` (empty when not run); one record per seed.
    ``steps``: only the cells trained for that many steps (an experiment holding several budgets)."""
    records: dict[int, dict] = {}
    for record in cells(ref.experiment):
        if record["dataset"] == dataset and record["row"] == ref.row and steps in (None, record.get("steps")):
            if record["seed"] in records:
                raise ValueError(f"{ref.experiment}: two cells of {ref.row!r} on {dataset} with seed {record['seed']}")
            records[record["seed"]] = record
    return records


def psnr_text(records: dict[int, dict], missing: str = "not run") -> str:
    """``22.25 ± 0.35``: mean ± sample std of the records' PSNR over seeds (no spread for one seed)."""
    values = [r["metrics"]["psnr"] for r in records.values()]
    if not values:
        return missing
    spread = f" ± {statistics.stdev(values):.2f}" if len(values) > 1 else ""
    return f"{statistics.fmean(values):.2f}{spread}"


def delta_text(a: dict[int, dict], b: dict[int, dict], missing: str = "not run") -> tuple[str, int]:
    """The crossed-bootstrap difference ``a - b`` over their common seeds, as text, and the seed count."""
    seeds = sorted(set(a) & set(b))
    if not seeds:
        return missing, 0
    result = crossed_bootstrap([a[s]["per_scene"]["psnr"] for s in seeds], [b[s]["per_scene"]["psnr"] for s in seeds])
    return interval_text(result), len(seeds)


def clustered_delta(a: dict[int, dict], b: dict[int, dict]) -> dict | None:
    """The hierarchical-bootstrap difference ``a - b`` of real-capture cells over their common seeds
    (real_captures_report.difference; each record's ``scene_captures`` gives the capture of every
    scored scene, and must be the same in both rows); None without common seeds."""
    seeds = sorted(set(a) & set(b))
    if any(r[s]["scene_captures"] != a[seeds[0]]["scene_captures"] for r in (a, b) for s in seeds):
        raise ValueError(f"{a[seeds[0]]['row']} and {b[seeds[0]]['row']}: their cells scored different scenes")
    return difference([a[s] for s in seeds], [b[s] for s in seeds])


# The cells a table read: experiment -> {(dataset, row, seed, steps): commit}.
Used = dict[str, dict[tuple[str, str, int, int | None], str]]


def use(used: Used, ref: Ref, records: dict[int, dict]) -> dict[int, dict]:
    """``records`` of ``ref``, noted in ``used`` for :func:`commits`."""
    for seed, record in records.items():
        commit = describe(record.get("provenance"), short=True)
        key = (record["dataset"], record["row"], seed, record.get("steps"))
        used.setdefault(ref.experiment, {})[key] = commit
    return records


def commits(used: Used) -> str:
    """``Cells by commit: `exp`: 21 at `c4b395fdf4`, 9 at `65d7cd1960`; ...`` of the cells a table read."""
    parts = []
    for experiment in sorted(used):
        counts: dict[str, int] = {}
        for commit in used[experiment].values():
            counts[commit] = counts.get(commit, 0) + 1
        ordered = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
        parts.append(f"`{experiment}`: " + ", ".join(f"{n} at `{commit}`" for commit, n in ordered))
    return "Cells by commit: " + "; ".join(parts) + "."
