"""Real captures as the benchmark: the planned rows trained and scored on 3-view scenes of posed captures.

Every capture folder given (any layout the loaders read) is cut into scenes of 2 context views and 1
target (:class:`hrope.nvs.data.real.captures.CaptureScenes`: the contexts are the target's nearest
training views by viewing direction; square centre crops resized to the model's 64 pixels with the
intrinsics carried). Every row of a set gets exactly the same scenes, steps and seeds (the ``full``
budget's tiny model, batch and optimiser, ``--steps`` steps, warmup ``min(50, steps // 10)``); rows
differ only in the model and in the geometry the context views carry (``none``, ``sfm``: the depth
of the SfM points triangulated from the training views, ``priors``: the monocular depth prior
aligned to them, with the prior normals). Target views never carry depth or normals. Options are
chosen on the validation split (every ``test_every``-th view offset by ``test_every // 2``); the test
split (every ``test_every``-th view) is scored once, for the planned sets.

The sets, their rows and the budget rule are written down in :mod:`experiments.real_captures_sets`
(before any run): ``curve`` (validation split: the budget), ``choices`` (validation split: the
background, synthetic pre-training), ``planned`` (test split, scored once), ``priors`` (scan24: SfM
points against the priors against learned planes) and ``held-out`` (test captures named there). The
last three pre-train every row on the synthetic ``object`` scenes, the validation choice;
``--from-scratch`` trains them without.

Each difference is the mean paired PSNR difference (same seed, same scene) with a 95% bootstrap
interval that resamples seeds, captures and scenes within captures
(:func:`experiments.intervals.hierarchical_bootstrap`). Cells train in ``OUT/cache`` (git-ignored;
the decoded views and SfM points are kept in the user's image cache, shared by every set and
shard); their records, with per-scene metrics and the capture of every scene, go to
``OUT/cells.jsonl`` and the report to ``OUT/real_captures.{json,md}``
(:mod:`experiments.real_captures_report`).

    python -m experiments.real_captures --captures ../shared/realdata/{ethiopianHead,maryRose,moldGoldCape} \\
        --out benchmarks/results/real_curve --set curve --steps 600 3000
    python -m experiments.real_captures --captures DIR [DIR ...] --out OUT --set planned --shard 0/2   # worker 1
    python -m experiments.real_captures --captures DIR [DIR ...] --out OUT --set planned --shard 1/2   # worker 2
    python -m experiments.real_captures --captures DIR [DIR ...] --out OUT --set planned --report-only
    python -m experiments.real_captures --captures DIR [DIR ...] --out OUT2 --set planned --from-scratch
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import shutil
import sys
from dataclasses import replace
from functools import cached_property
from pathlib import Path

from hrope.nvs.build_data import build_dataset
from hrope.nvs.config import ConfigError, update_config
from hrope.nvs.data.real.image_cache import default_cache_dir
from hrope.nvs.data.real.loaders import scene_frames
from hrope.nvs.data.real.sfm import triangulate
from hrope.nvs.data.real.view_splits import capture_views
from hrope.nvs.data.scene import SceneError
from hrope.nvs.running.atomic import write_json
from hrope.nvs.running.checkpoints import CHECKPOINT_NAME

from .cells import METRICS_NAME, TRAINING_NAME, CellRunner, StaleCellsError, StoppedCellError, trained_at
from .real_captures_report import write_report
from .real_captures_sets import __doc__ as sets_doc
from .real_captures_sets import SETS, TEST_EVERY_BY_CAPTURE, Arm, CaptureSet, Data, from_scratch, synthetic_row
from .rows import BUDGETS, Budget, Cell, cell_settings, config_hash
from .store import CELLS_NAME, CellStore

__all__ = ["CaptureCellRunner", "fingerprint", "linked_captures", "budget", "shard_cells", "run", "main"]


def fingerprint(folder: Path) -> str:
    """A hash of the capture's cameras as the loaders read them (image names, intrinsics, poses):
    the same for a capture moved elsewhere, different when a camera file changes."""
    digest = hashlib.sha256()
    for frame in scene_frames(folder):
        name = frame.image.name if isinstance(frame.image, Path) else frame.label
        digest.update(
            name.encode() + frame.K.double().numpy().tobytes() + frame.world_to_cam.double().numpy().tobytes()
        )
        digest.update(repr(frame.intrinsics_size).encode())
    return digest.hexdigest()[:16]


class CaptureCellRunner(CellRunner):
    """:class:`experiments.cells.CellRunner` on posed captures (``data.kind: captures``): the captures
    (names and camera fingerprints), the protocol, the split, the data variant and ``test_every`` are
    part of each cell's key. A cell's dataset name is its :attr:`Data.name`; its run config reads the
    captures through ``cache/captures/<hash>/``, a folder of links to them (so ``hrope train`` on the
    cell's ``config.yaml`` builds the same scenes). The datasets are built once per (geometry,
    background, split) and shared by every runner given the same ``datasets`` dict. Cells pre-trained
    on synthetic scenes start from the cell of their :func:`synthetic_row` of the ``full`` budget
    with their seed (trained first when missing, in ``cache/synthetic``). ``trained_in``: the cache
    of another set's run on the same captures (e.g. the curve's): a cell whose training config a
    finished cell there shares, the scored split aside, is not trained again; that cell's final
    checkpoint, trained by the same code, is evaluated on this split (training is a pure function of
    the config: the same model)."""

    def __init__(
        self,
        budget: Budget,
        cache: Path,
        captures: list[Path],
        spec: CaptureSet,
        datasets: dict,
        *,
        trained_in: Path | None = None,
        **options,
    ):
        super().__init__(budget, cache, split=spec.split, **options)
        self.spec, self.datasets, self.trained_in = spec, datasets, trained_in
        self.reused: dict[Cell, str] = {}  # cells evaluated from another split's checkpoint: its cell id
        self.variants = {arm.data.name: arm.data for arm in spec.arms}
        self.fingerprints = {c.name: fingerprint(c) for c in captures}
        if len(self.fingerprints) < len(captures):
            raise SceneError(
                f"--captures: the capture folders must have distinct names, got {[c.name for c in captures]}"
            )
        absent = sorted(set(spec.held_out) - set(self.fingerprints))
        if absent:
            raise SceneError(f"--set {spec.name} tests on the held-out captures {absent}: give them in --captures")
        # with trained_in, its links: the reused cells' configs must read the captures at the same root
        self.root = linked_captures((trained_in or self.cache) / "captures", captures, self.fingerprints)

    @cached_property
    def synthetic(self) -> CellRunner:
        """The runner of the synthetic pre-training cells (the ``full`` budget, in ``cache/synthetic``)."""
        budget = replace(BUDGETS["full"], seeds=self.budget.seeds)
        return CellRunner(budget, self.cache / "synthetic", device=self.device, threads=self.threads)

    def settings(self, data: Data) -> dict:
        """What the cells of ``data`` read beside the budget and the row: their part of the key."""
        section = self.capture_section(data)
        return {
            "captures": [[name, digest] for name, digest in sorted(self.fingerprints.items())],
            **{key: section[key] for key in ("protocol", "held_out", "test_every", "test_every_by_capture")},
            "split": self.split,
            "geometry": data.geometry,
            "background": data.background,
            "pretrain": None if data.pretrain is None else {"kind": data.pretrain, **BUDGETS["full"].as_dict()},
        }

    def key(self, cell: Cell) -> str:
        settings = cell_settings(self.budget, cell, self.lpips_weights, self.split)
        return config_hash({**settings, "real_captures": self.settings(self.variants[cell.dataset])})

    def data_section(self, cell: Cell) -> dict:
        return self.capture_section(self.variants[cell.dataset])

    def capture_section(self, data: Data) -> dict:
        """The run config's data section of the cells of ``data``."""
        return {
            "kind": "captures",
            "root": str(self.root),
            "protocol": self.spec.protocol,
            "held_out": sorted(self.spec.held_out),
            "test_every": self.spec.test_every,
            "test_every_by_capture": {k: v for k, v in TEST_EVERY_BY_CAPTURE.items() if k in self.fingerprints},
            "geometry": data.geometry,
            "background": data.background,
            "num_scenes": None,
            "num_context": 2,
            "num_target": 1,
            "seed": self.budget.data_seed,
            "cache": True,
        }

    def config(self, cell: Cell, folder: Path):
        data = self.variants[cell.dataset]
        config = super().config(cell, folder)
        if data.pretrain is None:
            return config
        synthetic = Cell(data.pretrain, synthetic_row(cell.row), cell.seed)
        self.synthetic.run(synthetic)
        return update_config(config, {"train": {"init_from": str(self.synthetic.folder(synthetic))}})

    def dataset(self, config, split: str):
        """The scenes of ``config``'s captures and data variant for ``split`` (train, val, eval)."""
        key = (config.data.geometry, config.data.background, split)
        if key not in self.datasets:
            self.datasets[key] = build_dataset(config, split)
        return self.datasets[key]

    def twin(self, cell: Cell) -> Path | None:
        """The folder of a finished cell under ``trained_in`` with ``cell``'s training config, trained
        by the current code, for another split; None when there is none."""
        if self.trained_in is None:
            return None
        data = self.variants[cell.dataset]
        for split in {"val", "eval"} - {self.split}:
            captures = {**self.settings(data), "split": split}
            key = config_hash(
                {**cell_settings(self.budget, cell, self.lpips_weights, split), "real_captures": captures}
            )
            folder = self.trained_in / cell.dataset / cell.row.key / f"seed{cell.seed}-{key}"
            if (folder / CHECKPOINT_NAME).is_file() and (folder / METRICS_NAME).is_file():
                record = json.loads((folder / METRICS_NAME).read_text())
                if not self.is_stale(record):
                    return folder
        return None

    def run(self, cell: Cell) -> dict:
        """:meth:`CellRunner.run`, starting from the final checkpoint of the cell's :meth:`twin` when it has one."""
        folder, twin = self.folder(cell), self.twin(cell)
        if self.cached(cell) is None and twin is not None and not (folder / CHECKPOINT_NAME).is_file():
            folder.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(twin / CHECKPOINT_NAME, folder / CHECKPOINT_NAME)
            write_json(folder / TRAINING_NAME, self.provenance)
            self.reused[cell] = twin.relative_to(self.trained_in).as_posix()
        return super().run(cell)

    def data_facts(self, cell: Cell, config) -> dict:
        """The capture of every scored scene (the cluster of the intervals), its context angles, the
        scored split's description (scenes and angles per capture) and, for cells with SfM depth or
        priors, the SfM points' statistics per capture."""
        scenes = self.dataset(config, self.split)
        facts = {
            "scene_captures": [cut.capture for cut in scenes.cuts],
            "context_angles": [list(cut.angles) for cut in scenes.cuts],
            "data": scenes.describe(),
        }
        if cell in self.reused:
            facts["checkpoint_of"] = self.reused[cell]
        if config.data.geometry != "none":
            facts["sfm"] = {name: self.sfm_stats(config, name) for name in sorted(self.fingerprints)}
        return facts

    def sfm_stats(self, config, name: str) -> dict:
        """The statistics of capture ``name``'s SfM points (from the training views its scenes' depth
        comes from, as the dataset triangulated them: read from the SfM cache, by default ``sfm/`` in
        the image cache, as :func:`hrope.nvs.build_data.build_captures` places it)."""
        folder = self.root / name
        frames = scene_frames(folder)
        test_every = config.data.test_every_by_capture.get(name, config.data.test_every)
        views = capture_views(len(frames), name, config.data.protocol, config.data.held_out, test_every)["context"]
        cache = config.data.sfm_cache_dir or Path(config.data.cache_dir or default_cache_dir()) / "sfm"
        return triangulate(frames, views, cache_dir=cache, name=name).stats


