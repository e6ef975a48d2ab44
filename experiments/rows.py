"""Rows, tables and budgets of the NVS comparison benchmark (``experiments/nvs_table.py``).

A *row* is one model variant: an encoding, its parameter source (``learned``, ``external``,
``oracle``) and the number of context views. A *cell* is (dataset, row, seed): one training run
plus its evaluation. Every cell of one budget shares the data, steps, model size, optimiser and
seeds; only the row changes. Tables list rows; a row shared by several tables (e.g. ``hrope``
in Tables 1 and 3 and Fig. 4a) is trained once.

Cells are cached in folders named by :func:`config_hash` of their :func:`cell_settings`, which
includes :data:`RESULTS_VERSION`: bump it in a change that is meant to alter trained results
(an encoding's maths, the model, training or evaluation), so that every cell is retrained in new
folders. The code itself is not part of the key: ``nvs_cells`` records a source fingerprint per
cell and refuses to reuse cells trained by other code unless asked to (``--allow-stale``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from hrope.nvs.config import APE_ENCODINGS, RunConfig, resolve

__all__ = [
    "Row",
    "Table",
    "Budget",
    "BUDGETS",
    "TABLE1_ENCODINGS",
    "ABLATIONS",
    "APE_ABLATIONS",
    "tables",
    "cell_config",
    "cell_settings",
    "config_hash",
    "Cell",
    "RESULTS_VERSION",
    "ENCODING_RESULTS_VERSIONS",
    "results_version",
]

# Bump (by hand) in a change meant to alter trained results; a new version trains every cell again,
# in new cache folders (the old ones stay on disk, unused). Version 0 is not hashed (its cells are
# keyed by their settings alone). 1: the oracle and external sources cap planes next to the camera
# at |m| <= 2 by default (hrope.nvs.config.schema.DEFAULT_MAX_INVERSE_DISTANCE).
RESULTS_VERSION = 1
# A change that alters the results of one encoding only re-keys that encoding's cells: the version
# hashed for them (the larger of the two). cape 2: EscherNet's form; cells of an earlier version ran
# what is now ``cape`` with ``form="transposed"``.
ENCODING_RESULTS_VERSIONS = {"cape": 2}

TABLE1_ENCODINGS = ("none", "gta", "prope", "cape", "rayrope", "urope", "worldrope", "hrope", "hrope-lift")
ABLATIONS = ("hrope-depth", "hrope-so3", "hrope-pf", "hrope-se3", "hrope", "hrope-full")
# Fig. 4a's additive (APE) versions: only of the encodings whose APE version is a distinct model
# (``hrope-pf``'s would embed the same decoded plane vector as ``hrope-ape``).
APE_ABLATIONS = tuple(e for e in ABLATIONS if e in APE_ENCODINGS)
# Table 3's plane sources as (predictor, predictor options): learned; the context views' geometry
# only (external: fitted to the context depth and transferred to the target; oracle: neutral or
# transferred targets), the fair upper bounds; and every view's own geometry ("scope all"), upper
# bounds that use the target view's geometry (no NVS model has it at test time).
PLANE_SOURCES = (
    ("learned", ()),
    ("external", (("targets", "transfer"),)),
    ("oracle", ()),
    ("oracle", (("targets", "transfer"),)),
    ("external", (("scope", "all"),)),
    ("oracle", (("scope", "all"),)),
)
VIEW_COUNTS = (2, 4, 8)


@dataclass(frozen=True)
class Row:
    """One model variant. ``external`` fits planes to the renderer's depth maps (no normals).
    ``options``: ``(key, value)`` pairs of ``model.predictor_options`` (e.g. ``(("targets",
    "transfer"),)``) and ``encoding_options`` of ``model.encoding_options`` (e.g. ``(("anchors",
    (1000.0,)),)``) and ``model_options`` of other model fields (e.g. ``(("rays", "world"),)``) and
    ``train_options`` of the ``train`` section (e.g. ``(("parameter_lr_scale", 10.0),)``); part of the
    label, the folder name and the cache key."""

    encoding: str
    predictor: str = "learned"
    num_context: int = 2
    options: tuple[tuple[str, object], ...] = ()
    encoding_options: tuple[tuple[str, object], ...] = ()
    model_options: tuple[tuple[str, object], ...] = ()
    train_options: tuple[tuple[str, object], ...] = ()

    @property
    def label(self) -> str:
        details = ([] if self.predictor == "learned" else [self.predictor]) + [
            "with target geometry" if (k, v) == ("scope", "all") else f"{k} {v}"
            for k, v in self.options + self.encoding_options + self.model_options + self.train_options
        ]
        text = f"{self.encoding} ({', '.join(details)})" if details else self.encoding
        return text if self.num_context == 2 else f"{text}, {self.num_context} views"

    @property
    def key(self) -> str:
        """Folder name of the row's cells."""
        options = "".join(
            f".{k}-{v}" for k, v in self.options + self.encoding_options + self.model_options + self.train_options
        )
        options = options.replace(" ", "")
        return f"{self.encoding}.{self.predictor}.ctx{self.num_context}{options}"


