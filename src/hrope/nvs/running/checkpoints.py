"""Checkpoints: one atomic safetensors file per run folder with the model, optimizer and RNG state.

``save_checkpoint`` writes it, ``load_checkpoint`` restores a model / optimizer / RNG from it, and
``load_model`` rebuilds the model of a finished run from the config stored in its metadata. A write
the file system refuses while a run trains (a full disk) names the checkpoint that is intact and
the command that resumes from it (:func:`resumable`).

Integrity: the metadata holds a sha256 ``checksum`` over the other metadata and every tensor
(name, dtype, shape, bytes), verified whenever tensors are read; model weights must be finite
both to be written and to be loaded. Checkpoints of format ``hrope-checkpoint-v1`` (no checksum)
still load, with a warning.
"""

from __future__ import annotations

import json
import logging
import shlex
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import Tensor, nn

from .atomic import StorageError, atomic_path
from .tensor_files import CheckpointError, checksum, listed, load_model_state, read_safetensors
from ..config import ConfigError, RunConfig, resolve
from ..model import LVSM, build_model

__all__ = [
    "CHECKPOINT_NAME",
    "CHECKPOINT_FORMAT",
    "LEGACY_FORMAT",
    "CheckpointError",
    "save_checkpoint",
    "load_checkpoint",
    "load_model",
    "load_model_state",
    "model_state",
    "checkpoint_step",
    "resumable",
    "run_folder",
    "checksum",
    "read_safetensors",
]

CHECKPOINT_NAME = "checkpoint.safetensors"
CHECKPOINT_FORMAT = "hrope-checkpoint-v2"
LEGACY_FORMAT = "hrope-checkpoint-v1"  # written before checksums: loads with a warning

logger = logging.getLogger("hrope.nvs.running.checkpoints")


def _non_finite(tensors: dict[str, Tensor]) -> list[str]:
    return sorted(k for k, v in tensors.items() if v.is_floating_point() and not torch.isfinite(v).all())


