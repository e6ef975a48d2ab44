"""The saved-model folder (:mod:`hrope.nvs.pretrained` describes it): written by
:func:`write_model_folder`, read by :func:`read_model_folder`, and the classes' own
``from_pretrained`` / ``save_pretrained`` (:class:`PretrainedMixin`, which :class:`hrope.nvs.model.LVSM`
has), as transformers, diffusers and timm models do.

A model class with the mixin is built as ``cls(config.model)`` from a run config and has a
``config`` (its :class:`~hrope.nvs.config.ModelConfig`).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import Tensor

from .. import __version__
from .config import ConfigError, RunConfig, resolve
from .running.atomic import StorageError, atomic_path, storage_faults, write_json, write_text
from .running.tensor_files import CheckpointError, checksum, load_model_state, read_safetensors

__all__ = [
    "PRETRAINED_FORMAT",
    "CONFIG_NAME",
    "WEIGHTS_NAME",
    "CARD_NAME",
    "PretrainedError",
    "PretrainedMixin",
    "is_pretrained",
    "model_card",
    "check_save_target",
    "write_model_folder",
    "read_model_folder",
    "read_weights",
]

PRETRAINED_FORMAT = "hrope-pretrained-v1"
CONFIG_NAME, WEIGHTS_NAME, CARD_NAME = "config.json", "model.safetensors", "README.md"


class PretrainedError(CheckpointError):
    """A saved model folder that cannot be written or read as asked."""


def is_pretrained(path: str | Path) -> bool:
    """Whether ``path`` is a folder with a ``config.json`` (a saved model, or a damaged one)."""
    return Path(path).is_dir() and (Path(path) / CONFIG_NAME).is_file()


# ----------------------------------------------------------------------------------- writing
def _run_config(model: Any, config: RunConfig | None) -> RunConfig:
    """The run config to store: ``config`` with the model's architecture, or the defaults around it."""
    plain = config.to_dict() if config is not None else {}
    try:
        text = json.dumps({**plain, "model": {**model.config.to_dict(), "preset": None}})
    except (TypeError, ValueError) as error:  # e.g. an nn.Module in predictor_options (Python API)
        raise PretrainedError(f"the model's config cannot be saved as JSON ({error})") from None
    return resolve(json.loads(text))


def model_card(info: dict) -> str:
    """The ``README.md`` of a saved model from its ``config.json`` contents ``info`` (its ``config``
    a :class:`~hrope.nvs.config.RunConfig`)."""
    config, evaluation = info["config"], info.get("evaluation")
    model, data = config.model, config.data
    steps = f"{info['step']} steps" if info.get("step") is not None else "an unknown number of steps"
    lines = [
        "---",
        "library_name: hrope",
        "tags:",
        *(f"- {tag}" for tag in ("novel-view-synthesis", "lvsm", "hrope", model.encoding)),
        "---",
        "",
        f"# LVSM with the `{model.encoding}` encoding",
        "",
        f"A decoder-only LVSM novel-view-synthesis model (`hrope.nvs.model.LVSM`) with the `{model.encoding}` "
        f"positional encoding, trained for {steps} on `{data.kind}` data ({data.num_context} context views, "
        f"{model.image_size}x{model.image_size} pixels). Saved by hrope {info['hrope_version']}.",
        "",
        "## Evaluation",
        "",
    ]
    if evaluation:
        lines += [
            f"`{evaluation.get('name', model.encoding)}` on {evaluation.get('num_scenes', '?')} held-out scenes "
            f"of `{data.kind}` ({evaluation.get('num_context', '?')} context views), as `hrope eval` reported it:",
            "",
            "| metric | value |",
            "|---|---|",
            *(f"| {name} | {_cell(value)} |" for name, value in evaluation.get("metrics", {}).items()),
        ]
    else:
        lines.append("Not evaluated when it was saved: `hrope eval FOLDER` scores it on the held-out split below.")
    lines += ["", "## Model", "", "| setting | value |", "|---|---|"]
    lines += [f"| `model.{key}` | `{json.dumps(value)}` |" for key, value in config.to_dict()["model"].items()]
    lines += [
        "",
        "## Use",
        "",
        "```python",
        "from hrope.nvs.model import LVSM",
        'model = LVSM.from_pretrained("FOLDER")  # a local folder: nothing is downloaded',
        "```",
        "",
        "`hrope eval FOLDER` scores it (the data and eval settings are in `config.json`, `--data.key VALUE` "
        "changes them); `hrope viz planes FOLDER` draws its planes.",
        "",
    ]
    return "\n".join(lines)


