"""The real-capture parts of docs/results.md (experiments/results_page.py): the planned set's columns
of the "which encoding" table, its rows' differences, and the learning curve's budget.

The cells are those experiments/real_captures.py writes with ``--out benchmarks/results/real_captures/<dir>``
(``planned_pretrained``: ``--set planned``, every row pre-trained on the synthetic ``object`` scenes as
the validation split chose, test split, scored once; ``planned``: the same set ``--from-scratch``;
``curve``: validation split), read like every cell of the page (results_cells.py). A row is an arm
of the set (real_captures_sets.py: a model row and the geometry its context views carry; its cells'
dataset is the arm's data name) at one budget; a difference to another arm of the same set pairs
seeds and scenes, with the hierarchical interval (captures, scenes within captures and seeds
resampled). An arm without committed cells reads "pending".
"""

from __future__ import annotations

from collections import Counter

from .real_captures_report import budget_lines, supported_budget
from .real_captures_sets import PROPE, SETS, Arm, from_scratch
from .report import stat
from .results_cells import Ref, Used, cells, clustered_delta, commits, interval_text, psnr_text, row_records, use

__all__ = [
    "PLANNED",
    "SCRATCH",
    "CURVE",
    "PENDING",
    "ARMS",
    "SCRATCH_ARMS",
    "planned_steps",
    "arm_records",
    "planned_delta",
    "columns",
    "note",
    "pretraining_table",
    "curve_table",
]

PLANNED, SCRATCH, CURVE = "real_captures/planned_pretrained", "real_captures/planned", "real_captures/curve"
PENDING = "pending"

# The "which encoding" table's row keys (results_page.PLANNED_ROWS' keys and "learned"), in the order
# of the planned real set's arms: the same model on the real captures' geometry (SfM depth).
KEYS = ("prope", "world", "urope", "anchored", "lift", "uv-camera", "learned", "rayknown")
ARMS: dict[str, Arm] = dict(zip(KEYS, SETS["planned"].arms, strict=True))  # pre-trained
SCRATCH_ARMS: dict[str, Arm] = dict(zip(KEYS, from_scratch(SETS["planned"]).arms, strict=True))


def _budgets(experiment: str) -> list[int]:
    """The budgets (training steps) of an experiment's committed cells, ascending."""
    return sorted({record["steps"] for record in cells(experiment)})


def planned_steps(experiment: str = PLANNED) -> int | None:
    """The budget the page reports of a planned set's cells: the largest they hold (None: no cells)."""
    return max(_budgets(experiment), default=None)


def _ref(arm: Arm, experiment: str) -> Ref:
    return Ref(experiment, arm.row.label, arm.label)


def arm_records(arm: Arm, experiment: str, steps: int, used: Used) -> dict[int, dict]:
    """``{seed: record}`` of the arm's cells at ``steps`` (noted in ``used``)."""
    return use(used, _ref(arm, experiment), row_records(_ref(arm, experiment), arm.data.name, steps))


def planned_delta(first: str, second: str, used: Used, *, scratch: bool = False) -> tuple[str, int]:
    """The paired difference of two planned arms (keys of :data:`ARMS`) on the real captures, as text,
    and its seed count; ``scratch``: of the rows trained from scratch. "pending" before the cells exist."""
    experiment, arms = (SCRATCH, SCRATCH_ARMS) if scratch else (PLANNED, ARMS)
    steps = planned_steps(experiment)
    if steps is None:
        return PENDING, 0
    result = clustered_delta(*(arm_records(arms[key], experiment, steps, used) for key in (first, second)))
    return (PENDING, 0) if result is None else (interval_text(result), result["seeds"])


def columns(key: str | None, used: Used) -> tuple[list[str], int]:
    """The real columns of one "which encoding" row, ``[PSNR, Δ vs prope]`` (pre-trained rows), and its
    seed count: "—" for a row the planned set lacks (``key`` None or unknown), "pending" before its cells exist."""
    if key not in ARMS:
        return ["—", "—"], 0
    steps = planned_steps()
    if steps is None:
        return [PENDING, PENDING], 0
    records = arm_records(ARMS[key], PLANNED, steps, used)
    delta = "—" if key == "prope" else planned_delta(key, "prope", used)[0]
    return [psnr_text(records, PENDING), delta], len(records)


