"""Training, evaluation and on-disk caching of benchmark cells (``benchmarks/nvs_table.py``).

A cell (dataset, row, seed) lives in ``<cache>/<dataset>/<row key>/seed<k>-<config hash>/``:
the training run (``checkpoint.safetensors``, ``config.yaml``, ``tb/``) and, once trained and
evaluated, ``metrics.json``. A cell with ``metrics.json`` is never retrained; a cell killed
mid-training resumes from its last checkpoint (``hrope.nvs.train`` resumes exactly). A changed
budget changes the hash, so stale cells are not reused. Fig. 6 results of a cell are cached
in ``protocols.json`` next to it, keyed by protocol, options and scene count.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from hrope.nvs.evaluate import evaluate_model
from hrope.nvs.metrics import LPIPS
from hrope.nvs.model import count_parameters
from hrope.nvs.checkpoints import CHECKPOINT_NAME, load_checkpoint
from hrope.nvs.datasets import build_dataset
from hrope.nvs.train import train

from nvs_rows import Budget, Cell, cell_config, cell_settings, config_hash

__all__ = ["CellRunner", "ProtocolUnavailable"]

METRICS_NAME = "metrics.json"
PROTOCOLS_NAME = "protocols.json"


class ProtocolUnavailable(RuntimeError):
    """``hrope.nvs.protocols`` is missing or not implemented yet."""


def _write_json(path: Path, value) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(value, indent=2))
    temporary.replace(path)


class CellRunner:
    """Trains and evaluates cells of one budget, reusing rendered scenes between cells.

    ``max_datasets``: rendered datasets kept in memory (train and eval, keyed by
    (kind, context views, split)); the oldest is dropped beyond it.
    """

    def __init__(self, budget: Budget, cache: Path, *, device: str = "cpu", threads: int = 1,
                 lpips_weights: str | None = None, max_datasets: int = 4) -> None:
        self.budget, self.cache, self.device, self.threads = budget, Path(cache), device, threads
        self.lpips_weights, self.max_datasets = lpips_weights, max_datasets
        self._lpips = LPIPS(lpips_weights).to(device) if lpips_weights else None
        self._datasets: dict[tuple, object] = {}
        self.trained: list[Cell] = []  # cells trained (not read from the cache) by this runner

    # ------------------------------------------------------------------ paths and configs
    def config(self, cell: Cell, folder: Path) -> dict:
        return cell_config(self.budget, cell, folder, device=self.device, threads=self.threads,
                           lpips_weights=self.lpips_weights)

    def key(self, cell: Cell) -> str:
        """The cell's config hash (its cache key, with dataset, row and seed)."""
        return config_hash(cell_settings(self.budget, cell, self.lpips_weights))

    def folder(self, cell: Cell) -> Path:
        return self.cache / cell.dataset / cell.row.key / f"seed{cell.seed}-{self.key(cell)}"

    def cached(self, cell: Cell) -> dict | None:
        """The cell's metrics when it has finished, else ``None``."""
        path = self.folder(cell) / METRICS_NAME
        return json.loads(path.read_text()) if path.is_file() else None

    def dataset(self, config: dict, split: str):
        """The rendered (in-memory) dataset of ``config``'s data section, shared by cells."""
        key = (config["data"]["kind"], config["data"]["num_context"], split)
        if key not in self._datasets:
            while len(self._datasets) >= self.max_datasets:
                self._datasets.pop(next(iter(self._datasets)))
            dataset = build_dataset(config, split)
            for index in range(len(dataset)):  # render now, so training time excludes rendering
                dataset[index]
            self._datasets[key] = dataset
        return self._datasets[key]

    # ------------------------------------------------------------------ one cell
    def run(self, cell: Cell) -> dict:
        """Train (or resume) and evaluate ``cell``; returns its metrics dict (cached on disk)."""
        done = self.cached(cell)
        if done is not None:
            return done
        folder = self.folder(cell)
        config = self.config(cell, folder)
        checkpoint = folder / CHECKPOINT_NAME
        start = load_checkpoint(checkpoint)["step"] if checkpoint.is_file() else 0
        dataset = self.dataset(config, "train")
        tick = time.perf_counter()
        result = train(config, progress=False, dataset=dataset)
        seconds = time.perf_counter() - tick
        trained = result.step - start
        self.trained.append(cell)
        model = result.model.eval()
        metrics, _ = evaluate_model(model, self.dataset(config, "eval"), config["data"]["num_context"],
                                    batch_size=config["eval"]["batch_size"], lpips=self._lpips, device=self.device)
        record = {
            "dataset": cell.dataset, "row": cell.row.label, "encoding": cell.row.encoding,
            "predictor": cell.row.predictor, "num_context": cell.row.num_context, "seed": cell.seed,
            "config_hash": self.key(cell), "steps": result.step, "skipped_steps": result.skipped_steps,
            "final_loss": result.last_loss, "parameters": count_parameters(model)["trainable"],
            # Seconds for all `steps`, extrapolated from this session when the run was resumed.
            "train_seconds": seconds * result.step / trained if trained else None,
            "resumed_from_step": start, "eval_scenes": len(self.dataset(config, "eval")), "metrics": metrics,
        }
        _write_json(folder / METRICS_NAME, record)
        return record

    # ------------------------------------------------------------------ Fig. 6 protocols
    def protocol(self, cell: Cell, protocol: str, *, compute: bool = True, **options) -> dict | None:
        """``hrope.nvs.protocols.run_protocol`` on the cell's trained checkpoint (cached per cell;
        ``compute=False`` returns None instead of computing a missing result).

        Raises :class:`ProtocolUnavailable` when the protocols module is not implemented."""
        try:
            from hrope.nvs.protocols import run_protocol
        except ImportError as error:
            raise ProtocolUnavailable(f"hrope.nvs.protocols cannot be imported: {error}") from None
        folder = self.folder(cell)
        path = folder / PROTOCOLS_NAME
        stored = json.loads(path.read_text()) if path.is_file() else {}
        key = json.dumps({"protocol": protocol, "scenes": self.budget.protocol_scenes, **options}, sort_keys=True)
        if key not in stored:
            if not compute:
                return None
            if not (folder / CHECKPOINT_NAME).is_file():
                # finished cells keep their small JSON files in git, not their checkpoints: training
                # is a pure function of the cell's config, so retraining restores the same model
                config = self.config(cell, folder)
                train(config, progress=False, dataset=self.dataset(config, "train"))
            try:
                stored[key] = run_protocol(str(folder), protocol, num_scenes=self.budget.protocol_scenes,
                                           device=self.device, lpips_weights=self.lpips_weights, **options)
            except NotImplementedError as error:
                raise ProtocolUnavailable(f"hrope.nvs.protocols.run_protocol({protocol!r}) is not implemented yet: "
                                          f"{error}") from None
            _write_json(path, stored)
        return stored[key]

