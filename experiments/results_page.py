"""The generated tables of docs/results.md: which encoding to use with what inputs, and the planned comparisons.

Every number is computed from committed cells (``benchmarks/results/<experiment>/cells.jsonl``,
store.py; read by results_cells.py): a row is ``(experiment, dataset, row label)``, its PSNR the
mean ± std over its seeds, and a difference between two rows of one experiment is paired by seed
and scene with the crossed bootstrap (intervals.py); on real captures (results_page_real.py: the
real columns of the "which encoding" table, the planned comparisons and the learning curve on them)
with the hierarchical one, which also resamples the captures. The tables replace the text between
``<!-- results_page: NAME -->`` and ``<!-- /results_page -->`` in docs/results.md; everything else on
the page is prose.

    python -m experiments.results_page           # rewrite the tables of docs/results.md
    python -m experiments.results_page --check   # exit 1 when they differ from the committed cells
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path


from . import noise_figure, results_page_real
from .plane_evidence import CAP_ROWS, NOISE_VARIANTS, noise_rows
from .geometry_sweep_report import tables as sweep_tables
from .results_cells import (
    RESULTS,
    Ref,
    Used,
    commits,
    delta_text,
    interval_text,
    psnr_text,
    row_records,
    use,
)
from hrope.nvs.running.provenance import describe

from hrope.nvs.running.atomic import write_text

__all__ = [
    "CHOICES",
    "PLANNED",
    "PLANNED_ROWS",
    "planned_ref",
    "planned_refs",
    "tables",
    "render_page",
    "main",
]

PAGE = Path(__file__).resolve().parents[1] / "docs" / "results.md"
BLOCK = re.compile(r"(<!-- results_page: (\w+) -->\n).*?(<!-- /results_page -->)", re.DOTALL)


DATASETS = ("room", "object")
PLANNED_EXPERIMENTS = {"room": "planned_room", "object": "planned_object"}
PLANNED_EXPERIMENT_NAMES = ", ".join(f"`{e}`" for e in PLANNED_EXPERIMENTS.values())

# The rows of the planned set (experiments/plane_evidence.py ``--set planned``), trained in one run
# per dataset: key -> (the tables' name, row label).
LIFT = "hrope-lift (external, targets transfer, rays world)"
PLANNED_ROWS: dict[str, tuple[str, str]] = {
    "prope": ("`prope`", "prope"),
    "world": ("`prope`, world rays", "prope (rays world)"),
    "urope": ("`urope` (no depth)", "urope"),
    "lift": ("`hrope-lift` + context depth, world rays", LIFT),
    "additive": (
        "`prope` + the same planes added to the tokens, world rays",
        "prope (external, targets transfer, rays world, additive hrope-lift)",
    ),
    "ape": ("the same planes added to the tokens, no relative encoding", "hrope-lift-ape (external, targets transfer)"),
    "anchored": ("`urope` anchored at each token's depth", "worldrope (external, targets transfer, footprint False)"),
    "worldrope": ("`worldrope` with that depth", "worldrope (external, targets transfer)"),
    "rayknown": ("`rayrope` known depth (RGB-D mode)", "rayrope (external, targets transfer, depth known)"),
    "uv": ("`hrope-lift-uv` + context depth, world rays", "hrope-lift-uv (external, targets transfer, rays world)"),
    "uv-camera": ("`hrope-lift-uv` + context depth, camera rays", "hrope-lift-uv (external, targets transfer)"),
}


def planned_refs(key: str) -> dict[str, Ref]:
    """``{dataset: Ref}`` of a planned row."""
    name, row = PLANNED_ROWS[key]
    return {dataset: Ref(experiment, row, name) for dataset, experiment in PLANNED_EXPERIMENTS.items()}


# Which encoding with what inputs: (inputs, key of the real planned set's arm (results_page_real.ARMS)
# or None, {dataset: (row, its prope of the same experiment)}). Three rows come from earlier
# experiments of the same budget (same scenes and seeds): worldrope's learned depth head, HRoPE's
# learned planes and hrope-lift with camera rays.
def _older(experiments: dict[str, str], row: str, name: str) -> dict[str, tuple[Ref, Ref]]:
    """``experiments``: {dataset: experiment}."""
    return {d: (Ref(e, row, name), Ref(e, "prope", "`prope`")) for d, e in experiments.items()}


def _planned_choice(key: str) -> dict[str, tuple[Ref, Ref]]:
    prope = planned_refs("prope")
    return {dataset: (ref, prope[dataset]) for dataset, ref in planned_refs(key).items()}


def _choice(inputs: str, key: str) -> tuple[str, str, dict[str, tuple[Ref, Ref]]]:
    return inputs, key, _planned_choice(key)


DEPTH = "posed images + context depth"
CHOICES: tuple[tuple[str, str | None, dict[str, tuple[Ref, Ref]]], ...] = (
    _choice("posed images", "prope"),
    _choice("posed images", "world"),
    _choice("posed images", "urope"),
    (
        "posed images",
        None,
        _older(dict.fromkeys(DATASETS, "query_frame_object"), "worldrope", "`worldrope` (learned depth)"),
    ),
    (
        "posed images",
        "learned",
        _older(
            {"room": "plane_evidence", "object": "plane_evidence_object"},
            "hrope-lift (targets transfer)",
            "`hrope-lift`, learned planes, camera rays",
        ),
    ),
    _choice(DEPTH, "lift"),
    (
        DEPTH,
        None,
        _older(
            dict.fromkeys(DATASETS, "near_camera_planes"),
            "hrope-lift (external, targets transfer, max_inverse_distance 2.0)",
            "`hrope-lift` + context depth, camera rays",
        ),
    ),
    _choice(DEPTH, "additive"),
    _choice(DEPTH, "anchored"),
    _choice(DEPTH, "worldrope"),
    _choice(DEPTH, "rayknown"),
    _choice(DEPTH, "uv"),
    _choice(DEPTH, "uv-camera"),
)

# The planned comparisons (named in docs/results.md before their runs): a - b, paired by seed and scene.
PLANNED: tuple[tuple[str, str, str], ...] = (
    ("P1", "lift", "world"),
    ("P2", "lift", "additive"),
    ("P3", "additive", "world"),
    ("P4", "lift", "urope"),
    ("P5", "anchored", "urope"),
    ("P6", "lift", "anchored"),
    ("P7", "lift", "rayknown"),
    ("P8", "uv-camera", "anchored"),
    ("P9", "uv", "lift"),
)


def planned_ref(key: str, dataset: str) -> Ref:
    return planned_refs(key)[dataset]


def _choices_table() -> list[str]:
    used: Used = {}
    lines = [
        "| inputs | configuration | room PSNR ↑ | room Δ vs `prope` [95% CI] | object PSNR ↑ "
        "| object Δ vs `prope` [95% CI] | real captures PSNR ↑ | real captures Δ vs `prope` [95% CI] | seeds | cells |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for inputs, key, where in CHOICES:
        cells, seeds, name = [], set(), next(iter(where.values()))[0].name
        for dataset in DATASETS:
            ref, prope = where[dataset]
            records = use(used, ref, row_records(ref, dataset))
            delta = "—" if ref == prope else delta_text(records, use(used, prope, row_records(prope, dataset)))[0]
            cells += [psnr_text(records), delta]
            seeds |= {len(records)} if records else set()
        real, real_seeds = results_page_real.columns(key, used)
        seeds |= {real_seeds} if real_seeds else set()
        experiments = {ref.experiment for ref, _ in where.values()}
        experiments |= {results_page_real.PLANNED} if key in results_page_real.ARMS else set()
        links = ", ".join(f"`{e}`" for e in sorted(experiments))
        count = "/".join(str(n) for n in sorted(seeds)) or "0"
        lines.append(f"| {inputs} | {name} | {' | '.join(cells + real)} | {count} | {links} |")
    real = (
        f"The real Δ pairs the row with `prope` of the same set, with {results_page_real.HIERARCHICAL}; "
        "— : the row is not in the real planned set."
    )
    return lines + ["", f"{results_page_real.note()} {real}", "", commits(used)]


def _planned_table() -> list[str]:
    used: Used = {}
    lines = ["| # | comparison (a − b) | dataset | Δ PSNR [95% CI] | seeds | cells |", "|---|---|---|---|---|---|"]
    for label, first, second in PLANNED:
        for dataset in DATASETS:
            a, b = planned_ref(first, dataset), planned_ref(second, dataset)
            delta, seeds = delta_text(use(used, a, row_records(a, dataset)), use(used, b, row_records(b, dataset)))
            cells = ", ".join(f"`{e}`" for e in sorted({a.experiment, b.experiment}))
            lines.append(f"| {label} | {a.name} − {b.name} | {dataset} | {delta} | {seeds} | {cells} |")
    return lines + ["", commits(used)]


def _real_planned_table() -> str:
    """The planned comparisons whose two rows the real planned set has, on the real captures
    (hierarchical interval) beside the same comparison on the synthetic scenes (crossed interval)."""
    used: Used = {}
    lines = [
        "| # | comparison (a − b), context depth from SfM points on the real captures | real captures Δ PSNR "
        "[95% CI] | seeds | from scratch: real captures Δ [95% CI] | synthetic `room` Δ [95% CI] "
        "| synthetic `object` Δ [95% CI] |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, first, second in PLANNED:
        if first not in results_page_real.ARMS or second not in results_page_real.ARMS:
            continue
        real, seeds = results_page_real.planned_delta(first, second, used)
        scratch, _ = results_page_real.planned_delta(first, second, used, scratch=True)
        synthetic = [
            delta_text(row_records(planned_ref(first, d), d), row_records(planned_ref(second, d), d))[0]
            for d in DATASETS
        ]
        names = f"{planned_ref(first, 'room').name} − {planned_ref(second, 'room').name}"
        lines.append(f"| {label} | {names} | {real} | {seeds} | {scratch} | {' | '.join(synthetic)} |")
    skipped = [label for label, a, b in PLANNED if {a, b} - set(results_page_real.ARMS)]
    lines += [
        "",
        f"Not on the real captures: {', '.join(skipped)} (a row the real planned set does not train). "
        f"Real Δ: paired by seed and scene, with {results_page_real.HIERARCHICAL}; from scratch: the same "
        f"rows without the synthetic pre-training (`{results_page_real.SCRATCH}`, the same scenes, steps and "
        "seeds); synthetic Δ: as in the planned comparisons above.",
        "",
        results_page_real.note(),
    ]
    lines += ["", commits(used)] if used else []
    return "\n".join(lines) + "\n"


def _noise_table() -> str:
    """The depth-quality table (noise_figure.py) of the ``depth_noise`` cells and the planned ``room``
    cells, then the two best rows paired with each other at every depth they were trained with."""
    folders = [RESULTS / "depth_noise", RESULTS / PLANNED_EXPERIMENTS["room"]]
    lines = ["", "| context depth | hrope-lift-uv − urope at the token's depth [95% CI] | seeds |", "|---|---|---|"]
    for variant in NOISE_VARIANTS:
        experiment = PLANNED_EXPERIMENTS["room"] if variant == "0" else "depth_noise"
        uv, anchored = (Ref(experiment, row.label, "") for row in noise_rows(variant)[2:])
        delta, seeds = delta_text(row_records(uv, "room"), row_records(anchored, "room"))
        if seeds:
            lines.append(f"| {NOISE_NAMES.get(variant, f'noise level {variant}')} | {delta} | {seeds} |")
    return noise_figure.markdown(noise_figure.gains(folders), "room") + "\n".join(lines) + "\n"


NOISE_NAMES = {"0": "exact (level 0)", "sparse": "sparse points"}
# The near-camera cap scored on the validation scenes, per dataset.
CAP_EXPERIMENTS = {"room": "near_camera_cap_val", "object": "near_camera_cap_object_val"}


def _cap_table() -> str:
    """Each cap's validation PSNR and its paired difference to the default cap (the first of CAP_ROWS)."""
    lines = [
        "| cap | room validation PSNR ↑ | room Δ vs cap 2 [95% CI] | object validation PSNR ↑ "
        "| object Δ vs cap 2 [95% CI] |",
        "|---|---|---|---|---|",
    ]
    for index, row in enumerate(CAP_ROWS):
        cap = dict(row.options)["max_inverse_distance"]
        name = "uncapped" if cap is None else f"\\|m\\| ≤ {cap:g}" + (" (the default)" if index == 0 else "")
        cells = []
        for dataset, experiment in CAP_EXPERIMENTS.items():
            records = row_records(Ref(experiment, row.label, name), dataset)
            default = row_records(Ref(experiment, CAP_ROWS[0].label, ""), dataset)
            cells += [psnr_text(records), "—" if index == 0 else delta_text(records, default)[0]]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# The real-image check's pairs quoted on the page: P8's, and what each half of it adds on the real pair.
