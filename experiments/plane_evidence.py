"""Do HRoPE's planes help? Plane sources compared with ``prope`` on identical data, steps and seeds.

Every row is trained on the same synthetic scenes with the same budget and seeds as ``prope``
(nvs_rows.py budgets) and scored on the same held-out scenes. Cells train in a git-ignored cache
(``--cache``, by default the one of ``plane_evidence``, shared by the sets); the cells a report
uses, with their per-scene metrics, go to ``OUT/cells.jsonl`` (committed, nvs_store.py), from
which ``--report-only`` rebuilds the report without the cache. The report gives each row's paired
difference to ``prope`` (per seed and scene) with the crossed-bootstrap 95% interval
(intervals.crossed_bootstrap), and the accuracy of learned planes against the neutral ones where
the data has ground truth. Rows whose planes use the target views' own geometry are labelled "with
target geometry": no NVS model has that at test time.

    python -m experiments.plane_evidence                              # room, full budget, seeds 0 1 2
    python -m experiments.plane_evidence --datasets room,object --rows hrope-lift "hrope-lift (targets transfer)"
    python -m experiments.plane_evidence --budget quick --seeds 0     # smoke run
"""

from __future__ import annotations

import argparse
import shlex
import sys
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path


from .cells import CellRunner, StaleCellsError, StoppedCellError, trained_at
from .intervals import METHOD, crossed_bootstrap, interval_text
from .report import stat
from .rows import BUDGETS, Cell, Row
from .store import CELLS_NAME
from hrope.nvs.running.provenance import describe
from hrope.nvs.running.atomic import write_json, write_text

__all__ = ["ROWS", "REFERENCE", "NOISE_VARIANTS", "noise_rows", "row_report", "run", "main"]

REFERENCE = Row("prope")
TRANSFER = (("targets", "transfer"),)
ROWS = (
    REFERENCE,
    Row("none"),
    Row("hrope-lift", options=(("targets", "hidden"),)),  # learned: target tokens predict from their hidden states
    Row("hrope-lift", options=(("plane_decoder", "normal-depth"), ("targets", "hidden"))),  # the normal-depth decoder
    Row("hrope-lift", options=TRANSFER),  # learned on the context, transferred to the targets (the default)
    Row("hrope-lift", "external"),  # context depth, targets neutral
    Row("hrope-lift", "external", options=TRANSFER),  # context depth, splatted into the targets
    Row("hrope-lift", "external", options=(("scope", "all"),)),  # every view's depth (an unfair bound)
    Row("hrope-lift", "oracle"),  # context ground truth, targets neutral
    Row("hrope-lift", "oracle", options=TRANSFER),  # context ground truth, transferred
    Row("hrope-lift", "oracle", options=(("scope", "all"),)),  # with target geometry (an unfair bound)
    # the paper's Eq. 5 (camera pose + plane, centroid gauge) with the same plane sources
    Row("hrope", options=TRANSFER),
    Row("hrope", "external", options=TRANSFER),
    # world-frame rays as token input (what lifted prope by +0.4 dB) with context depth transferred
    Row("hrope-lift", "external", options=TRANSFER, model_options=(("rays", "world"),)),
    Row("hrope-lift", options=TRANSFER, model_options=(("rays", "world"),)),
    # the learned source's options on the best learned configuration above: planes per attention
    # head, predicted once (first block) for all layers, plane heads at 10x the learning rate
    Row("hrope-lift", options=TRANSFER + (("per_head", True),), model_options=(("rays", "world"),)),
    Row("hrope-lift", options=TRANSFER + (("per_layer", False),), model_options=(("rays", "world"),)),
    Row(
        "hrope-lift",
        options=TRANSFER,
        model_options=(("rays", "world"),),
        train_options=(("parameter_lr_scale", 10.0),),
    ),
    # why geometry hurts on `object`: planes passing near the camera centre (|m| large) moved out to
    # distance 0.5 or 0.2 (after scene normalisation |m| > 2 for 22% of the object patches, 3% of the
    # room ones; |m| > 5 for 1.2% and 0.03%)
    Row("hrope-lift", "oracle", options=(("scope", "all"), ("max_inverse_distance", 2.0))),
    Row("hrope-lift", "oracle", options=(("scope", "all"), ("max_inverse_distance", 5.0))),
    Row("hrope-lift", "external", options=TRANSFER + (("max_inverse_distance", 2.0),)),
    Row(
        "hrope-lift",
        "external",
        options=TRANSFER + (("max_inverse_distance", 2.0),),
        model_options=(("rays", "world"),),
    ),
)