def pretraining_table() -> str:
    """What the synthetic pre-training changes: each planned row's PSNR pre-trained and from scratch,
    and their paired difference (same seeds and scenes; the hierarchical interval)."""
    steps, scratch_steps = planned_steps(), planned_steps(SCRATCH)
    if steps is None or scratch_steps is None:
        return f"Pending: the cells of `{PLANNED}` and `{SCRATCH}` are not both committed yet.\n"
    used: Used = {}
    lines = [
        "| row | pre-trained PSNR ↑ | from scratch PSNR ↑ | pre-trained − from scratch [95% CI] | seeds |",
        "|---|---|---|---|---|",
    ]
    for key in KEYS:
        started = arm_records(ARMS[key], PLANNED, steps, used)
        scratch = arm_records(SCRATCH_ARMS[key], SCRATCH, scratch_steps, used)
        delta = clustered_delta(started, scratch)
        text, count = (PENDING, 0) if delta is None else (interval_text(delta), delta["seeds"])
        psnr = f"{psnr_text(started, PENDING)} | {psnr_text(scratch, PENDING)}"
        lines.append(f"| {SCRATCH_ARMS[key].label} | {psnr} | {text} | {count} |")
    return "\n".join(lines + ["", commits(used), ""])


DEPTH = (
    'On the real captures "context depth" is the sparse depth of the SfM points triangulated from the '
    "training views only (fixed known poses; no test view is triangulated), fitted with one plane per "
    "patch by the robust fit (`fit: robust`)."
)
HIERARCHICAL = (
    "the hierarchical interval (seeds, captures and scenes within captures resampled, widened for few captures)"
)


def _scenes(record: dict) -> str:
    """What a record's scored scenes are: their split, count, captures and protocol."""
    data = record["data"]
    captures = {name: facts for name, facts in data["captures"].items() if facts["scenes"]}
    every = Counter(facts["test_every"] for facts in captures.values()).most_common(1)[0][0]
    others = "".join(f", `{n}` % {f['test_every']}" for n, f in captures.items() if f["test_every"] != every)
    protocol = (
        f"held-out views (test targets: the views with index % {every} == 0{others}; validation targets: "
        f"index % {every} == {every // 2}; no training scene uses either, as target or context)"
        if data["protocol"] == "views"
        else f"held-out captures ({', '.join(data['held_out'])} test only)"
    )
    split = "test" if data["split"] == "eval" else "validation"
    names = ", ".join(f"`{name}` ({facts['scenes']})" for name, facts in captures.items())
    return (
        f"{len(record['scene_captures'])} {split} scenes of 2 context views and 1 target from "
        f"{len(captures)} captures, {names}; protocol {protocol}"
    )


def note() -> str:
    """The sentence under the table: which real captures, protocol and budget the real columns are."""
    steps = planned_steps()
    if steps is None:
        return f"Real captures (`{PLANNED}`): pending, its cells are not committed yet. {DEPTH}"
    record = next(r for r in cells(PLANNED) if r["steps"] == steps)
    return (
        f"Real captures (`{PLANNED}`, {steps} steps, every row pre-trained on the synthetic `object` scenes "
        f"(its own model, the `full` budget, the same seed), scored once): {_scenes(record)}. {DEPTH}"
    )


def curve_table() -> str:
    """The learning curve (validation split): each arm's PSNR and Δ vs ``prope`` per budget, and the
    budget the set's rule supports once every arm has cells of the same seeds at every budget."""
    spec, budgets, used = SETS["curve"], _budgets(CURVE), {}
    if not budgets:
        return f"Pending: the learning curve's cells (`{CURVE}`) are not committed yet.\n"
    lines = [
        "| row | "
        + " | ".join(f"{n} steps: PSNR ↑ | {n} steps: Δ vs `prope` [95% CI]" for n in budgets)
        + " | seeds |",
        "|---|" + "---|---|" * len(budgets) + "---|",
    ]
    rows: dict[int, list[dict]] = {n: [] for n in budgets}
    seed_sets = set()  # of every (arm, budget): the decision needs the same seeds everywhere
    for arm in spec.arms:
        texts, seeds = [], set()
        for n in budgets:
            records = arm_records(arm, CURVE, n, used)
            delta = None if arm == PROPE else clustered_delta(records, arm_records(PROPE, CURVE, n, used))
            texts += [
                psnr_text(records, PENDING),
                "—" if arm == PROPE else PENDING if delta is None else interval_text(delta),
            ]
            seeds |= {len(records)} if records else set()
            seed_sets.add(frozenset(records))
            if records:
                psnr = stat([r["metrics"]["psnr"] for r in records.values()])
                rows[n].append({"row": arm.label, "metrics": {"psnr": psnr}, "vs_reference": delta})
        count = "/".join(str(s) for s in sorted(seeds)) or "0"
        lines.append(f"| {arm.label} | {' | '.join(texts)} | {count} |")
    record = next(r for r in cells(CURVE))
    lines += ["", f"Scored on {_scenes(record)}.", "", commits(used), ""]
    if len(seed_sets) > 1 or len(budgets) < 2:
        wait = "The budget decision waits for every row's cells with the same seeds at two budgets or more."
        return "\n".join(lines + [wait, ""])
    return "\n".join(lines + budget_lines({**supported_budget(rows), "planned_hours": {}}))
