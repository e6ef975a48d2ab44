"""The HRoPE paper's novel-view-synthesis comparisons at small scale, on synthetic scenes.

Trains one LVSM per (dataset, row, seed) cell with the same data, steps, model size, optimiser
and seeds; only the encoding and its parameter source change. Tables (see nvs_rows.py):
``table1`` (encodings, learned parameters; room and object scenes), ``table3`` (learned /
external / oracle planes), ``fig4a`` (parameterisations and their APE versions), ``table2``
(2/4/8 context views) and ``fig6`` (zoom, extrapolation, enlarged baseline on the Table 1
checkpoints, no retraining). Every cell trains in ``OUT/cache`` (git-ignored), keyed by a hash of
its config and ``RESULTS_VERSION`` (nvs_rows.py), so an interrupted run continues where it stopped;
each finished cell's record and Fig. 6 results go to ``OUT/cells.jsonl`` (committed, nvs_store.py),
from which ``--report-only`` rebuilds the report without the cache. Each cell records the commit
and source fingerprint of the code that trained it; finished cells trained by other code (another
fingerprint, or none recorded) stop the run with an error unless ``--allow-stale`` (reuse them,
marked in the report). Writes ``OUT/nvs_table.{json,md}`` and one PNG per table.

    python -m experiments.nvs_table --quick                          # smoke run, <= 10 min on 2 CPU cores
    OMP_NUM_THREADS=1 python -m experiments.nvs_table                # full CPU run (~3 h), resumable
    python -m experiments.nvs_table --budget gpu --device cuda       # larger preset for a GPU
    python -m experiments.nvs_table --tables table1,fig6 --rows none,prope,hrope
    python -m experiments.nvs_table --tables table1,fig6 --seeds 0 1 2  # Table 1 with a third seed
    python -m experiments.nvs_table --report-only                    # tables from the finished cells only
    python -m experiments.nvs_table --quick --report-only --allow-stale   # the committed cells (older code)
"""

from __future__ import annotations

import argparse
import logging
import shlex
import sys
import time
import traceback
from collections import Counter
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path


from .cells import CellRunner, StaleCellsError, StoppedCellError, trained_at
from .report import claims, fig6_report, markdown, plots, table_report
from .rows import BUDGETS, Budget, Cell, tables
from .store import CELLS_NAME
from hrope.nvs.running.atomic import write_json, write_text

__all__ = ["run_benchmark", "plan", "main", "TABLE_NAMES", "FIG6_PROTOCOLS"]

TABLE_NAMES = ("table1", "fig6", "table3", "fig4a", "table2")
FIG6_PROTOCOLS = ("zoom", "extrapolate", "baseline")
REPORT_EVERY_S = 300.0  # rewrite the partial report at most this often during a run


def plan(budget: Budget, table_names, row_filter=None):
    """Selected tables and the ordered, de-duplicated cells: Table 1 first, the rest after Fig. 6.

    ``row_filter``: row labels or encoding names to keep (None keeps all). Fig. 6 needs the
    Table 1 cells, so selecting it trains them. Returns ``(tables, first_cells, later_cells)``.
    """
    unknown = set(table_names) - set(TABLE_NAMES)
    if unknown:
        raise SystemExit(f"unknown table(s) {sorted(unknown)}; available: {', '.join(TABLE_NAMES)}")
    keep = (lambda row: True) if not row_filter else (lambda row: row.label in row_filter or row.encoding in row_filter)
    every = {name: replace(table, rows=tuple(filter(keep, table.rows))) for name, table in tables(budget).items()}
    if not any(table.rows for table in every.values()):
        raise SystemExit(f"--rows {sorted(row_filter)} matches no row")
    selected = {name: table for name, table in every.items() if name in table_names}
    seen: set = set()

    def cells_of(table):
        out = []
        for dataset in table.datasets:
            for seed in budget.seeds:
                for row in table.rows:
                    cell = Cell(dataset, row, seed)
                    if cell not in seen:
                        seen.add(cell)
                        out.append(cell)
        return out

    needs_table1 = "table1" in selected or "fig6" in table_names
    first = cells_of(every["table1"]) if needs_table1 else []
    later = [cell for name in ("table3", "fig4a", "table2") if name in selected for cell in cells_of(selected[name])]
    return selected, first, later


def _collect(runner: CellRunner, cells) -> dict:
    """Finished cell records by (dataset, row), each with ``stale`` (and ``trained_at`` when stale)."""
    records: dict = {}
    for cell in cells:
        record = runner.cached(cell)
        if record is not None:
            stale = runner.is_stale(record)
            record = {**record, "stale": stale, **({"trained_at": trained_at(record)} if stale else {})}
            records.setdefault((cell.dataset, cell.row), []).append(record)
    return records