# Why do the query-frame encodings lead on `room`? urope with its depth anchors (parallax between
# views), with one anchor far away (points at infinity: only the rotation between views moves a
# key's position) and rope2d (the RoPE half alone, the PRoPE family's image-plane part).
QUERY_FRAME_ROWS = (
    Row("urope"),
    Row("urope", encoding_options=(("anchors", (1000.0,)),)),
    Row("rope2d"),
    Row("prope", model_options=(("rays", "world"),)),  # rope2d's token input: does the ray frame explain it?
    Row("rope2d", model_options=(("rays", "camera"),)),
    Row("worldrope"),
)
# The subset for a GPU: the baseline, prope (camera and world rays), the best
# learned HRoPE and the fair oracle (both with world rays, docs/results.md) and urope, at a GPU budget.
WORLD = (("rays", "world"),)
GPU_ROWS = (
    REFERENCE,
    Row("none"),
    Row("prope", model_options=WORLD),
    Row("hrope-lift", options=TRANSFER, model_options=WORLD),
    Row("hrope-lift", "oracle", options=TRANSFER, model_options=WORLD),
    Row("urope"),
)
# The planned comparisons (docs/results.md): every rival given the same depth as HRoPE, the
# context views' depth (``external``) splatted into the target camera, planes capped at the
# default |m| <= 2.
DEPTH = {"predictor": "external", "options": TRANSFER}
PLANNED_ROWS = (
    Row("prope"),
    Row("prope", model_options=WORLD),
    Row("hrope-lift", **DEPTH, model_options=WORLD),  # HRoPE's relative plane transform
    Row("prope", **DEPTH, model_options=WORLD + (("additive", "hrope-lift"),)),  # the same planes in the tokens
    Row("urope"),  # fixed anchors, no depth
    Row("worldrope", **DEPTH, encoding_options=(("footprint", False),)),  # urope anchored at the token's depth
    Row("worldrope", **DEPTH),  # worldrope with that depth instead of its learned head
    Row("rayrope", **DEPTH, encoding_options=(("depth", "known"),)),  # released RGB-D mode: that depth per ray
    Row("hrope-lift-ape", **DEPTH),  # the same planes in the tokens, no relative encoding (world rays)
    Row("hrope-lift-uv", **DEPTH, model_options=WORLD),  # hrope-lift's transform + RoPE on the plane points
    Row("hrope-lift-uv", **DEPTH),  # the same with camera rays, as the urope rows have
)
# The near-camera cap |m| <= c of the geometry sources, chosen on the validation scenes (--split val).
CAP_ROWS = tuple(
    Row("hrope-lift", "external", options=TRANSFER + (("max_inverse_distance", cap),), model_options=WORLD)
    for cap in (2.0, 1.0, 5.0, None)
)
# Depth as users have it (hrope.nvs.sources.user_depth): the planned set's two depth rows with the context
# depth through estimator noise levels 1-3 or cut to SfM-like points, against prope with world rays.
# Level 0 (exact depth) is the planned set's rows themselves.
NOISE_REFERENCE = Row("prope", model_options=WORLD)
NOISE_VARIANTS = {
    "0": (),
    "1": (("depth_noise", 1),),
    "2": (("depth_noise", 2),),
    "3": (("depth_noise", 3),),
    "sparse": (("depth_sparse", 300), ("fit", "robust")),
}


def noise_rows(variant: str) -> tuple[Row, Row, Row, Row]:
    """The depth rows of a depth variant: P1-P3's two (hrope-lift; prope + the additive plane
    embedding, world rays) and the two best planned rows (hrope-lift-uv; urope anchored at the
    token's depth, camera rays)."""
    options = TRANSFER + NOISE_VARIANTS[variant]
    return (
        Row("hrope-lift", "external", options=options, model_options=WORLD),
        Row("prope", "external", options=options, model_options=WORLD + (("additive", "hrope-lift"),)),
        Row("hrope-lift-uv", "external", options=options),
        Row("worldrope", "external", options=options, encoding_options=(("footprint", False),)),
    )


