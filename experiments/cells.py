"""Training, evaluation and on-disk caching of benchmark cells (``experiments/nvs_table.py``).

A cell (dataset, row, seed) lives in ``<cache>/<dataset>/<row key>/seed<k>-<config hash>/``:
the training run (``checkpoint.safetensors``, ``config.yaml``, ``tb/``) and, once trained and
evaluated, ``metrics.json``. A finished cell is never retrained; a cell killed mid-training
resumes from its last checkpoint (``hrope.nvs.running.train`` resumes exactly). A changed budget,
``nvs_rows.RESULTS_VERSION`` or entry of ``ENCODING_RESULTS_VERSIONS`` for the row's encoding
changes the hash, so such cells are not reused. Fig. 6 results of a cell are cached in
``protocols.json`` next to it, keyed by protocol, options and scene count.

The cache is git-ignored. What the reports need is kept in the experiment's ``cells.jsonl``
(:mod:`nvs_store`, committed): every cell the runner trains or reads, with its Fig. 6 results. A
cell is finished when either holds its record, so a report regenerates from ``cells.jsonl`` alone,
and a Fig. 6 result missing from both retrains the cell's checkpoint first (training is a pure
function of the cell's config).

Code version: ``metrics.json`` and each ``protocols.json`` entry record the provenance of the code
that computed them (:func:`code_provenance`: commit, dirty tree, torch, source fingerprint of
``src/hrope``). A finished cell whose fingerprint differs from the current one (or is missing,
as for cells finished before it was recorded) is *stale*: :class:`CellRunner` refuses it
(:class:`StaleCellsError`) unless ``allow_stale``, and then only reads it (no Fig. 6 result is
computed from a stale cell). A partial checkpoint left by other code (``training.json``, present
while a cell trains, records the code that started it) is discarded and the cell trains from
step 0, so one model never mixes two code versions.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

from hrope.nvs.config import RunConfig
from hrope.nvs.running.atomic import write_json
from hrope.nvs.running.checkpoints import CHECKPOINT_NAME, load_checkpoint
from hrope.nvs.build_data import build_dataset
from hrope.nvs.evaluation.evaluate import evaluate_model
from hrope.nvs.evaluation.metrics import LPIPS
from hrope.nvs.model import count_parameters, encoding_names
from hrope.nvs.evaluation.plane_accuracy import PlaneAccuracy, measures_planes
from hrope.nvs.evaluation.protocols import run_protocol
from hrope.nvs.running.train import train

from . import rows as nvs_rows
from .rows import Budget, Cell, cell_config, cell_settings, config_hash
from .store import CellStore
from hrope.nvs.running.provenance import describe, provenance, source_fingerprint

__all__ = ["CellRunner", "StaleCellsError", "StoppedCellError", "code_provenance", "trained_at"]

METRICS_NAME = "metrics.json"
PROTOCOLS_NAME = "protocols.json"
TRAINING_NAME = "training.json"  # provenance of the code training the cell; removed when training ends


class StaleCellsError(RuntimeError):
    """Cached cells were trained by other code than the current one (pass ``allow_stale``)."""


class StoppedCellError(RuntimeError):
    """A cell's training stopped before its last step (SIGTERM): it keeps its checkpoint, gets no record."""


def code_provenance() -> dict:
    """:func:`provenance.provenance` plus the source fingerprint and ``RESULTS_VERSION``."""
    return {**provenance(), "source_fingerprint": source_fingerprint(), "results_version": nvs_rows.RESULTS_VERSION}


def trained_at(record: dict) -> str:
    """The code version of a cell record in words: ``"commit 1a2b3c4d5e"`` / ``"commit not recorded"``."""
    return "commit " + describe(record.get("provenance"), short=True)