@dataclass(frozen=True)
class Cell:
    dataset: str
    row: Row
    seed: int


@dataclass(frozen=True)
class Table:
    """``reference(row)``: the row each row is compared with (Δ column), on the same dataset."""

    name: str
    title: str
    rows: tuple[Row, ...]
    datasets: tuple[str, ...]
    reference: Callable[[Row], Row]


@dataclass(frozen=True)
class Budget:
    """Everything shared by all cells. ``model``: LVSM preset + overrides; ``seeds``: training
    seeds (model init and batch order; the scenes and held-out scenes are fixed by ``data_seed``);
    ``train_scenes`` / ``eval_scenes``: None for every scene of data the runner builds itself."""

    name: str
    model: dict
    steps: int
    batch_size: int
    lr: float
    warmup: int
    train_scenes: int | None
    eval_scenes: int | None
    protocol_scenes: int
    seeds: tuple[int, ...] = (0, 1)
    data_seed: int = 0
    ablation_datasets: tuple[str, ...] = ("room",)
    zoom_factors: tuple[float, ...] = (1, 2, 3, 4, 5)

    def as_dict(self) -> dict:
        return asdict(self)


BUDGETS: dict[str, Budget] = {
    # Smoke test: every table, toy models; <= 10 minutes on 2 idle CPU cores.
    "quick": Budget(
        "quick",
        {"preset": "tiny", "image_size": 32, "dim": 64, "layers": 2, "heads": 2},
        steps=150,
        batch_size=4,
        lr=1e-3,
        warmup=10,
        train_scenes=64,
        eval_scenes=16,
        protocol_scenes=8,
    ),
    # The CPU benchmark: the `tiny` LVSM; about 3 hours on 2 idle CPU cores (one torch thread).
    "full": Budget(
        "full",
        {"preset": "tiny"},
        steps=600,
        batch_size=4,
        lr=1e-3,
        warmup=50,
        train_scenes=512,
        eval_scenes=64,
        protocol_scenes=16,
    ),
    # For a GPU (`--device cuda`): the `small` LVSM, longer training, 3 seeds, ablations on both datasets.
    "gpu": Budget(
        "gpu",
        {"preset": "small"},
        steps=20000,
        batch_size=16,
        lr=4e-4,
        warmup=1000,
        train_scenes=10000,
        eval_scenes=256,
        protocol_scenes=128,
        seeds=(0, 1, 2),
        ablation_datasets=("room", "object"),
    ),
    # One GPU session's worth (sized for about 10 minutes of plane_evidence --set gpu on one large GPU,
    # an estimate): the `small` LVSM, one seed.
    "gpu-short": Budget(
        "gpu-short",
        {"preset": "small"},
        steps=2000,
        batch_size=16,
        lr=4e-4,
        warmup=200,
        train_scenes=2000,
        eval_scenes=128,
        protocol_scenes=32,
        seeds=(0,),
    ),
}


def _none_like(row: Row) -> Row:
    return Row("none", num_context=row.num_context)


def _learned_like(row: Row) -> Row:
    return Row(row.encoding, num_context=row.num_context)


