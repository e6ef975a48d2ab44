"""Checkpoints: one atomic safetensors file per run folder with the model, optimizer and RNG state.

``save_checkpoint`` writes it, ``load_checkpoint`` restores a model / optimizer / RNG from it, and
``load_model`` rebuilds the model of a finished run from the config stored in its metadata.

Integrity: the metadata holds a sha256 ``checksum`` over the other metadata and every tensor
(name, dtype, shape, bytes), verified whenever tensors are read; model weights must be finite
both to be written and to be loaded. Checkpoints of format ``hrope-checkpoint-v1`` (no checksum)
still load, with a warning.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

import torch
from safetensors.torch import load, save_file
from torch import Tensor, nn

from .atomic import atomic_path
from ..config import ConfigError, resolve
from ...errors import InputError
from ..model import LVSM, ModelError, build_model

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
    "run_folder",
    "checksum",
    "read_safetensors",
]

CHECKPOINT_NAME = "checkpoint.safetensors"
CHECKPOINT_FORMAT = "hrope-checkpoint-v2"
LEGACY_FORMAT = "hrope-checkpoint-v1"  # written before checksums: loads with a warning

logger = logging.getLogger("hrope.nvs.running.checkpoints")


class CheckpointError(InputError):
    """A missing, malformed, damaged or mismatched checkpoint file."""


def _listed(keys: list[str], limit: int = 3) -> str:
    """``a, b, c (+N more)``: the first ``limit`` keys and a count of the rest."""
    more = f" (+{len(keys) - limit} more)" if len(keys) > limit else ""
    return ", ".join(keys[:limit]) + more


def checksum(tensors: dict[str, Tensor], metadata: dict[str, str]) -> str:
    """sha256 over the metadata (sorted, without ``checksum``) and every tensor's name, dtype, shape and
    bytes (sorted by name); CPU tensors."""
    digest = hashlib.sha256()
    for key in sorted(metadata):
        if key != "checksum":
            digest.update(f"{key}\0{metadata[key]}\0".encode())
    for key in sorted(tensors):
        tensor = tensors[key].contiguous()
        digest.update(f"{key}\0{tensor.dtype}\0{tuple(tensor.shape)}\0".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().data)
    return digest.hexdigest()


def _non_finite(tensors: dict[str, Tensor]) -> list[str]:
    return sorted(k for k, v in tensors.items() if v.is_floating_point() and not torch.isfinite(v).all())


def save_checkpoint(
    path: str | Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    step: int,
    config: dict,
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
        raise CheckpointError(f"refusing to write {path}: non-finite model weights in {_listed(bad)}")
    metadata = {
        "format": CHECKPOINT_FORMAT,
        "step": str(step),
        "config": json.dumps(config),
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


# the format's own cap on the JSON header (safetensors refuses larger ones)
MAX_HEADER_BYTES = 100_000_000


def read_safetensors(path: str | Path, with_tensors: bool = True) -> tuple[dict[str, Tensor], dict[str, str]]:
    """Tensors (none unless ``with_tensors``) and ``__metadata__`` of the safetensors file ``path``,
    read through one open file, so that a file replaced while it is read (a checkpoint that
    training rewrites) is read whole, old or new. ``safe_open`` opens the file by name twice (the
    header, then the tensor storage) and can pair one file's header with the next one's tensors.
    Raises ``ValueError`` (or safetensors' own error) for a file that is not safetensors; the
    whole file is held in memory while its tensors are copied out."""
    with open(path, "rb") as handle:
        prefix = handle.read(8)
        if len(prefix) != 8:
            raise ValueError("the file is shorter than a safetensors header")
        size = int.from_bytes(prefix, "little")
        if size > MAX_HEADER_BYTES:
            raise ValueError(f"the header claims {size} bytes")
        header_bytes = handle.read(size)
        if len(header_bytes) != size:
            raise ValueError("the header is cut short")
        header = json.loads(header_bytes)
        metadata = (header.get("__metadata__") or {}) if isinstance(header, dict) else None
        if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
            raise ValueError("the header is not a safetensors header")
        if not with_tensors:
            entries = [entry for key, entry in header.items() if key != "__metadata__"]
            end = max((int(entry["data_offsets"][1]) for entry in entries), default=0)
            if os.fstat(handle.fileno()).st_size != 8 + size + end:
                raise ValueError("the tensor data is cut short or followed by other bytes")
            return {}, metadata
        data = prefix + header_bytes + handle.read()
    return load(data), metadata


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
        raise CheckpointError(f"{path}: non-finite model weights in {_listed(bad)}; the checkpoint is unusable")
    return tensors, metadata


def _model_state(tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    return {k[len("model.") :]: v for k, v in tensors.items() if k.startswith("model.")}


def model_state(path: str | Path) -> dict[str, Tensor]:
    """The model tensors of a checkpoint (file or run folder), verified (checksum, finite)."""
    return _model_state(_read_checkpoint(path)[0])


def load_model_state(model: nn.Module, state: dict[str, Tensor], source: str | Path) -> None:
    """``model.load_state_dict(state)`` (strict), or a one-line :class:`CheckpointError` naming the
    missing, unexpected and mis-shaped tensors of ``source``."""
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    shapes = sorted(
        f"{k} {tuple(state[k].shape)} in the file, {tuple(v.shape)} in the model"
        for k, v in expected.items()
        if k in state and state[k].shape != v.shape
    )
    problems = [
        f"{name}: {_listed(keys)}"
        for name, keys in (("missing", missing), ("unexpected", unexpected), ("mis-shaped", shapes))
        if keys
    ]
    if problems:
        raise CheckpointError(f"{source} does not fit the model ({'; '.join(problems)})")
    model.load_state_dict(state)


def load_checkpoint(
    path: str | Path,
    model: nn.Module | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    restore_rng: bool = False,
) -> dict:
    """Load a checkpoint into ``model`` / ``optimizer`` (either optional); returns
    ``{"step": int, "config": dict, "state": dict}`` (only the metadata is read when nothing is
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


def _metadata_config(metadata: dict[str, str], path):
    """The resolved run config stored in the checkpoint (validated like any config)."""
    try:
        return resolve(_metadata_json(metadata, "config", path))
    except ConfigError as error:
        raise CheckpointError(f"{path}: its config metadata is invalid: {error}") from None


def _metadata_step(metadata: dict[str, str], path) -> int:
    step = metadata.get("step", "")
    if not step.isdigit():
        raise CheckpointError(f"{path}: its step metadata {step!r} is not a non-negative integer")
    return int(step)


def load_model(path: str | Path, device: str | torch.device = "cpu") -> tuple[LVSM, dict]:
    """Model and resolved config from a checkpoint (file or run folder), read once."""
    tensors, metadata = _read_checkpoint(path)
    config = _metadata_config(metadata, path)
    try:
        model = build_model(config)
    except ModelError as error:
        raise CheckpointError(f"{path}: its config metadata is invalid: {error}") from None
    load_model_state(model, _model_state(tensors), path)
    return model.to(device).eval(), config