def linked_captures(folder: Path, captures: list[Path], fingerprints: dict[str, str]) -> Path:
    """``folder/<hash>/``: one link per capture, named as the capture (a root ``data.kind: captures``
    reads); each link is replaced atomically, so processes sharing the folder may create it together."""
    root = folder / hashlib.sha256(json.dumps(sorted(fingerprints.items())).encode()).hexdigest()[:10]
    root.mkdir(parents=True, exist_ok=True)
    for capture in captures:
        link = root / capture.name
        if link.is_symlink() and link.resolve() == capture.resolve():
            continue
        temporary = root / f".{capture.name}.{os.getpid()}"
        temporary.unlink(missing_ok=True)
        temporary.symlink_to(capture.resolve(), target_is_directory=True)
        os.replace(temporary, link)
    return root


def budget(steps: int, seeds: list[int]) -> Budget:
    """The ``full`` budget at ``steps`` steps (warmup ``min(50, steps // 10)``), every scene of the captures."""
    full = BUDGETS["full"]
    return replace(
        full,
        name=f"real-{steps}",
        steps=steps,
        warmup=min(full.warmup, steps // 10),
        seeds=tuple(seeds),
        train_scenes=None,
        eval_scenes=None,
    )


def shard_cells(cells: list, shard: tuple[int, int] | None) -> list:
    """Every ``count``-th cell from ``index`` (``shard = (index, count)``), or all cells."""
    if shard is None:
        return cells
    index, count = shard
    return cells[index::count]


def run(
    spec: CaptureSet,
    captures: list[Path],
    out: Path,
    *,
    steps: list[int],
    seeds: list[int],
    command: str,
    shard: tuple[int, int] | None = None,
    report_only: bool = False,
    allow_stale: bool = False,
    threads: int = 1,
    device: str = "cpu",
    trained_in: Path | None = None,
    log=print,
) -> dict | None:
    """Train (or read) the set's cells and write the report (module doc); with ``shard``, train only
    that shard's cells into the cache and write nothing else (a last call without it reports);
    ``report_only``: read the finished cells only (the cache or ``OUT/cells.jsonl``), train nothing."""
    datasets: dict = {}
    store = None if shard is not None else CellStore(out / CELLS_NAME)  # one for the runners of every budget
    runners = {
        n: CaptureCellRunner(
            budget(n, seeds),
            out / "cache",
            captures,
            spec,
            datasets,
            store=store,
            threads=threads,
            device=device,
            allow_stale=allow_stale,
            trained_in=trained_in,
        )
        for n in steps
    }
    cells = [(n, arm, Cell(arm.data.name, arm.row, seed)) for n in steps for arm in spec.arms for seed in seeds]
    for runner in runners.values():
        runner.check_stale([cell for n, _, cell in cells if runners[n] is runner], log=log)
    records: dict[tuple[int, Arm], list[dict]] = {}
    stale: dict[tuple[int, Arm], set[str]] = {}
    missing: list[str] = []
    mine = shard_cells(cells, shard)
    for n, arm, cell in cells:
        record = runners[n].cached(cell)
        if record is None and not report_only and (n, arm, cell) in mine:
            log(f"[{mine.index((n, arm, cell)) + 1}/{len(mine)}] {n} steps, {arm.label}, seed {cell.seed}")
            record = runners[n].run(cell)
        if record is None:
            missing.append(f"{n} steps, {arm.label}, seed {cell.seed}")
            continue
        records.setdefault((n, arm), []).append(record)
        stale.setdefault((n, arm), set()).update([trained_at(record)] if runners[n].is_stale(record) else [])
    if shard is not None:
        return None
    for runner in runners.values():
        runner.save()
    first = runners[steps[0]]
    facts = {
        "captures": first.fingerprints,
        "provenance": first.provenance,
        "planned_cells": len(SETS["planned"].arms) * len(seeds),
        "missing": missing,
    }
    stale_labels = {key: sorted(labels) for key, labels in stale.items()}
    return write_report(spec, records, stale_labels, out, steps=steps, seeds=seeds, command=command, facts=facts)


def _shard(text: str) -> tuple[int, int]:
    """``I/N`` (0 <= I < N) as ``(I, N)``."""
    try:
        index, count = (int(part) for part in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shard must be I/N (e.g. 0/2), got {text!r}") from None
    if not 0 <= index < count:
        raise argparse.ArgumentTypeError(f"--shard I/N needs 0 <= I < N, got {text!r}")
    return index, count


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"{__doc__}\n{sets_doc}",
    )
    parser.add_argument("--captures", nargs="+", required=True, metavar="DIR", help="capture folders (any layout)")
    parser.add_argument("--out", required=True, help="folder of cells.jsonl, the report and the cell cache")
    parser.add_argument("--set", choices=list(SETS), default="planned", help="the comparison (module doc)")
    parser.add_argument("--steps", type=int, nargs="+", default=None, help="training steps (default: the set's)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument(
        "--split", choices=("val", "test"), default=None, help="the scored split (default: the set's; module doc)"
    )
    parser.add_argument(
        "--from-scratch", action="store_true", help="train the set's pre-trained rows from scratch (module doc)"
    )
    parser.add_argument("--shard", type=_shard, default=None, metavar="I/N", help="train every N-th cell from I only")
    parser.add_argument("--report-only", action="store_true", help="report the finished cells; train nothing")
    parser.add_argument("--allow-stale", action="store_true", help="reuse cells trained by other code (marked)")
    parser.add_argument(
        "--trained-in",
        type=Path,
        default=None,
        metavar="CACHE",
        help="another run's cell cache (OUT/cache of e.g. the curve): cells trained there with the same config, "
        "the split aside, are evaluated on this split instead of trained again",
    )
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    return parser


def main(argv: list[str] | None = None) -> dict | None:
    argv = sys.argv[1:] if argv is None else argv
    args = _parser().parse_args(argv)
    spec = SETS[args.set]
    if args.from_scratch:
        try:
            spec = from_scratch(spec)
        except ValueError as error:
            raise SystemExit(f"real_captures.py: error: {error}") from None
    if args.split is not None:
        spec = replace(spec, split="eval" if args.split == "test" else "val")
    try:
        return run(
            spec,
            [Path(c) for c in args.captures],
            Path(args.out),
            steps=args.steps or list(spec.steps),
            seeds=args.seeds,
            command=shlex.join(["python", "-m", "experiments.real_captures", *argv]),
            shard=args.shard,
            report_only=args.report_only,
            allow_stale=args.allow_stale,
            threads=args.threads,
            device=args.device,
            trained_in=args.trained_in,
            log=lambda text: print(text, flush=True),
        )
    except (StaleCellsError, StoppedCellError, SceneError, ConfigError) as error:
        raise SystemExit(f"real_captures.py: error: {error}") from None


if __name__ == "__main__":
    main()