def _run_fig6(runner: CellRunner, cells, *, compute: bool, log) -> dict:
    """Fig. 6 protocol results of the Table 1 cells (``compute=False``: cached results only)."""
    results: dict = {}
    stale_rows, stale_missing = set(), 0
    try:
        for cell in cells:
            record = runner.cached(cell)
            if record is None:
                continue
            stale = runner.is_stale(record)
            for protocol in FIG6_PROTOCOLS:
                options = {"factors": tuple(runner.budget.zoom_factors)} if protocol == "zoom" else {}
                result = runner.protocol(cell, protocol, compute=compute, **options)
                if result is not None:
                    results.setdefault((cell.dataset, cell.row, protocol), []).append(result)
                    if stale:
                        stale_rows.add((cell.dataset, cell.row))
                elif stale and compute:
                    stale_missing += 1
    except Exception as error:  # a failing protocol must not stop the long training run
        log(f"fig6 failed:\n{traceback.format_exc()}")
        return {"status": f"failed: {type(error).__name__}: {error}"}
    out = {"status": "ok", "datasets": fig6_report(results, stale_rows)}
    if stale_missing:
        out["note"] = (
            f"{stale_missing} Fig. 6 result(s) of cells trained on an earlier code version are not cached "
            "and were not computed (stale cells are only read)"
        )
        log(f"fig6: {out['note']}")
    return out


def build_report(
    runner: CellRunner,
    selected: dict,
    cells,
    fig6: dict | None,
    *,
    command: str,
    started: float,
    device: str,
    threads: int,
) -> dict:
    """The report dict (JSON-ready) from the finished cells of ``cells``."""
    records = _collect(runner, cells)
    stale = [r for rs in records.values() for r in rs if r["stale"]]
    report = {
        "command": command,
        "provenance": runner.provenance,
        "budget": runner.budget.as_dict(),
        "generated": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "elapsed_seconds": time.perf_counter() - started,
        "device": device,
        "threads": threads,
        "lpips": "computed with local weights" if runner.lpips_weights else "unavailable (no local LPIPS weights)",
        "progress": {
            "finished": sum(len(v) for v in records.values()),
            "planned": len(cells),
            "trained_this_invocation": len(runner.trained),
        },
        "stale_cells": {
            "count": len(stale),
            "trained_at": dict(sorted(Counter(r["trained_at"] for r in stale).items())),
        },
        "obsolete_cells": runner.obsolete(),
        "tables": {name: table_report(table, records) for name, table in selected.items()},
        "cells": [r for rs in records.values() for r in rs],
    }
    if fig6 is not None:
        report["fig6"] = fig6
    report["claims"] = claims(report)
    return report


def write_report(report: dict, out: Path) -> None:
    """``out/nvs_table.json``, ``out/nvs_table.md`` and the PNG plots."""
    out.mkdir(parents=True, exist_ok=True)
    report["plots"] = plots(report, out)
    write_json(out / "nvs_table.json", report)
    write_text(out / "nvs_table.md", markdown(report))


def _train_cells(runner: CellRunner, batch, cells, *, started: float, log, after_each) -> None:
    """Train the cells of ``batch`` that are not finished yet, logging each one's position in
    ``cells`` and its metrics, and calling ``after_each()`` after each."""
    for cell in batch:
        if runner.cached(cell) is not None:
            continue
        log(
            f"[{cells.index(cell) + 1}/{len(cells)}] {cell.dataset} | {cell.row.label} | seed {cell.seed}: "
            f"training (elapsed {time.perf_counter() - started:.0f} s)"
        )
        record = runner.run(cell)
        seconds = "?" if record["train_seconds"] is None else f"{record['train_seconds']:.0f}"
        log(f"    PSNR {record['metrics']['psnr']:.2f}  SSIM {record['metrics']['ssim']:.3f}  {seconds} s")
        after_each()


class _Reports:
    """The report of a run so far (``now``), rewritten into ``out`` at most every ``REPORT_EVERY_S``
    seconds while cells train (``when_due``); ``fig6`` is set once the Fig. 6 protocols ran."""

    def __init__(self, runner: CellRunner, selected: dict, cells, out: Path, **details):
        self.runner, self.selected, self.cells, self.out, self.details = runner, selected, cells, out, details
        self.fig6: dict | None = None
        self.last_written = time.perf_counter()

    def now(self) -> dict:
        return build_report(self.runner, self.selected, self.cells, self.fig6, **self.details)

    def when_due(self) -> None:
        if time.perf_counter() - self.last_written > REPORT_EVERY_S:
            write_report(self.now(), self.out)
            self.last_written = time.perf_counter()