def _cell(value) -> str:
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def _write_files(folder: Path, tensors: dict[str, Tensor], info: dict) -> None:
    """The three files of a saved model into the (new, empty) ``folder``, each fsynced."""
    metadata = {"format": "pt", "hrope_format": PRETRAINED_FORMAT}
    metadata["checksum"] = checksum(tensors, metadata)
    with atomic_path(folder / WEIGHTS_NAME) as temporary:
        save_file(tensors, str(temporary), metadata=metadata)
    write_json(folder / CONFIG_NAME, {**info, "config": info["config"].to_dict()}, newline=True)
    write_text(folder / CARD_NAME, model_card(info))


def _replace_folder(temporary: Path, folder: Path) -> None:
    """Move the written ``temporary`` folder to ``folder``; a previous ``folder`` is moved aside
    first and deleted only once the new one is in place."""
    if not folder.exists():
        os.rename(temporary, folder)
        return
    previous = Path(tempfile.mkdtemp(prefix=f".{folder.name}.previous.", dir=folder.parent))
    try:
        os.rename(folder, previous / folder.name)
        try:
            os.rename(temporary, folder)
        except BaseException:
            os.rename(previous / folder.name, folder)
            raise
    finally:
        if folder.exists():  # the new folder, or the previous one back in place: the aside copy can go
            shutil.rmtree(previous, ignore_errors=True)


def check_save_target(folder: Path, overwrite: bool) -> None:
    """Refuse to save into ``folder`` when it is a file, a folder holding something else, or (without
    ``overwrite``) a saved model."""
    if folder.exists() and not folder.is_dir():
        raise PretrainedError(f"{folder} is an existing file, not a folder")
    if folder.is_dir() and any(folder.iterdir()):
        if not is_pretrained(folder):
            raise PretrainedError(f"{folder} exists and holds something else than a saved model; not replaced")
        if not overwrite:
            raise PretrainedError(f"{folder} already holds a saved model; overwrite=True (--overwrite) replaces it")


def write_model_folder(
    model: Any,
    folder: str | Path,
    *,
    config: RunConfig | None = None,
    step: int | None = None,
    evaluation: dict | None = None,
    overwrite: bool = False,
) -> Path:
    """Write ``model`` as a saved model folder (module doc), atomically; returns the folder.

    ``config``: the run config it was trained with (its model section is replaced by the model's
    own; default: the defaults). ``step``: training steps. ``evaluation``: ``hrope eval``'s
    results dict (``results.json``) for the model card. Refuses non-finite weights, an existing
    file, a non-empty folder that is not a saved model, and (without ``overwrite``) a saved model.
    """
    folder = Path(folder)
    check_save_target(folder, overwrite)
    tensors = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    bad = sorted(k for k, v in tensors.items() if v.is_floating_point() and not torch.isfinite(v).all())
    if bad:
        raise PretrainedError(f"refusing to save {folder}: non-finite weights in {', '.join(bad[:3])}")
    info = {
        "format": PRETRAINED_FORMAT,
        "hrope_version": __version__,
        "step": step,
        "config": _run_config(model, config),
        "evaluation": evaluation,
    }
    _write_folder(folder, tensors, info)
    return folder