REAL_PAIRS = (
    ("hrope-lift-uv (external, targets transfer)", "worldrope (external, targets transfer, footprint False)"),
    ("worldrope (external, targets transfer, footprint False)", "urope"),
    ("hrope-lift-uv (external, targets transfer)", "hrope-lift (external, targets transfer, rays world)"),
)


def _real_table() -> str:
    """The real-image check's rows (benchmarks/results/real_stereo/real_stereo.json) and its verdict."""
    report = json.loads((RESULTS / "real_stereo" / "real_stereo.json").read_text())
    reference = report["reference"]
    lines = [f"| row | PSNR ↑ | Δ vs `{reference}` [95% CI] | seeds |", "|---|---|---|---|"]
    for row in report["rows"]:
        psnr, delta = row["psnr"], row.get("vs_reference")
        text = "—" if row["row"] == reference or delta is None else interval_text(delta)
        mark = " ‡" if row.get("trained_at") else ""
        lines.append(f"| {row['row']}{mark} | {psnr['mean']:.2f} ± {psnr['std']:.2f} | {text} | {len(row['seeds'])} |")
    lines += ["", "| a − b (same seeds and test windows) | Δ [95% CI] | seeds |", "|---|---|---|"]
    for first, second in REAL_PAIRS:
        a, b = (row_records(Ref("real_stereo", label, ""), "motorcycle") for label in (first, second))
        delta, seeds = delta_text(a, b)
        lines.append(f"| {first} − {second} | {delta} | {seeds} |")
    earlier = sorted({c for row in report["rows"] for c in row.get("trained_at", [])})
    note = f"‡ trained at {', '.join(earlier)}; the others at {describe(report['provenance'], short=True)}.\n\n"
    return "\n".join(lines) + "\n\n" + (note if earlier else "") + report["verdict"] + "\n"