def run_benchmark(
    budget: Budget,
    out: Path,
    *,
    table_names=TABLE_NAMES,
    row_filter=None,
    device: str = "cpu",
    threads: int = 1,
    lpips_weights: str | None = None,
    report_only: bool = False,
    allow_stale: bool = False,
    command: str = "",
    log=print,
) -> dict:
    """Train/evaluate every planned cell (reusing cached ones) and write the report into ``out``.

    Raises :class:`StaleCellsError` before training anything when finished planned cells were
    trained on an earlier code version, unless ``allow_stale`` (then they are reused and marked)."""
    started = time.perf_counter()
    out = Path(out)
    runner = CellRunner(
        budget,
        out / "cache",
        store=out / CELLS_NAME,
        device=device,
        threads=threads,
        lpips_weights=lpips_weights,
        allow_stale=allow_stale,
    )
    selected, first, later = plan(budget, table_names, row_filter)
    cells = first + later
    runner.check_stale(cells, log=log)
    for folder, count in runner.obsolete().items():
        log(f"note: skipped {count} cached cell(s) in {folder}: the encoding no longer exists")
    reports = _Reports(runner, selected, cells, out, command=command, started=started, device=device, threads=threads)
    if not report_only:
        _train_cells(runner, first, cells, started=started, log=log, after_each=reports.when_due)
    if "fig6" in table_names:
        reports.fig6 = _run_fig6(runner, first, compute=not report_only, log=log)
    if not report_only:
        _train_cells(runner, later, cells, started=started, log=log, after_each=reports.when_due)
    report = reports.now()
    runner.save()
    write_report(report, out)
    log(
        f"done: {report['progress']['finished']}/{len(cells)} cells, {len(runner.trained)} trained now, "
        f"{report['elapsed_seconds']:.0f} s; wrote {out / 'nvs_table.md'}"
    )
    return report


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__
    )
    parser.add_argument("--quick", action="store_true", help="the smoke budget (same as --budget quick)")
    parser.add_argument("--budget", choices=sorted(BUDGETS), default=None, help="default: full (quick with --quick)")
    parser.add_argument("--out", default=None, help="default benchmarks/results/nvs (nvs_<budget> for other budgets)")
    parser.add_argument("--tables", default=",".join(TABLE_NAMES), help=f"comma list of {', '.join(TABLE_NAMES)}")
    parser.add_argument("--rows", default=None, help="comma list of row labels or encoding names to run")
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="training seeds (default: the budget's)")
    parser.add_argument("--device", default="cpu", help="cpu | cuda")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads per run (0 = torch default)")
    parser.add_argument("--lpips-weights", default=None, help="local LPIPS-Alex weights (else LPIPS unavailable)")
    parser.add_argument(
        "--report-only", action="store_true", help="write the report from finished cells; train nothing"
    )
    parser.add_argument(
        "--allow-stale",
        action="store_true",
        help="reuse finished cells trained on an earlier code version (marked in the report) "
        "instead of stopping with an error",
    )
    args = parser.parse_args(argv)
    if args.quick and args.budget not in (None, "quick"):
        parser.error("--quick conflicts with --budget " + args.budget)
    name = "quick" if args.quick else (args.budget or "full")
    out = Path(args.out or ("benchmarks/results/nvs" if name == "full" else f"benchmarks/results/nvs_{name}"))
    logging.basicConfig(level=logging.WARNING)
    try:
        return run_benchmark(
            BUDGETS[name] if args.seeds is None else replace(BUDGETS[name], seeds=tuple(args.seeds)),
            out,
            table_names=[t.strip() for t in args.tables.split(",") if t.strip()],
            row_filter={r.strip() for r in args.rows.split(",")} if args.rows else None,
            device=args.device,
            threads=args.threads,
            lpips_weights=args.lpips_weights,
            report_only=args.report_only,
            allow_stale=args.allow_stale,
            command=shlex.join(["python", "-m", "experiments.nvs_table", *argv]),
            log=lambda text: print(text, flush=True),
        )
    except (StaleCellsError, StoppedCellError) as error:
        raise SystemExit(f"nvs_table.py: error: {error}") from None


if __name__ == "__main__":
    main()