def save_checkpoint(
    path: str | Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    step: int,
    config: RunConfig,
    state: dict | None = None,
) -> Path:
    """Write ``path`` atomically (temp file, fsync, ``os.replace``) as safetensors; refuses non-finite
    model weights (:class:`CheckpointError`), so the previous checkpoint stays.

    Tensors: ``model.<name>``, ``optimizer.<param index>.<key>`` (AdamW state), ``rng.torch``
    (and ``rng.cuda``, the current CUDA device's, when CUDA is in use). Metadata (JSON strings):
    ``format``, ``step``, ``config``, ``optimizer_groups`` (hyper-parameters per group and their
    parameter indices), ``scheduler`` (the schedule is a pure function of the step), ``state``
    (JSON-able training state, e.g. the last loss) and ``checksum``.
    """
    path = Path(path)
    tensors = {f"model.{k}": v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    bad = _non_finite(tensors)
    if bad:
        raise CheckpointError(f"refusing to write {path}: non-finite model weights in {listed(bad)}")
    metadata = {
        "format": CHECKPOINT_FORMAT,
        "step": str(step),
        "config": json.dumps(config.to_dict()),
        "scheduler": json.dumps({"kind": "warmup_cosine", "step": step}),
        "state": json.dumps(state or {}),
    }
    if optimizer is not None:
        optimizer_state = optimizer.state_dict()
        for index, values in optimizer_state["state"].items():
            for key, value in values.items():
                tensors[f"optimizer.{index}.{key}"] = torch.as_tensor(value).contiguous().cpu()
        metadata["optimizer_groups"] = json.dumps(optimizer_state["param_groups"])
    tensors["rng.torch"] = torch.get_rng_state()
    if torch.cuda.is_initialized():  # only a process that used CUDA; its current device only
        tensors["rng.cuda"] = torch.cuda.get_rng_state()
    metadata["checksum"] = checksum(tensors, metadata)
    with atomic_path(path) as temporary:  # fsynced before it replaces the previous checkpoint
        save_file(tensors, str(temporary), metadata=metadata)
    return path


def run_folder(checkpoint: str | Path) -> Path:
    """The run folder of ``checkpoint`` (a run folder itself, or the checkpoint file inside one)."""
    checkpoint = Path(checkpoint)
    return checkpoint if checkpoint.is_dir() else checkpoint.parent


def _read_checkpoint(path: str | Path, with_tensors: bool = True) -> tuple[dict[str, Tensor], dict[str, str]]:
    """Tensors (verified: checksum, finite model weights) and metadata; only the metadata when not
    ``with_tensors``."""
    path = Path(path)
    if path.is_dir():
        path = path / CHECKPOINT_NAME
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    try:
        tensors, metadata = read_safetensors(path, with_tensors)
    except Exception as error:  # safetensors raises its own error types for corrupt files
        raise CheckpointError(f"{path} is not a readable safetensors checkpoint: {error}") from None
    if metadata.get("format") not in (CHECKPOINT_FORMAT, LEGACY_FORMAT):
        raise CheckpointError(f"{path} is not an hrope checkpoint (format {metadata.get('format')!r})")
    if not with_tensors:
        return tensors, metadata
    if "checksum" in metadata:
        if checksum(tensors, metadata) != metadata["checksum"]:
            raise CheckpointError(f"{path}: checksum mismatch: the file is damaged")
    elif metadata["format"] == LEGACY_FORMAT:
        logger.warning(
            "%s has no checksum (format %s, written before checksums); its contents are not verified",
            path,
            LEGACY_FORMAT,
        )
    else:
        raise CheckpointError(f"{path}: checksum missing from a {CHECKPOINT_FORMAT} checkpoint: the file is damaged")
    bad = _non_finite({k: v for k, v in tensors.items() if k.startswith("model.")})
    if bad:
        raise CheckpointError(f"{path}: non-finite model weights in {listed(bad)}; the checkpoint is unusable")
    return tensors, metadata


def _model_state(tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    return {k[len("model.") :]: v for k, v in tensors.items() if k.startswith("model.")}


def model_state(path: str | Path) -> dict[str, Tensor]:
    """The model tensors of a checkpoint (file or run folder), verified (checksum, finite)."""
    return _model_state(_read_checkpoint(path)[0])


def load_checkpoint(
    path: str | Path,
    model: nn.Module | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    restore_rng: bool = False,
) -> dict:
    """Load a checkpoint into ``model`` / ``optimizer`` (either optional); returns
    ``{"step": int, "config": RunConfig, "state": dict}`` (only the metadata is read when nothing is
    loaded). ``path`` may be the file or its run folder."""
    loads = model is not None or optimizer is not None or restore_rng
    tensors, metadata = _read_checkpoint(path, with_tensors=loads)
    if model is not None:
        load_model_state(model, _model_state(tensors), path)
    if optimizer is not None:
        if "optimizer_groups" not in metadata:
            raise CheckpointError(f"{path} holds no optimizer state")
        state: dict = {}
        for key, value in tensors.items():
            if key.startswith("optimizer."):
                _, index, name = key.split(".", 2)
                state.setdefault(int(index), {})[name] = value
        try:
            groups = _metadata_json(metadata, "optimizer_groups", path)
            optimizer.load_state_dict({"state": state, "param_groups": groups})
        except (ValueError, KeyError, RuntimeError) as error:
            reason = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise CheckpointError(f"{path}: its optimizer state does not fit the optimizer ({reason})") from None
    if restore_rng:
        torch.set_rng_state(tensors["rng.torch"])
        if "rng.cuda" in tensors and torch.cuda.is_available():
            torch.cuda.set_rng_state(tensors["rng.cuda"])
    return {
        "step": _metadata_step(metadata, path),
        "config": _metadata_config(metadata, path),
        "state": _metadata_json(metadata, "state", path, default="{}"),
    }


def _metadata_json(metadata: dict[str, str], key: str, path, default: str | None = None):
    """The JSON value of metadata ``key``, or a :class:`CheckpointError` naming the file."""
    text = metadata.get(key, default)
    if text is None:
        raise CheckpointError(f"{path}: its {key} metadata is missing")
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise CheckpointError(f"{path}: its {key} metadata is not JSON ({error})") from None


def _metadata_config(metadata: dict[str, str], path) -> RunConfig:
    """The run config stored in the checkpoint (checked like any config)."""
    try:
        return resolve(_metadata_json(metadata, "config", path))
    except ConfigError as error:
        raise CheckpointError(f"{path}: its config metadata is invalid: {error}") from None


def _metadata_step(metadata: dict[str, str], path) -> int:
    step = metadata.get("step", "")
    if not step.isdigit():
        raise CheckpointError(f"{path}: its step metadata {step!r} is not a non-negative integer")
    return int(step)


def load_model(path: str | Path, device: str | torch.device = "cpu") -> tuple[LVSM, RunConfig]:
    """Model and run config from a checkpoint (file or run folder), read once."""
    tensors, metadata = _read_checkpoint(path)
    config = _metadata_config(metadata, path)
    model = build_model(config)
    load_model_state(model, _model_state(tensors), path)
    return model.to(device).eval(), config


def checkpoint_step(path: str | Path) -> int | None:
    """The step of the checkpoint ``path`` (file or run folder) from its metadata; None when there is
    none (or it is no readable checkpoint)."""
    try:
        return load_checkpoint(path)["step"]
    except CheckpointError:
        return None


@contextmanager
def resumable(out: Path) -> Iterator[None]:
    """A :class:`~hrope.nvs.running.atomic.StorageError` of the block, training into the run folder
    ``out``, says which checkpoint is intact and the command that resumes from it."""
    try:
        yield
    except StorageError as error:
        step = checkpoint_step(out / CHECKPOINT_NAME)
        if step is None:
            raise error.keeping("no checkpoint was written") from error
        # --out: the config.yaml of a run resumed in a moved folder still names the old one
        resume = f"run `{shlex.join(['hrope', 'train', str(out / 'config.yaml'), '--out', str(out)])}` to resume"
        raise error.keeping(f"the checkpoint of step {step} is intact", resume) from error
