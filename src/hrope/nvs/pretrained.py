"""Saved models in the ecosystem's folder convention: :func:`save_pretrained` and :func:`from_pretrained`.

A saved model is a folder of three files:

- ``config.json``: ``format`` (:data:`PRETRAINED_FORMAT`), ``hrope_version``, ``step`` (training
  steps, or None), ``config`` (the resolved run config: its ``model`` section is the architecture,
  its ``data`` and ``eval`` sections the held-out split ``hrope eval`` scores) and ``evaluation``
  (the run's ``eval/results.json`` when it was evaluated, else None);
- ``model.safetensors``: the model's ``state_dict`` (the names of :class:`~hrope.nvs.model.LVSM`'s),
  with a sha256 ``checksum`` in its metadata (:func:`hrope.nvs.running.checkpoints.checksum`);
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
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import Tensor, nn

from .. import __version__
from .running.atomic import atomic_path, write_json, write_text
from .running.checkpoints import (
    CHECKPOINT_NAME,
    CheckpointError,
    checksum,
    load_checkpoint,
    load_model,
    load_model_state,
    model_state,
    read_safetensors,
)
from .config import ConfigError, resolve
from .model import LVSM, ModelError, build_model

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

PRETRAINED_FORMAT = "hrope-pretrained-v1"
CONFIG_NAME, WEIGHTS_NAME, CARD_NAME = "config.json", "model.safetensors", "README.md"
# the parameters an encoding brings (GTA's options, parameter sources, APE embeddings): a fine-tune
# with another encoding starts them from their initialisation
ENCODING_PARTS = ("encoding.", "source.", "ape.")


class PretrainedError(CheckpointError):
    """A saved model folder that cannot be written or read as asked."""


def is_pretrained(path: str | Path) -> bool:
    """Whether ``path`` is a folder with a ``config.json`` (a saved model, or a damaged one)."""
    return Path(path).is_dir() and (Path(path) / CONFIG_NAME).is_file()


# ----------------------------------------------------------------------------------- writing
def _run_config(model: LVSM, config: dict | None) -> dict:
    """The resolved run config to store: ``config`` with the model's architecture, or the defaults
    around it."""
    try:
        text = json.dumps({**(config or {}), "model": {**model.config.to_dict(), "preset": None}})
    except (TypeError, ValueError) as error:  # e.g. an nn.Module in predictor_options (Python API)
        raise PretrainedError(f"the model's config cannot be saved as JSON ({error})") from None
    return resolve(json.loads(text))


def model_card(info: dict) -> str:
    """The ``README.md`` of a saved model from its ``config.json`` contents ``info``."""
    config, evaluation = info["config"], info.get("evaluation")
    model, data = config["model"], config["data"]
    steps = f"{info['step']} steps" if info.get("step") is not None else "an unknown number of steps"
    lines = [
        "---",
        "library_name: hrope",
        "tags:",
        *(f"- {tag}" for tag in ("novel-view-synthesis", "lvsm", "hrope", model["encoding"])),
        "---",
        "",
        f"# LVSM with the `{model['encoding']}` encoding",
        "",
        f"A decoder-only LVSM novel-view-synthesis model (`hrope.nvs.model.LVSM`) with the `{model['encoding']}` "
        f"positional encoding, trained for {steps} on `{data['kind']}` data ({data['num_context']} context views, "
        f"{model['image_size']}x{model['image_size']} pixels). Saved by hrope {info['hrope_version']}.",
        "",
        "## Evaluation",
        "",
    ]
    if evaluation:
        lines += [
            f"`{evaluation.get('name', model['encoding'])}` on {evaluation.get('num_scenes', '?')} held-out scenes "
            f"of `{data['kind']}` ({evaluation.get('num_context', '?')} context views), as `hrope eval` reported it:",
            "",
            "| metric | value |",
            "|---|---|",
            *(f"| {name} | {_cell(value)} |" for name, value in evaluation.get("metrics", {}).items()),
        ]
    else:
        lines.append("Not evaluated when it was saved: `hrope eval FOLDER` scores it on the held-out split below.")
    lines += ["", "## Model", "", "| setting | value |", "|---|---|"]
    lines += [f"| `model.{key}` | `{json.dumps(value)}` |" for key, value in model.items()]
    lines += [
        "",
        "## Use",
        "",
        "```python",
        "from hrope.nvs.pretrained import from_pretrained",
        'model = from_pretrained("FOLDER")  # a local folder: nothing is downloaded',
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
    write_json(folder / CONFIG_NAME, info, newline=True)
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


def _check_target(folder: Path, overwrite: bool) -> None:
    if folder.exists() and not folder.is_dir():
        raise PretrainedError(f"{folder} is an existing file, not a folder")
    if folder.is_dir() and any(folder.iterdir()):
        if not is_pretrained(folder):
            raise PretrainedError(f"{folder} exists and holds something else than a saved model; not replaced")
        if not overwrite:
            raise PretrainedError(f"{folder} already holds a saved model; overwrite=True (--overwrite) replaces it")


def save_pretrained(
    model: LVSM,
    folder: str | Path,
    *,
    config: dict | None = None,
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
    _check_target(folder, overwrite)
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
    folder.parent.mkdir(parents=True, exist_ok=True)
    temporary = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".tmp", dir=folder.parent))
    try:
        _write_files(temporary, tensors, info)
        _replace_folder(temporary, folder)
    finally:
        shutil.rmtree(temporary, ignore_errors=True)  # gone already after a successful rename
    return folder


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
    _check_target(Path(folder), overwrite)  # before any work
    model, config = load_model(run)
    step = load_checkpoint(run)["step"]
    evaluation = _evaluation_of(Path(run) / CHECKPOINT_NAME if Path(run).is_dir() else Path(run))
    return save_pretrained(model, folder, config=config, step=step, evaluation=evaluation, overwrite=overwrite)


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


def _read_weights(folder: Path) -> dict[str, Tensor]:
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


def load_pretrained(folder: str | Path, device: str | torch.device = "cpu") -> tuple[LVSM, dict]:
    """The model (in eval mode, on ``device``) and the ``config.json`` contents of a saved model
    folder (``info["config"]``: the resolved run config)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise PretrainedError(f"saved model folder not found: {folder}")
    info = _read_info(folder)
    try:
        model = build_model(info["config"])
    except ModelError as error:
        raise PretrainedError(f"{folder / CONFIG_NAME}: its model config is invalid: {error}") from None
    load_model_state(model, _read_weights(folder), folder / WEIGHTS_NAME)
    return model.to(device).eval(), info


def from_pretrained(folder: str | Path, device: str | torch.device = "cpu") -> LVSM:
    """The model of a saved model folder (:func:`save_pretrained`), in eval mode on ``device``."""
    return load_pretrained(folder, device)[0]


def load_trained(path: str | Path, device: str | torch.device = "cpu") -> tuple[LVSM, dict]:
    """Model and resolved run config of a run folder, a checkpoint file or a saved model folder."""
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
    state = _read_weights(path) if is_pretrained(path) else model_state(path)
    own = dict(model.state_dict())
    kept = sorted(name for name in own if name.startswith(ENCODING_PARTS) and name not in state)
    state = {k: v for k, v in state.items() if k in own or not k.startswith(ENCODING_PARTS)}
    load_model_state(model, {**state, **{name: own[name] for name in kept}}, path)
    return kept