def _write_folder(folder: Path, tensors: dict[str, Tensor], info: dict) -> None:
    """The saved model into a temporary sibling folder, then renamed to ``folder``; a write the file
    system refuses is a :class:`~hrope.nvs.running.atomic.StorageError` naming ``folder`` and what it holds."""
    try:
        with storage_faults(folder):
            folder.parent.mkdir(parents=True, exist_ok=True)
            temporary = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".tmp", dir=folder.parent))
            try:
                _write_files(temporary, tensors, info)
                _replace_folder(temporary, folder)
            finally:
                shutil.rmtree(temporary, ignore_errors=True)  # gone already after a successful rename
    except StorageError as error:
        kept = f"the previous saved model in {folder} is intact" if is_pretrained(folder) else "nothing was written"
        raise error.keeping(f"{kept} and no temporary folder is left", path=folder) from error


# ----------------------------------------------------------------------------------- reading
def _read_info(folder: Path) -> dict:
    """``config.json``, checked: the format, and a valid run config (resolved)."""
    path = folder / CONFIG_NAME
    if not path.is_file():
        raise PretrainedError(f"{folder} is not a saved model: {CONFIG_NAME} is missing")
    try:
        info = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise PretrainedError(f"{path} is not JSON ({error})") from None
    found = info.get("format") if isinstance(info, dict) else None
    if found != PRETRAINED_FORMAT:
        raise PretrainedError(f"{path} is not an hrope saved model (format {found!r}, expected {PRETRAINED_FORMAT!r})")
    try:
        info["config"] = resolve(info.get("config"))
    except ConfigError as error:
        raise PretrainedError(f"{path}: its config is invalid: {error}") from None
    return info


def read_weights(folder: Path) -> dict[str, Tensor]:
    """The tensors of ``model.safetensors``, checked: readable, checksum, finite."""
    path = folder / WEIGHTS_NAME
    if not path.is_file():
        raise PretrainedError(f"{folder} is not a saved model: {WEIGHTS_NAME} is missing")
    try:
        tensors, metadata = read_safetensors(path)
    except Exception as error:  # safetensors raises its own error types for corrupt files
        raise PretrainedError(f"{path} is not a readable safetensors file: {error}") from None
    if "checksum" not in metadata or checksum(tensors, metadata) != metadata["checksum"]:
        raise PretrainedError(f"{path}: checksum missing or mismatched: the file is damaged")
    bad = sorted(k for k, v in tensors.items() if v.is_floating_point() and not torch.isfinite(v).all())
    if bad:
        raise PretrainedError(f"{path}: non-finite weights in {', '.join(bad[:3])}; the model is unusable")
    return tensors


def read_model_folder(model_class: type, folder: str | Path, device: str | torch.device = "cpu") -> tuple[Any, dict]:
    """The ``model_class`` model (in eval mode, on ``device``) and the ``config.json`` contents of a
    saved model folder (``info["config"]``: the :class:`~hrope.nvs.config.RunConfig`)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise PretrainedError(f"saved model folder not found: {folder}")
    info = _read_info(folder)
    model = model_class(info["config"].model)
    load_model_state(model, read_weights(folder), folder / WEIGHTS_NAME)
    return model.to(device).eval(), info


class PretrainedMixin:
    """``Model.from_pretrained(folder)`` and ``model.save_pretrained(folder)`` of a model class
    built as ``cls(config.model)`` (module doc): the saved-model folder, local only."""

    @classmethod
    def from_pretrained(cls, folder: str | Path, device: str | torch.device = "cpu") -> Any:
        """The model of a saved model folder, in eval mode on ``device`` (:func:`read_model_folder`)."""
        return read_model_folder(cls, folder, device)[0]

    def save_pretrained(
        self,
        folder: str | Path,
        *,
        config: RunConfig | None = None,
        step: int | None = None,
        evaluation: dict | None = None,
        overwrite: bool = False,
    ) -> Path:
        """Write this model as a saved model folder (:func:`write_model_folder`); returns the folder."""
        return write_model_folder(self, folder, config=config, step=step, evaluation=evaluation, overwrite=overwrite)