def tables() -> dict[str, str]:
    """The generated blocks by name."""
    return {
        "choices": "\n".join(_choices_table()) + "\n",
        "planned": "\n".join(_planned_table()) + "\n",
        "noise": _noise_table(),
        "cap": _cap_table(),
        "real_planned": _real_planned_table(),
        "real_curve": results_page_real.curve_table(),
        "real_pretraining": results_page_real.pretraining_table(),
        "real": _real_table(),
        "sweep": sweep_tables(json.loads((RESULTS / "geometry_sweep" / "geometry_sweep.json").read_text())),
    }


def render_page(text: str) -> str:
    """``text`` with every generated block replaced (an unknown block name raises)."""
    generated = tables()

    def replace(match: re.Match) -> str:
        name = match.group(2)
        if name not in generated:
            raise ValueError(f"unknown results_page block {name!r}; known: {sorted(generated)}")
        return match.group(1) + generated[name] + match.group(3)

    return BLOCK.sub(replace, text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the page's tables are out of date")
    parser.add_argument("--page", default=str(PAGE))
    args = parser.parse_args(argv)
    page = Path(args.page)
    text = page.read_text()
    rendered = render_page(text)
    if args.check:
        if rendered != text:
            print(f"{page}: generated tables are out of date; run python -m experiments.results_page", file=sys.stderr)
            return 1
        return 0
    write_text(page, rendered)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
