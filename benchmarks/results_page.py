"""The generated tables of docs/results.md: which encoding to use with what inputs, and the planned comparisons.

Every number is computed from committed cells (``benchmarks/results/<experiment>/cells.jsonl``,
nvs_store.py): a row is ``(experiment, dataset, row label)``, its PSNR the mean ± std over its
seeds, and a difference between two rows of one experiment is paired by seed and scene with the
crossed bootstrap (intervals.py). The tables replace the text between ``<!-- results_page: NAME -->``
and ``<!-- /results_page -->`` in docs/results.md; everything else on the page is prose.

    python benchmarks/results_page.py           # rewrite the tables of docs/results.md
    python benchmarks/results_page.py --check   # exit 1 when they differ from the committed cells
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from intervals import crossed_bootstrap  # noqa: E402
from nvs_store import CELLS_NAME, CellStore  # noqa: E402

from hrope.nvs.atomic import write_text  # noqa: E402

__all__ = ["Ref", "CHOICES", "PLANNED", "planned_ref", "row_records", "tables", "render_page", "main"]

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
    text = f"{result['mean']:+.2f} [{result['low']:+.2f}, {result['high']:+.2f}]"
    return (f"**{text}**" if result["excludes_zero"] else text), len(seeds)


PLANNED_EXPERIMENTS = {"room": "planned", "object": "planned_object"}

# Which encoding with what inputs: (inputs, row, its prope of the same experiment), per dataset.
PROPE = "prope"
CHOICES: tuple[tuple[str, dict[str, tuple[Ref, Ref]]], ...] = tuple(
    (inputs, {dataset: (Ref(exp, row, name), Ref(exp, PROPE, PROPE)) for dataset, exp in where.items()})
    for inputs, row, name, where in (
        ("posed images", "prope", "`prope`", {"room": "query_frame_object", "object": "query_frame_object"}),
        (
            "posed images",
            "prope (rays world)",
            "`prope`, world rays",
            {"room": "query_frame_ablation", "object": "object_world_rays"},
        ),
        ("posed images", "urope", "`urope`", {"room": "query_frame_object", "object": "query_frame_object"}),
        (
            "posed images",
            "worldrope",
            "`worldrope` (learned depth)",
            {"room": "query_frame_object", "object": "query_frame_object"},
        ),
        (
            "posed images + context depth",
            "hrope-lift (external, targets transfer, max_inverse_distance 2.0, rays world)",
            "`hrope-lift`, world rays",
            {"room": "near_camera_planes", "object": "near_camera_planes"},
        ),
        (
            "posed images + context depth",
            "hrope-lift (external, targets transfer, max_inverse_distance 2.0)",
            "`hrope-lift`, camera rays",
            {"room": "near_camera_planes", "object": "near_camera_planes"},
        ),
        (
            "posed images + context depth",
            "prope (external, targets transfer, rays world, additive hrope-lift)",
            "`prope` + the same planes added to the tokens, world rays",
            PLANNED_EXPERIMENTS,
        ),
        (
            "posed images + context depth",
            "worldrope (external, targets transfer, footprint False)",
            "`urope` anchored at each token's depth",
            PLANNED_EXPERIMENTS,
        ),
        (
            "posed images + context depth",
            "worldrope (external, targets transfer)",
            "`worldrope` with that depth",
            PLANNED_EXPERIMENTS,
        ),
    )
)

# The planned comparisons (named in docs/results.md before their runs): a - b, paired by seed and
# scene. Rows of the `planned` set (benchmarks/plane_evidence.py) where it trained them; the same
# configurations already committed elsewhere are read from there (every experiment of the `full`
# budget trains on the same scenes with the same seeds and scores the same held-out scenes).
LIFT = "hrope-lift (external, targets transfer, max_inverse_distance 2.0, rays world)"
_ROWS: dict[str, tuple[str, dict[str, tuple[str, str]]]] = {
    "lift": (
        "hrope-lift + context depth",
        {"room": ("near_camera_planes", LIFT), "object": ("near_camera_planes", LIFT)},
    ),
    "world": (
        "prope, world rays",
        {"room": ("query_frame_ablation", "prope (rays world)"), "object": ("object_world_rays", "prope (rays world)")},
    ),
    "additive": (
        "prope + the same planes added",
        {dataset: (experiment, "prope (external, targets transfer, rays world, additive hrope-lift)")
         for dataset, experiment in PLANNED_EXPERIMENTS.items()},
    ),
    "urope": ("urope (no depth)", {"room": ("query_frame_object", "urope"), "object": ("query_frame_object", "urope")}),
    "anchored": (
        "urope at the token's depth",
        {dataset: (experiment, "worldrope (external, targets transfer, footprint False)")
         for dataset, experiment in PLANNED_EXPERIMENTS.items()},
    ),
}  # fmt: skip
PLANNED: tuple[tuple[str, str, str], ...] = (
    ("P1", "lift", "world"),
    ("P2", "lift", "additive"),
    ("P3", "additive", "world"),
    ("P4", "lift", "urope"),
    ("P5", "anchored", "urope"),
    ("P6", "lift", "anchored"),
)


def planned_ref(key: str, dataset: str) -> Ref:
    name, where = _ROWS[key]
    experiment, row = where[dataset]
    return Ref(experiment, row, name)


DATASETS = ("room", "object")


def _choices_table() -> list[str]:
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
            records = row_records(ref, dataset)
            delta = "—" if ref.row == PROPE else _delta(records, row_records(prope, dataset))[0]
            cells += [_psnr(records), delta]
            if records:
                seeds.add(len(records))
        experiments = sorted({ref.experiment for ref, _ in where.values()})
        links = ", ".join(f"`{e}`" for e in experiments)
        count = "/".join(str(n) for n in sorted(seeds)) or "0"
        lines.append(f"| {inputs} | {name} | {' | '.join(cells)} | {count} | {links} |")
    return lines


def _planned_table() -> list[str]:
    lines = ["| # | comparison (a − b) | dataset | Δ PSNR [95% CI] | seeds | cells |", "|---|---|---|---|---|---|"]
    for label, first, second in PLANNED:
        for dataset in DATASETS:
            a, b = planned_ref(first, dataset), planned_ref(second, dataset)
            delta, seeds = _delta(row_records(a, dataset), row_records(b, dataset))
            cells = ", ".join(f"`{e}`" for e in sorted({a.experiment, b.experiment}))
            lines.append(f"| {label} | {a.name} − {b.name} | {dataset} | {delta} | {seeds} | {cells} |")
    return lines


def tables() -> dict[str, str]:
    """The generated blocks by name."""
    return {"choices": "\n".join(_choices_table()) + "\n", "planned": "\n".join(_planned_table()) + "\n"}


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
            print(f"{page}: generated tables are out of date; run python benchmarks/results_page.py", file=sys.stderr)
            return 1
        return 0
    write_text(page, rendered)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