class CellRunner:
    """Trains and evaluates cells of one budget, reusing rendered scenes between cells.

    ``store``: the experiment's ``cells.jsonl`` (its path, or a :class:`nvs_store.CellStore` that
    runners of several budgets share, so that none overwrites the others' cells; None: the cache
    only); it receives every finished cell read or trained and is written by :meth:`save` (also
    after each cell trained). ``max_datasets``: rendered datasets kept in memory (train and eval,
    keyed by (kind, context views, split)); the oldest is dropped beyond it. ``allow_stale``: reuse
    finished cells trained by other code (see the module docstring) instead of refusing them.
    """

    def __init__(
        self,
        budget: Budget,
        cache: Path,
        *,
        store: Path | CellStore | None = None,
        device: str = "cpu",
        threads: int = 1,
        lpips_weights: str | None = None,
        max_datasets: int = 4,
        allow_stale: bool = False,
        split: str = "eval",
    ) -> None:
        self.budget, self.cache, self.device, self.threads = budget, Path(cache), device, threads
        self.store = CellStore(store) if isinstance(store, (str, Path)) else store
        self.lpips_weights, self.max_datasets, self.allow_stale = lpips_weights, max_datasets, allow_stale
        self.split = split
        self.provenance = code_provenance()
        self._lpips = LPIPS(lpips_weights, "alex").to(device) if lpips_weights else None
        self._datasets: dict[tuple, object] = {}
        self.trained: list[Cell] = []  # cells trained (not read from the cache) by this runner

    # ------------------------------------------------------------------ paths and configs
    def data_section(self, cell: Cell) -> dict | None:
        """The run config's data section of ``cell`` when the runner supplies its data itself (real
        captures, stereo windows); None: the budget's synthetic data."""
        return None

    def config(self, cell: Cell, folder: Path) -> RunConfig:
        return cell_config(
            self.budget,
            cell,
            folder,
            device=self.device,
            threads=self.threads,
            lpips_weights=self.lpips_weights,
            split=self.split,
            data=self.data_section(cell),
        )

    def key(self, cell: Cell) -> str:
        """The cell's config hash (its cache key, with dataset, row and seed)."""
        return config_hash(cell_settings(self.budget, cell, self.lpips_weights, self.split))

    def cell_id(self, cell: Cell) -> str:
        """``<dataset>/<row key>/seed<k>-<config hash>``: the cell's folder under the cache and its store id."""
        return f"{cell.dataset}/{cell.row.key}/seed{cell.seed}-{self.key(cell)}"

    def folder(self, cell: Cell) -> Path:
        return self.cache / self.cell_id(cell)

    def cached(self, cell: Cell) -> dict | None:
        """The cell's metrics when it has finished (in the cache, else in the store), else ``None``."""
        path = self.folder(cell) / METRICS_NAME
        if not path.is_file():
            return self.store.record(self.cell_id(cell)) if self.store is not None else None
        record = json.loads(path.read_text())
        if self.store is not None:
            self.store.put(self.cell_id(cell), record)
        return record

    def save(self) -> None:
        """Write the store (when there is one and it changed)."""
        if self.store is not None:
            self.store.save()

    def is_stale(self, record: dict) -> bool:
        """Whether a cell record was computed by other code (its fingerprint differs or is missing)."""
        return (record.get("provenance") or {}).get("source_fingerprint") != self.provenance["source_fingerprint"]

    def stale(self, cells) -> list[tuple[Cell, dict]]:
        """The finished cells of ``cells`` trained by other code, with their records."""
        return [(cell, record) for cell in cells if (record := self.cached(cell)) is not None and self.is_stale(record)]

    def check_stale(self, cells, *, log=print) -> list[tuple[Cell, dict]]:
        """:meth:`stale` of ``cells``; raises :class:`StaleCellsError` (one line) unless ``allow_stale``,
        else logs a warning."""
        stale = self.stale(cells)
        if not stale:
            return stale
        finished = sum(self.cached(cell) is not None for cell in cells)
        versions = ", ".join(
            f"{version}: {n}" for version, n in sorted(Counter(trained_at(record) for _, record in stale).items())
        )
        what = (
            f"{len(stale)} of {finished} finished cells under {self.cache} were trained on an earlier code "
            f"version ({versions}; current source fingerprint {self.provenance['source_fingerprint']})"
        )
        if not self.allow_stale:
            raise StaleCellsError(
                f"{what}; pass --allow-stale to reuse them (marked in the report), or retrain them into a fresh "
                f"--out (bump RESULTS_VERSION in experiments/rows.py if the change is meant to alter results)"
            )
        log(f"warning: {what}; reusing them (--allow-stale), marked in the report")
        return stale

    def obsolete(self) -> dict[str, int]:
        """Cached or stored cells of encodings that no longer exist: ``{"<dataset>/<row key>": finished cells}``."""
        known = set(encoding_names())
        finished = {path.parent.relative_to(self.cache).as_posix() for path in self.cache.glob(f"*/*/*/{METRICS_NAME}")}
        finished |= set(self.store.ids() if self.store is not None else ())
        rows = {(row.parent.name, row.name) for row in self.cache.glob("*/*") if row.is_dir()}
        rows |= {tuple(cell.split("/")[:2]) for cell in finished}
        return {
            f"{dataset}/{key}": sum(cell.startswith(f"{dataset}/{key}/") for cell in finished)
            for dataset, key in sorted(rows)
            if key.split(".")[0] not in known
        }

    def data_facts(self, cell: Cell, config: RunConfig) -> dict:
        """Facts about the cell's scored scenes kept in its record (none here; subclasses add theirs)."""
        return {}

    def dataset(self, config: RunConfig, split: str):
        """The rendered (in-memory) dataset of ``config``'s data section, shared by cells."""
        key = (config.data.kind, config.data.num_context, split)
        if key not in self._datasets:
            while len(self._datasets) >= self.max_datasets:
                self._datasets.pop(next(iter(self._datasets)))
            dataset = build_dataset(config, split)
            for index in range(len(dataset)):  # render now, so training time excludes rendering
                dataset[index]
            self._datasets[key] = dataset
        return self._datasets[key]

    # ------------------------------------------------------------------ one cell
    def _train(self, folder: Path, config: RunConfig):
        """``hrope.nvs.running.train`` of the cell, resuming its checkpoint only when the current code started
        it (``training.json``); returns ``(result, start step, seconds)``."""
        checkpoint, marker = folder / CHECKPOINT_NAME, folder / TRAINING_NAME
        if checkpoint.is_file():
            started = json.loads(marker.read_text()) if marker.is_file() else {}
            if started.get("source_fingerprint") != self.provenance["source_fingerprint"]:
                checkpoint.unlink()  # partial run of other code (or of unknown code): start again
        if not checkpoint.is_file():
            folder.mkdir(parents=True, exist_ok=True)
            write_json(marker, self.provenance)
        start = load_checkpoint(checkpoint)["step"] if checkpoint.is_file() else 0
        dataset = self.dataset(config, "train")
        tick = time.perf_counter()
        result = train(config, progress=False, dataset=dataset)
        seconds = time.perf_counter() - tick
        marker.unlink(missing_ok=True)
        return result, start, seconds

    def run(self, cell: Cell) -> dict:
        """Train (or resume) and evaluate ``cell``; returns its metrics dict (cached on disk).

        A finished stale cell is returned as it is with ``allow_stale``, else refused."""
        done = self.cached(cell)
        if done is not None:
            if self.is_stale(done) and not self.allow_stale:
                self.check_stale([cell])  # raises
            return done
        folder = self.folder(cell)
        config = self.config(cell, folder)
        result, start, seconds = self._train(folder, config)
        if result.step < config.train.steps:
            raise StoppedCellError(
                f"{self.cell_id(cell)}: training stopped at step {result.step} of {config.train.steps}; "
                "its checkpoint is kept and the same command resumes it"
            )
        trained = result.step - start
        self.trained.append(cell)
        model = result.model.eval()
        planes = PlaneAccuracy() if measures_planes(model) else None
        metrics, per_scene, _ = evaluate_model(
            model,
            self.dataset(config, self.split),
            config.data.num_context,
            batch_size=config.eval.batch_size,
            lpips=self._lpips,
            device=self.device,
            planes=planes,
        )
        record = {
            "dataset": cell.dataset,
            "row": cell.row.label,
            "encoding": cell.row.encoding,
            "predictor": cell.row.predictor,
            "num_context": cell.row.num_context,
            "seed": cell.seed,
            "config_hash": self.key(cell),
            "results_version": nvs_rows.results_version(
                cell_settings(self.budget, cell, self.lpips_weights, self.split)
            ),
            "steps": result.step,
            "skipped_steps": result.skipped_steps,
            "final_loss": result.last_loss,
            "parameters": count_parameters(model)["trainable"],
            # Seconds for all `steps`, extrapolated from this session when the run was resumed.
            "train_seconds": seconds * result.step / trained if trained else None,
            "resumed_from_step": start,
            "eval_scenes": len(self.dataset(config, self.split)),
            "split": self.split,
            "metrics": metrics,
            "per_scene": {name: values for name, values in per_scene.items() if values},
            "planes": planes.means() if planes is not None else None,
            **self.data_facts(cell, config),
            "provenance": self.provenance,
        }
        write_json(folder / METRICS_NAME, record)
        if self.store is not None:
            self.store.put(self.cell_id(cell), record)
        self.save()
        return record

    # ------------------------------------------------------------------ Fig. 6 protocols
    def protocol(self, cell: Cell, protocol: str, *, compute: bool = True, **options) -> dict | None:
        """``hrope.nvs.evaluation.protocols.run_protocol`` on the cell's trained checkpoint (cached per cell,
        with the provenance of the code that computed it). Returns None instead of computing a
        missing result with ``compute=False`` and for a stale cell (its checkpoint would be
        retrained by other code, or be another code's model)."""
        folder = self.folder(cell)
        path = folder / PROTOCOLS_NAME
        stored = self.store.protocols(self.cell_id(cell)) if self.store is not None else {}
        stored.update(json.loads(path.read_text()) if path.is_file() else {})
        key = json.dumps({"protocol": protocol, "scenes": self.budget.protocol_scenes, **options}, sort_keys=True)
        record = self.cached(cell)
        if key not in stored:
            if not compute or record is None or self.is_stale(record):
                return None
            if not (folder / CHECKPOINT_NAME).is_file() or (folder / TRAINING_NAME).is_file():
                # the cache may hold no checkpoint (or none at all): training is a pure function
                # of the cell's config, so retraining restores the same model
                self._train(folder, self.config(cell, folder))
            result = run_protocol(
                str(folder),
                protocol,
                num_scenes=self.budget.protocol_scenes,
                device=self.device,
                lpips_weights=self.lpips_weights,
                **options,
            )
            stored[key] = {**result, "provenance": self.provenance}
            write_json(path, stored)
        if self.store is not None and record is not None:
            self.store.put(self.cell_id(cell), record, stored)
            self.save()
        return stored[key]