# URoPE as released (layout "head_groups", the port's projection): its group size and depth range
# chosen on the validation scenes against the interleaved form (port default 2-20 units; 0.5-10
# spans the 5-95% depth of the synthetic context views), then the planned rows that use the same
# RoPE half in the head-group layout, scored on the test scenes against the interleaved ones.
HEAD_GROUPS = (("layout", "head_groups"),)
RELEASED_GRID = (Row("urope"),) + tuple(
    Row(
        "urope",
        encoding_options=HEAD_GROUPS
        + (("projection", "released"), ("group_size", g), ("min_depth", lo), ("max_depth", hi)),
    )
    for g in (1, 2)
    for lo, hi in ((2.0, 20.0), (0.5, 10.0))
)
# Chosen on the validation scenes (benchmarks/results/urope_released_grid_val: the best mean of the
# room and object differences): group size 2, depths 2-20. The test set pairs each released row with
# its interleaved twin of the planned set (PLANNED_ROWS 4, 5 and 10) and with prope.
RELEASED_ROWS = (
    PLANNED_ROWS[0],
    RELEASED_GRID[3],
    Row("worldrope", **DEPTH, encoding_options=(("footprint", False),) + HEAD_GROUPS),
    Row("hrope-lift-uv", **DEPTH, encoding_options=HEAD_GROUPS),
    PLANNED_ROWS[4],
    PLANNED_ROWS[5],
    PLANNED_ROWS[10],
)


# CaPE as EscherNet computes it against the transposed form (what `cape` computed in cells of results
# version 0 and 1): the same cells as Table 1's `cape` (run with --cache on the nvs_table cache to reuse them).
CAPE_FORMS = (Row("cape"), Row("cape", encoding_options=(("form", "transposed"),)))


# P1-P3's rows at every variant; the two best rows at a mid-level estimator and at sparse points.
NOISE_ROWS = (NOISE_REFERENCE,) + tuple(
    row for v in NOISE_VARIANTS if v != "0" for row in noise_rows(v)[: 4 if v in ("2", "sparse") else 2]
)
SETS = {
    "planes": ROWS,
    "query-frame": QUERY_FRAME_ROWS,
    "gpu": GPU_ROWS,
    "planned": PLANNED_ROWS,
    "cap": CAP_ROWS,
    "noise": NOISE_ROWS,
    "released-grid": RELEASED_GRID,
    "released": RELEASED_ROWS,
    "cape-forms": CAPE_FORMS,
}
TITLES = {
    "planes": "Do HRoPE's planes help? Plane sources vs `prope`",
    "query-frame": "Why do the query-frame encodings lead on `room`? An ablation vs `prope`",
    "gpu": "The flagship at a larger budget (GPU subset) vs `prope`",
    "planned": "Planned comparisons: HRoPE against rivals given the same depth",
    "cap": "The near-camera cap, chosen on the validation scenes",
    "noise": "Depth as users have it: estimator noise and sparse points vs `prope` with world rays",
    "released-grid": "URoPE as released: group size and depth range on the validation scenes vs the interleaved form",
    "released": "The head-group (released) layout of the RoPE half against the interleaved one, vs `prope`",
    "cape-forms": "CaPE: the transposed form (the earlier `cape`) against EscherNet's",
}
NAMES = {
    "planes": "plane_evidence",
    "query-frame": "query_frame_ablation",
    "gpu": "flagship",
    "planned": "planned",
    "cap": "near_camera_cap",
    "noise": "depth_noise",
    "released-grid": "urope_released_grid",
    "released": "urope_released",
    "cape-forms": "cape_forms",
}
REFERENCES = {
    "planned": PLANNED_ROWS[0],
    "cap": CAP_ROWS[0],
    "noise": NOISE_REFERENCE,
    "released-grid": RELEASED_GRID[0],
    "cape-forms": CAPE_FORMS[0],
}


def uses_target_geometry(row: Row) -> bool:
    return dict(row.options).get("scope") == "all"


def row_report(records: list[dict], reference: list[dict]) -> dict:
    """PSNR stats of one row and its paired bootstrap difference to the reference row."""
    by_seed = {r["seed"]: r for r in reference}
    paired = [(r, by_seed[r["seed"]]) for r in sorted(records, key=lambda r: r["seed"]) if r["seed"] in by_seed]
    out = {"psnr": stat([r["metrics"]["psnr"] for r in records]), "seeds": sorted(r["seed"] for r in records)}
    if paired and all("per_scene" in r for pair in paired for r in pair):
        out["vs_reference"] = crossed_bootstrap(
            [r["per_scene"]["psnr"] for r, _ in paired], [p["per_scene"]["psnr"] for _, p in paired]
        )
    planes = [r["planes"] for r in records if r.get("planes")]
    if planes:
        out["planes"] = {
            group: {metric: stat([p[group][metric] for p in planes]) for metric in planes[0][group]}
            for group in ("context", "target")
        }
    return out


