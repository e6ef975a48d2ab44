"""The generated tables of docs/results.md: which encoding to use with what inputs, and the planned comparisons.

Every number is computed from committed cells (``benchmarks/results/<experiment>/cells.jsonl``,
nvs_store.py): a row is ``(experiment, dataset, row label)``, its PSNR the mean ± std over its
seeds, and a difference between two rows of one experiment is paired by seed and scene with the
crossed bootstrap (intervals.py). The tables replace the text between ``<!-- results_page: NAME -->``
and ``<!-- /results_page -->`` in docs/results.md; everything else on the page is prose.

    python -m experiments.results_page           # rewrite the tables of docs/results.md
    python -m experiments.results_page --check   # exit 1 when they differ from the committed cells
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path


from . import noise_figure
from .plane_evidence import CAP_ROWS, NOISE_VARIANTS, noise_rows
from .geometry_sweep_report import tables as sweep_tables
from .intervals import crossed_bootstrap
from .store import CELLS_NAME, CellStore
from hrope.nvs.running.provenance import describe

from hrope.nvs.running.atomic import write_text

__all__ = [
    "Ref",
    "CHOICES",
    "PLANNED",
    "PLANNED_ROWS",
    "planned_ref",
    "planned_refs",
    "row_records",
    "tables",
    "render_page",
    "main",
]

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PAGE = ROOT / "docs" / "results.md"
BLOCK = re.compile(r"(<!-- results_page: (\w+) -->\n).*?(<!-- /results_page -->)", re.DOTALL)


@dataclass(frozen=True)
class Ref:
    """One row of one experiment's committed cells; ``name``: how the tables call it."""

    experiment: str
    row: str
    name: str


def _cells(experiment: str) -> list[dict]:
    """The finished cell records of an experiment (none when it has no ``cells.jsonl`` yet)."""
    store = CellStore(RESULTS / experiment / CELLS_NAME)
    return [record for cell in store.ids() if (record := store.record(cell)) is not None]


def row_records(ref: Ref, dataset: str) -> dict[int, dict]:
    """``{seed: record}`` of the row on ``dataset`` (empty when not run); one record per seed."""
    records: dict[int, dict] = {}
    for record in _cells(ref.experiment):
        if record["dataset"] == dataset and record["row"] == ref.row:
            if record["seed"] in records:
                raise ValueError(f"{ref.experiment}: two cells of {ref.row!r} on {dataset} with seed {record['seed']}")
            records[record["seed"]] = record
    return records


def _psnr(records: dict[int, dict]) -> str:
    values = [r["metrics"]["psnr"] for r in records.values()]
    if not values:
        return "not run"
    spread = f" ± {statistics.stdev(values):.2f}" if len(values) > 1 else ""
    return f"{statistics.fmean(values):.2f}{spread}"


def _delta(a: dict[int, dict], b: dict[int, dict]) -> tuple[str, int]:
    """The crossed-bootstrap difference ``a - b`` over their common seeds, as text, and the seed count."""
    seeds = sorted(set(a) & set(b))
    if not seeds:
        return "not run", 0
    result = crossed_bootstrap([a[s]["per_scene"]["psnr"] for s in seeds], [b[s]["per_scene"]["psnr"] for s in seeds])
    return _interval(result), len(seeds)


def _interval(result: dict) -> str:
    """``+0.12 [+0.07, +0.17]`` of a crossed-bootstrap result, bold when it excludes zero."""
    text = f"{result['mean']:+.2f} [{result['low']:+.2f}, {result['high']:+.2f}]"
    return f"**{text}**" if result["excludes_zero"] else text


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


# Which encoding with what inputs: (inputs, {dataset: (row, its prope of the same experiment)}).
# Two rows come from earlier exploratory experiments of the same budget (same scenes and seeds):
# worldrope's learned depth head and hrope-lift with camera rays.
def _older(experiment: str, row: str, name: str) -> dict[str, tuple[Ref, Ref]]:
    prope = Ref(experiment, "prope", "`prope`")
    return {dataset: (Ref(experiment, row, name), prope) for dataset in ("room", "object")}


def _planned_choice(key: str) -> dict[str, tuple[Ref, Ref]]:
    prope = planned_refs("prope")
    return {dataset: (ref, prope[dataset]) for dataset, ref in planned_refs(key).items()}