def tables(budget: Budget) -> dict[str, Table]:
    """The paper's comparisons at this budget (Fig. 6 evaluates Table 1's checkpoints, see nvs_table)."""
    ablation = tuple(Row(e) for e in ("none", *ABLATIONS)) + tuple(Row(e + "-ape") for e in APE_ABLATIONS)
    return {
        "table1": Table(
            "table1",
            "Table 1 analogue: encodings (learned per-patch parameters)",
            tuple(Row(e) for e in TABLE1_ENCODINGS),
            ("room", "object"),
            _none_like,
        ),
        "table3": Table(
            "table3",
            "Table 3 analogue: plane source (learned; external = fit to rendered depth, "
            "oracle = ground truth, of the context views by default, of every view with scope all = "
            "with target geometry)",
            tuple(Row(e, p, options=o) for e in ("hrope", "hrope-lift") for p, o in PLANE_SOURCES),
            budget.ablation_datasets,
            _learned_like,
        ),
        "fig4a": Table(
            "fig4a",
            "Fig. 4a analogue: per-patch parameterisations, relative vs additive (APE)",
            ablation,
            budget.ablation_datasets,
            lambda row: Row("none"),
        ),
        "table2": Table(
            "table2",
            "Table 2 analogue: number of context views",
            tuple(Row(e, num_context=n) for n in VIEW_COUNTS for e in ("none", "prope", "hrope")),
            budget.ablation_datasets,
            _none_like,
        ),
    }


def cell_settings(budget: Budget, cell: Cell, lpips_weights: str | None = None, split: str = "eval") -> dict:
    """The config values that determine a cell's result (the cache key hashes exactly these;
    library defaults for keys not set here are not part of the key). ``split``: the held-out scenes
    scored, ``eval`` (the test scenes) or ``val`` (validation scenes; set in the key only then, so
    test-scored cells keep their keys)."""
    row = cell.row
    model = {**budget.model, "encoding": row.encoding, "predictor": row.predictor}
    if row.predictor == "external":
        model["predictor_options"] = {"use_normals": False}
    if row.options:
        model["predictor_options"] = {**model.get("predictor_options", {}), **dict(row.options)}
    model.update(dict(row.model_options))
    if row.encoding_options:
        model["encoding_options"] = {k: list(v) if isinstance(v, tuple) else v for k, v in row.encoding_options}
    return {
        "model": model,
        "data": {
            "kind": cell.dataset,
            "num_scenes": budget.train_scenes,
            "num_context": row.num_context,
            "num_target": 1,
            "seed": budget.data_seed,
            "cache": True,
        },
        "train": {
            "steps": budget.steps,
            "batch_size": budget.batch_size,
            "lr": budget.lr,
            "warmup": budget.warmup,
            "seed": cell.seed,
            **dict(row.train_options),
        },
        "eval": {
            "num_scenes": budget.eval_scenes,
            "batch_size": 8,
            "lpips_weights": lpips_weights,
            "num_grid_scenes": 0,
            **({} if split == "eval" else {"split": split}),
        },
    }


def cell_config(
    budget: Budget,
    cell: Cell,
    out: Path,
    *,
    device: str = "cpu",
    threads: int = 1,
    lpips_weights: str | None = None,
    split: str = "eval",
    data: dict | None = None,
) -> RunConfig:
    """The ``hrope.nvs.running.train`` config of one cell (its run folder is ``out``); ``data``:
    a data section replacing the budget's (for data the runner builds itself, e.g. real captures)."""
    values = cell_settings(budget, cell, lpips_weights, split)
    if data is not None:
        values["data"] = data
    values["train"] = {
        **values["train"],
        "out": str(out),
        "device": device,
        "threads": threads,
        "log_every": max(1, budget.steps // 20),
        "image_every": 0,
        "checkpoint_every": max(1, budget.steps // 4),
    }
    return resolve(values)


def results_version(settings: dict) -> int:
    """The results version of a cell's :func:`cell_settings`: :data:`RESULTS_VERSION`, or its
    encoding's entry of :data:`ENCODING_RESULTS_VERSIONS` when that is larger (also over version 0,
    so the committed reports of version 0 find the retrained cells of that encoding)."""
    return max(RESULTS_VERSION, ENCODING_RESULTS_VERSIONS.get(settings["model"]["encoding"], 0))


def config_hash(settings: dict) -> str:
    """Short hash of a cell's :func:`cell_settings` (not paths, device, threads or logging) and of
    its :func:`results_version` (from version 1 on): the cell's cache key."""
    version = results_version(settings)
    if version:
        settings = {**settings, "results_version": version}
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:10]
