"""Checkpoints: one atomic safetensors file per run folder with the model, optimizer and RNG state.

``save_checkpoint`` writes it, ``load_checkpoint`` restores a model / optimizer / RNG from it, and
``load_model`` rebuilds the model of a finished run from the config stored in its metadata.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor, nn

from .config import resolve
from ..errors import InputError
from .model import LVSM, build_model

__all__ = ["CHECKPOINT_NAME", "CHECKPOINT_FORMAT", "CheckpointError", "save_checkpoint", "load_checkpoint",
           "load_model", "run_folder"]

CHECKPOINT_NAME = "checkpoint.safetensors"
CHECKPOINT_FORMAT = "hrope-checkpoint-v1"


class CheckpointError(InputError):
    """A missing or malformed checkpoint file."""


def save_checkpoint(path: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer | None,
                    step: int, config: dict) -> Path:
    """Write ``path`` atomically (temp file + ``os.replace``) as safetensors.

    Tensors: ``model.<name>``, ``optimizer.<param index>.<key>`` (AdamW state), ``rng.torch``
    (and ``rng.cuda``, the current CUDA device's, when CUDA is in use). Metadata (JSON strings):
    ``format``, ``step``, ``config``, ``optimizer_groups`` (hyper-parameters per group and their
    parameter indices), ``scheduler`` (the schedule is a pure function of the step).
    """
    path = Path(path)
    tensors = {f"model.{k}": v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    metadata = {"format": CHECKPOINT_FORMAT, "step": str(step), "config": json.dumps(config),
                "scheduler": json.dumps({"kind": "warmup_cosine", "step": step})}
    if optimizer is not None:
        state = optimizer.state_dict()
        for index, values in state["state"].items():
            for key, value in values.items():
                tensors[f"optimizer.{index}.{key}"] = torch.as_tensor(value).contiguous().cpu()
        metadata["optimizer_groups"] = json.dumps(state["param_groups"])
    tensors["rng.torch"] = torch.get_rng_state()
    if torch.cuda.is_initialized():  # only a process that used CUDA; its current device only
        tensors["rng.cuda"] = torch.cuda.get_rng_state()
    temporary = path.with_name(path.name + ".tmp")
    save_file(tensors, str(temporary), metadata=metadata)
    os.replace(temporary, path)
    return path


def run_folder(checkpoint: str | Path) -> Path:
    """The run folder of ``checkpoint`` (a run folder itself, or the checkpoint file inside one)."""
    checkpoint = Path(checkpoint)
    return checkpoint if checkpoint.is_dir() else checkpoint.parent


def _read_checkpoint(path: str | Path, with_tensors: bool = True) -> tuple[dict[str, Tensor], dict[str, str]]:
    path = Path(path)
    if path.is_dir():
        path = path / CHECKPOINT_NAME
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
            tensors = {key: handle.get_tensor(key) for key in handle.keys()} if with_tensors else {}
    except Exception as error:  # safetensors raises its own error types for corrupt files
        raise CheckpointError(f"{path} is not a readable safetensors checkpoint: {error}") from None
    if metadata.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"{path} is not an hrope checkpoint (format {metadata.get('format')!r})")
    return tensors, metadata


def _model_state(tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    return {k[len("model."):]: v for k, v in tensors.items() if k.startswith("model.")}


def load_checkpoint(path: str | Path, model: nn.Module | None = None,
                    optimizer: torch.optim.Optimizer | None = None, restore_rng: bool = False) -> dict:
    """Load a checkpoint into ``model`` / ``optimizer`` (either optional); returns
    ``{"step": int, "config": dict}`` (only the metadata is read when nothing is loaded). ``path``
    may be the file or its run folder."""
    loads = model is not None or optimizer is not None or restore_rng
    tensors, metadata = _read_checkpoint(path, with_tensors=loads)
    if model is not None:
        model.load_state_dict(_model_state(tensors))
    if optimizer is not None:
        if "optimizer_groups" not in metadata:
            raise CheckpointError(f"{path} holds no optimizer state")
        state: dict = {}
        for key, value in tensors.items():
            if key.startswith("optimizer."):
                _, index, name = key.split(".", 2)
                state.setdefault(int(index), {})[name] = value
        optimizer.load_state_dict({"state": state, "param_groups": json.loads(metadata["optimizer_groups"])})
    if restore_rng:
        torch.set_rng_state(tensors["rng.torch"])
        if "rng.cuda" in tensors and torch.cuda.is_available():
            torch.cuda.set_rng_state(tensors["rng.cuda"])
    return {"step": int(metadata["step"]), "config": resolve(json.loads(metadata["config"]))}


def load_model(path: str | Path, device: str | torch.device = "cpu") -> tuple[LVSM, dict]:
    """Model and resolved config from a checkpoint (file or run folder), read once."""
    tensors, metadata = _read_checkpoint(path)
    config = resolve(json.loads(metadata["config"]))
    model = build_model(config)
    model.load_state_dict(_model_state(tensors))
    return model.to(device).eval(), config
