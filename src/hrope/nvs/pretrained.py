"""Saved models in the ecosystem's folder convention: ``LVSM.from_pretrained(folder)`` and
``model.save_pretrained(folder)`` (:mod:`hrope.nvs.model_folder`), and here the same as functions,
:func:`save_pretrained` and :func:`from_pretrained`, with a run's export (:func:`export_run`).

A saved model is a folder of three files:

- ``config.json``: ``format`` (:data:`PRETRAINED_FORMAT`), ``hrope_version``, ``step`` (training
  steps, or None), ``config`` (the resolved run config: its ``model`` section is the architecture,
  its ``data`` and ``eval`` sections the held-out split ``hrope eval`` scores) and ``evaluation``
  (the run's ``eval/results.json`` when it was evaluated, else None);
- ``model.safetensors``: the model's ``state_dict`` (the names of :class:`~hrope.nvs.model.LVSM`'s),
  with a sha256 ``checksum`` in its metadata (:func:`hrope.nvs.running.tensor_files.checksum`);
- ``README.md``: a generated model card (what the model is, its evaluation when known, its config,
  how to load it).

Local folders only: nothing is downloaded, and nothing is unpickled (safetensors and JSON). A
folder is written whole into a temporary sibling and renamed into place, so an interrupted save
leaves the previous contents (or nothing); an existing folder is replaced only with ``overwrite``
and only when it holds a saved model. Loading checks every file: a missing, unreadable or damaged
file, an invalid config or tensors that do not fit the model are one-line :class:`PretrainedError` s
naming the file.

:func:`load_trained` opens what ``hrope eval`` and ``hrope viz`` accept: a run folder, its
checkpoint file, or a saved model's folder.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from .config import RunConfig
from .model import LVSM
from .model_folder import (
    CARD_NAME,
    CONFIG_NAME,
    PRETRAINED_FORMAT,
    WEIGHTS_NAME,
    PretrainedError,
    check_save_target,
    is_pretrained,
    model_card,
    read_model_folder,
    read_weights,
)
from .running.checkpoints import CHECKPOINT_NAME, load_checkpoint, load_model, model_state
from .running.tensor_files import load_model_state

__all__ = [
    "PRETRAINED_FORMAT",
    "CONFIG_NAME",
    "WEIGHTS_NAME",
    "CARD_NAME",
    "PretrainedError",
    "save_pretrained",
    "from_pretrained",
    "load_pretrained",
    "is_pretrained",
    "export_run",
    "load_trained",
    "init_weights",
    "model_card",
]

# the parameters an encoding brings (GTA's options, parameter sources, APE embeddings): a fine-tune
# with another encoding starts them from their initialisation
ENCODING_PARTS = ("encoding.", "source.", "ape.")


def save_pretrained(
    model: LVSM,
    folder: str | Path,
    *,
    config: RunConfig | None = None,
    step: int | None = None,
    evaluation: dict | None = None,
    overwrite: bool = False,
) -> Path:
    """``model.save_pretrained(folder, ...)`` (:func:`hrope.nvs.model_folder.write_model_folder`)."""
    return model.save_pretrained(folder, config=config, step=step, evaluation=evaluation, overwrite=overwrite)


def load_pretrained(folder: str | Path, device: str | torch.device = "cpu") -> tuple[LVSM, dict]:
    """The :class:`~hrope.nvs.model.LVSM` (in eval mode, on ``device``) and the ``config.json``
    contents of a saved model folder (``info["config"]``: the :class:`~hrope.nvs.config.RunConfig`)."""
    return read_model_folder(LVSM, folder, device)


def from_pretrained(folder: str | Path, device: str | torch.device = "cpu") -> LVSM:
    """``LVSM.from_pretrained(folder, device)``: the model of a saved model folder, in eval mode."""
    return LVSM.from_pretrained(folder, device)


def _evaluation_of(checkpoint: Path) -> dict | None:
    """The run's ``eval/results.json`` (next to ``checkpoint``) when it is at least as new as the
    checkpoint, else None."""
    results = checkpoint.parent / "eval" / "results.json"
    if not results.is_file() or results.stat().st_mtime < checkpoint.stat().st_mtime:
        return None
    try:
        evaluation = json.loads(results.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return evaluation if isinstance(evaluation, dict) else None


def export_run(run: str | Path, folder: str | Path, *, overwrite: bool = False) -> Path:
    """The saved model of a run (its folder or checkpoint file): its weights, config and step, and
    its evaluation when ``hrope eval`` scored this checkpoint (``eval/results.json`` newer than it)."""
    check_save_target(Path(folder), overwrite)  # before any work
    model, config = load_model(run)
    step = load_checkpoint(run)["step"]
    evaluation = _evaluation_of(Path(run) / CHECKPOINT_NAME if Path(run).is_dir() else Path(run))
    return save_pretrained(model, folder, config=config, step=step, evaluation=evaluation, overwrite=overwrite)


# ----------------------------------------------------------------------------------- reading
def load_trained(path: str | Path, device: str | torch.device = "cpu") -> tuple[LVSM, RunConfig]:
    """Model and run config of a run folder, a checkpoint file or a saved model folder."""
    path = Path(path)
    if is_pretrained(path):
        model, info = load_pretrained(path, device)
        return model, info["config"]
    if path.is_dir() and not (path / CHECKPOINT_NAME).exists():
        raise PretrainedError(
            f"{path} holds neither a run's {CHECKPOINT_NAME} nor a saved model's {CONFIG_NAME} and {WEIGHTS_NAME}"
        )
    return load_model(path, device)


def init_weights(path: str | Path, model: nn.Module) -> list[str]:
    """``train.init_from``: load the weights of a run folder, a checkpoint file or a saved model
    folder into ``model`` to fine-tune it, possibly with another encoding. The encoding's own
    parameters (names starting with :data:`ENCODING_PARTS`) that the file lacks keep their
    initialisation and the file's that the model lacks are left out; every other tensor must fit
    (:func:`load_model_state`). Returns the names kept from the initialisation."""
    path = Path(path)
    state = read_weights(path) if is_pretrained(path) else model_state(path)
    own = dict(model.state_dict())
    kept = sorted(name for name in own if name.startswith(ENCODING_PARTS) and name not in state)
    state = {k: v for k, v in state.items() if k in own or not k.startswith(ENCODING_PARTS)}
    load_model_state(model, {**state, **{name: own[name] for name in kept}}, path)
    return kept