def run(
    budget_name: str,
    datasets: list[str],
    seeds: list[int],
    rows: list[Row],
    out: Path,
    *,
    device: str,
    threads: int,
    report_only: bool,
    allow_stale: bool,
    command: str,
    title: str,
    cache: Path | None = None,
    reference: Row = REFERENCE,
    split: str = "eval",
    log=print,
) -> dict:
    budget = replace(BUDGETS[budget_name], seeds=tuple(seeds))
    runner = CellRunner(
        budget,
        cache or out / "cache",
        store=out / CELLS_NAME,
        device=device,
        threads=threads,
        allow_stale=allow_stale,
        split=split,
    )
    rows = [reference] + [r for r in rows if r != reference]
    cells = [Cell(d, row, s) for d in datasets for row in rows for s in seeds]
    runner.check_stale(cells, log=log)
    records: dict[tuple, list[dict]] = {}
    for index, cell in enumerate(cells):
        record = runner.cached(cell)
        if record is None and not report_only:
            log(f"[{index + 1}/{len(cells)}] {cell.dataset} {cell.row.label} seed {cell.seed}")
            record = runner.run(cell)
        if record is not None:
            records.setdefault((cell.dataset, cell.row), []).append(record)
    report = {
        "title": title,
        "command": command,
        "reference": reference.label,
        "provenance": runner.provenance,
        "budget": budget.as_dict(),
        "seeds": seeds,
        **({} if split == "eval" else {"split": split}),
        "generated": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "datasets": {},
    }
    for dataset in datasets:
        report["datasets"][dataset] = _dataset_rows(runner, records, dataset, rows, reference)
    out.mkdir(parents=True, exist_ok=True)
    runner.save()
    write_json(out / f"{out.name}.json", report)
    write_text(out / f"{out.name}.md", markdown(report))
    return report


def _dataset_rows(runner: CellRunner, records: dict[tuple, list[dict]], dataset: str, rows, reference: Row) -> list:
    """The report rows of one dataset: each finished row with its difference to ``reference``."""
    reference_records = records.get((dataset, reference), [])
    return [
        {
            "row": row.label,
            "target_geometry": uses_target_geometry(row),
            "trained_at": sorted({trained_at(r) for r in records[(dataset, row)] if runner.is_stale(r)}),
            **row_report(records[(dataset, row)], reference_records),
        }
        for row in rows
        if (dataset, row) in records
    ]


def _fmt(value, digits=2) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def _plane_error(planes: dict | None, group: str, metric: str) -> str:
    """A learned-plane error cell: the mean, and in brackets the neutral planes' mean."""
    if not planes:
        return "—"
    value, neutral = planes[group][metric], planes[group][metric + "_neutral"]
    digits = 1 if metric.startswith("normal") else 3
    return f"{_fmt(value['mean'], digits)} ({_fmt(neutral['mean'], digits)})"


def _row_line(row: dict, reference: str) -> str:
    """One row of a dataset's table: PSNR, the paired difference to ``reference`` and plane errors."""
    psnr = row["psnr"]
    spread = f" ± {psnr['std']:.2f}" if psnr and psnr["std"] is not None else ""
    delta = row.get("vs_reference")
    if delta is None or row["row"] == reference:
        delta_text = "—"
    else:
        delta_text = interval_text(delta)
    errors = " | ".join(
        _plane_error(row.get("planes"), group, metric)
        for group in ("target", "context")
        for metric in ("normal_error_deg", "depth_rel_error")
    )
    label = row["row"] + (" †" if row["target_geometry"] else "") + (" ‡" if row["trained_at"] else "")
    return (
        f"| {label} | {_fmt(psnr['mean'] if psnr else None)}{spread} | {delta_text} | {errors} | {len(row['seeds'])} |"
    )