CHOICES: tuple[tuple[str, dict[str, tuple[Ref, Ref]]], ...] = (
    ("posed images", _planned_choice("prope")),
    ("posed images", _planned_choice("world")),
    ("posed images", _planned_choice("urope")),
    ("posed images", _older("query_frame_object", "worldrope", "`worldrope` (learned depth)")),
    ("posed images + context depth", _planned_choice("lift")),
    (
        "posed images + context depth",
        _older(
            "near_camera_planes",
            "hrope-lift (external, targets transfer, max_inverse_distance 2.0)",
            "`hrope-lift` + context depth, camera rays",
        ),
    ),
    ("posed images + context depth", _planned_choice("additive")),
    ("posed images + context depth", _planned_choice("anchored")),
    ("posed images + context depth", _planned_choice("worldrope")),
    ("posed images + context depth", _planned_choice("rayknown")),
    ("posed images + context depth", _planned_choice("uv")),
    ("posed images + context depth", _planned_choice("uv-camera")),
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


DATASETS = ("room", "object")


# The cells a table read: experiment -> {(dataset, row, seed): commit}.
Used = dict[str, dict[tuple[str, str, int], str]]


def _use(used: Used, ref: Ref, records: dict[int, dict]) -> dict[int, dict]:
    """``records`` of ``ref``, noted in ``used`` for :func:`_commits`."""
    for seed, record in records.items():
        commit = describe(record.get("provenance"), short=True)
        used.setdefault(ref.experiment, {})[(record["dataset"], record["row"], seed)] = commit
    return records


def _commits(used: Used) -> str:
    """``Cells by commit: `exp`: 21 at `c4b395fdf4`, 9 at `65d7cd1960`; ...`` of the cells a table read."""
    parts = []
    for experiment in sorted(used):
        counts: dict[str, int] = {}
        for commit in used[experiment].values():
            counts[commit] = counts.get(commit, 0) + 1
        ordered = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
        parts.append(f"`{experiment}`: " + ", ".join(f"{n} at `{commit}`" for commit, n in ordered))
    return "Cells by commit: " + "; ".join(parts) + "."


def _choices_table() -> list[str]:
    used: Used = {}
    lines = [
        "| inputs | configuration | room PSNR ↑ | room Δ vs `prope` [95% CI] | object PSNR ↑ "
        "| object Δ vs `prope` [95% CI] | seeds | cells |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for inputs, where in CHOICES:
        cells, seeds, name = [], set(), next(iter(where.values()))[0].name
        for dataset in DATASETS:
            if dataset not in where:
                cells += ["not run", "not run"]
                continue
            ref, prope = where[dataset]
            records = _use(used, ref, row_records(ref, dataset))
            delta = "—" if ref == prope else _delta(records, _use(used, prope, row_records(prope, dataset)))[0]
            cells += [_psnr(records), delta]
            if records:
                seeds.add(len(records))
        experiments = sorted({ref.experiment for ref, _ in where.values()})
        links = ", ".join(f"`{e}`" for e in experiments)
        count = "/".join(str(n) for n in sorted(seeds)) or "0"
        lines.append(f"| {inputs} | {name} | {' | '.join(cells)} | {count} | {links} |")
    return lines + ["", _commits(used)]


def _planned_table() -> list[str]:
    used: Used = {}
    lines = ["| # | comparison (a − b) | dataset | Δ PSNR [95% CI] | seeds | cells |", "|---|---|---|---|---|---|"]
    for label, first, second in PLANNED:
        for dataset in DATASETS:
            a, b = planned_ref(first, dataset), planned_ref(second, dataset)
            delta, seeds = _delta(_use(used, a, row_records(a, dataset)), _use(used, b, row_records(b, dataset)))
            cells = ", ".join(f"`{e}`" for e in sorted({a.experiment, b.experiment}))
            lines.append(f"| {label} | {a.name} − {b.name} | {dataset} | {delta} | {seeds} | {cells} |")
    return lines + ["", _commits(used)]


def _noise_table() -> str:
    """The depth-quality table (noise_figure.py) of the ``depth_noise`` cells and the planned ``room``
    cells, then the two best rows paired with each other at every depth they were trained with."""
    folders = [RESULTS / "depth_noise", RESULTS / PLANNED_EXPERIMENTS["room"]]
    lines = ["", "| context depth | hrope-lift-uv − urope at the token's depth [95% CI] | seeds |", "|---|---|---|"]
    for variant in NOISE_VARIANTS:
        experiment = PLANNED_EXPERIMENTS["room"] if variant == "0" else "depth_noise"
        uv, anchored = (Ref(experiment, row.label, "") for row in noise_rows(variant)[2:])
        delta, seeds = _delta(row_records(uv, "room"), row_records(anchored, "room"))
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
            cells += [_psnr(records), "—" if index == 0 else _delta(records, default)[0]]
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
        text = "—" if row["row"] == reference or delta is None else _interval(delta)
        mark = " ‡" if row.get("trained_at") else ""
        lines.append(f"| {row['row']}{mark} | {psnr['mean']:.2f} ± {psnr['std']:.2f} | {text} | {len(row['seeds'])} |")
    lines += ["", "| a − b (same seeds and test windows) | Δ [95% CI] | seeds |", "|---|---|---|"]
    for first, second in REAL_PAIRS:
        a, b = (row_records(Ref("real_stereo", label, ""), "motorcycle") for label in (first, second))
        delta, seeds = _delta(a, b)
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