def markdown(report: dict) -> str:
    budget = report["budget"]
    lines = [
        f"## {report['title']}",
        "",
        f"Command: `{report['command']}`  ",
        f"Commit: `{describe(report['provenance'])}`; generated {report['generated']}.  ",
        f"Budget `{budget['name']}`: model {budget['model']}, {budget['steps']} steps of batch {budget['batch_size']}, "
        f"{budget['train_scenes']} training scenes, {budget['eval_scenes']} held-out scenes; "
        f"seeds {report['seeds']}"
        + ("; scored on the **validation** scenes.  " if report.get("split") == "val" else ".  "),
        f"Δ: mean paired PSNR difference to `{report.get('reference', 'prope')}` (same seed, same held-out scene), "
        f"with {METHOD}; **bold** where it excludes zero. † uses the target views' own "
        "geometry (an upper bound no NVS model has at test time). Plane errors (learned planes, last layer, vs the "
        "ground truth; neutral = the planes at zero head output): mean normal angle and relative depth error "
        "(per patch saturated at 1).",
        "",
    ]
    earlier = sorted({c for rows in report["datasets"].values() for row in rows for c in row["trained_at"]})
    if earlier:
        lines += [
            f"‡ some of the row's cells were trained by an earlier code version ({', '.join(earlier)}; reused with "
            "`--allow-stale`), not by the commit above.",
            "",
        ]
    for dataset, rows in report["datasets"].items():
        lines += [
            f"**{dataset}**",
            "",
            f"| row | PSNR ↑ | Δ vs {report.get('reference', 'prope')} [95% CI] | target normal err ° (neutral) "
            "| target depth err (neutral) |"
            " context normal err ° (neutral) | context depth err (neutral) | seeds |",
            "|---|---|---|---|---|---|---|---|",
        ]
        lines += [_row_line(row, report.get("reference", "prope")) for row in rows]
        lines.append("")
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__
    )
    parser.add_argument("--budget", choices=sorted(BUDGETS), default="full")
    parser.add_argument("--datasets", default="room", help="comma list of room, object")
    parser.add_argument("--seeds", default="0,1,2", help="comma list of training seeds")
    parser.add_argument(
        "--set",
        choices=sorted(SETS),
        default="planes",
        help="planes: the plane sources (default); query-frame: why urope leads on room; gpu: "
        "the subset for a larger budget; planned: the planned comparisons (rivals given the same depth); "
        "cap: the near-camera cap grid (score it with --split val); noise: the depth rows with "
        "estimator noise and sparse points (hrope.nvs.sources.user_depth); released-grid: urope's released "
        "layout, group size and depth range (score it with --split val); released: the head-group layout's "
        "rows against their interleaved twins; cape-forms: cape's transposed form against EscherNet's",
    )
    parser.add_argument(
        "--rows",
        nargs="+",
        default=None,
        help="row labels, each one argument (default: all rows); the reference is always included",
    )
    parser.add_argument(
        "--reference",
        default=None,
        help="the row every other row is paired with (a row of any set; default prope, for --set cap the cap 2.0 row)",
    )
    parser.add_argument(
        "--split",
        choices=("eval", "val"),
        default="eval",
        help="held-out scenes scored: eval (the test scenes, for final tables) or val (validation scenes, "
        "for choosing options; output folder suffix _val)",
    )
    parser.add_argument("--out", default=None, help="default benchmarks/results/plane_evidence[_<budget>]")
    parser.add_argument(
        "--cache",
        default=None,
        help="cell cache (default benchmarks/results/plane_evidence[_<budget>]/cache, shared by both sets)",
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--report-only", action="store_true", help="report the finished cells; train nothing")
    parser.add_argument("--allow-stale", action="store_true", help="reuse cells trained by other code (marked)")
    return parser


def _selected_rows(parser: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[list[Row], Row]:
    """The rows of ``--set`` named by ``--rows`` (all by default) and the ``--reference`` row (of any set)."""
    wanted = set(args.rows) if args.rows else None
    choices = SETS[args.set]
    unknown = sorted((wanted or set()) - {r.label for r in choices})
    if unknown:
        parser.error(f"unknown rows {unknown}; rows: {', '.join(r.label for r in choices)}")
    rows = [r for r in choices if wanted is None or r.label in wanted]
    known = {r.label: r for rows_of_set in SETS.values() for r in rows_of_set}
    if args.reference is None:
        return rows, REFERENCES.get(args.set, REFERENCE)
    if args.reference not in known:
        parser.error(f"unknown reference {args.reference!r}; rows: {', '.join(known)}")
    return rows, known[args.reference]


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    parser = _parser()
    args = parser.parse_args(argv)
    rows, reference = _selected_rows(parser, args)
    suffix = ("" if args.budget == "full" else f"_{args.budget}") + ("" if args.split == "eval" else "_val")
    out = Path(args.out or f"benchmarks/results/{NAMES[args.set]}{suffix}")
    cache = Path(args.cache) if args.cache else Path(f"benchmarks/results/plane_evidence{suffix}/cache")
    try:
        return run(
            args.budget,
            [d.strip() for d in args.datasets.split(",")],
            [int(s) for s in args.seeds.split(",")],
            rows,
            out,
            device=args.device,
            threads=args.threads,
            report_only=args.report_only,
            allow_stale=args.allow_stale,
            command=shlex.join(["python", "-m", "experiments.plane_evidence", *argv]),
            title=TITLES[args.set],
            cache=cache,
            reference=reference,
            split=args.split,
            log=lambda text: print(text, flush=True),
        )
    except (StaleCellsError, StoppedCellError) as error:
        raise SystemExit(f"plane_evidence.py: error: {error}") from None


if __name__ == "__main__":
    main()
