"""Run configuration: YAML files with ``--key value`` / dotted command-line overrides.

A config has four sections: ``model`` (``preset`` plus :class:`hrope.nvs.model.ModelConfig` fields,
whose defaults come from the preset), ``data``, ``train`` and ``eval`` (every key and its default
in :data:`DEFAULTS`).
Overrides are ``--section.key value`` (value parsed as YAML, so ``1e-3``, ``true``, ``[1, 2]``
work) or one of the shortcuts in :data:`SHORTCUTS` (``--encoding prope``). Unknown keys are
errors. Every run writes its resolved config (``config.yaml``) next to its outputs.
"""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

from ..errors import InputError

__all__ = ["ConfigError", "DEFAULTS", "SHORTCUTS", "load_config", "apply_overrides", "parse_overrides",
           "update_config", "resolve", "save_config"]


class ConfigError(InputError):
    """A malformed config file or override (the message names the key)."""


DEFAULTS: dict = {
    "model": {"preset": "tiny", "encoding": "none", "predictor": "learned"},
    "data": {
        "kind": "room",  # synthetic: room | object; real (hrope.nvs.data.SOURCE_KINDS): re10k | co3d | dl3dv | ...
        "root": None,  # real data: the dataset folder (required for real kinds)
        "eval_root": None,  # real data: held-out folder for evaluation (None = root)
        "eval_index": None,  # RE10K evaluation index JSON (2 context + 3 targets per scene), eval only
        "context_gap": None,  # [low, high] frames between the outer context views (None = kind default)
        "num_scenes": 256,  # synthetic: training scenes; real data: at most this many (None = all)
        "num_context": 2,
        "num_target": 1,
        "seed": 0,
        "cache": True,  # keep generated scenes in memory
        "prefetch": True,  # load the next step's scenes in a background thread while this step trains
        "synthetic": {},  # synthetic kinds: overrides of hrope.nvs.data.SyntheticConfig (e.g. {fov_deg: [40, 60]})
    },
    "train": {
        "out": "runs/default",
        "steps": 1000,
        "batch_size": 4,
        "lr": 4e-4,
        "min_lr_ratio": 0.1,
        "warmup": 100,
        "weight_decay": 0.05,
        "grad_clip": 1.0,
        "bf16": False,
        "seed": 0,
        "device": "auto",  # auto | cpu | cuda
        "log_every": 10,
        "image_every": 200,
        "checkpoint_every": 250,
        "perceptual_weight": 0.0,  # LPIPS loss weight; > 0 needs eval.lpips_weights (local)
        "parameter_lr_scale": 1.0,  # learning-rate multiplier of the parameter source's heads (planes, ...)
        "threads": 0,  # torch CPU threads; 0 keeps torch's default
        "max_nonfinite_steps": 20,  # stop with an error after this many consecutive non-finite steps
        "init_from": None,  # fine-tune: start from this checkpoint's model weights (fresh optimizer, step 0)
    },
    "eval": {
        "num_scenes": 16,  # held-out scenes (synthetic "eval" split; real data: the first N, None = all)
        "batch_size": 4,
        "lpips_weights": None,  # local safetensors with AlexNet + LPIPS heads; None = unavailable
        "num_grid_scenes": 4,
    },
}

SHORTCUTS = {
    "encoding": "model.encoding",
    "predictor": "model.predictor",
    "preset": "model.preset",
    "steps": "train.steps",
    "out": "train.out",
    "device": "train.device",
    "batch-size": "train.batch_size",
    "lr": "train.lr",
    "seed": "train.seed",
}

# Keys whose sections accept extra entries (model fields are checked by ModelConfig).
OPEN_SECTIONS = ("model",)


def _merge(base: dict, update: dict, where: str = "") -> dict:
    out = copy.deepcopy(base)
    for key, value in update.items():
        path = f"{where}{key}"
        if where == "" and key not in base:
            raise ConfigError(f"unknown config section {key!r}; known: {sorted(base)}")
        if where and key not in base and where.rstrip(".") not in OPEN_SECTIONS:
            raise ConfigError(f"unknown config key {path!r}; known in {where.rstrip('.')!r}: {sorted(base)}")
        if isinstance(base.get(key), dict) and where == "":
            if not isinstance(value, dict):
                raise ConfigError(f"config section {path!r} must be a mapping, got {type(value).__name__}")
            out[key] = _merge(base[key], value, f"{path}.")
        else:
            out[key] = copy.deepcopy(value)
    return out


def resolve(values: dict | None = None) -> dict:
    """Defaults updated with ``values`` (unknown sections/keys raise :class:`ConfigError`)."""
    if values is not None and not isinstance(values, dict):
        raise ConfigError(f"a config must be a mapping of sections, got {type(values).__name__}")
    return _merge(DEFAULTS, values or {})


def update_config(config: dict, values: dict) -> dict:
    """``config`` updated with ``{section: {key: value}}`` (unknown sections/keys raise)."""
    return _merge(config, values)


def load_config(path: str | Path) -> dict:
    """Read and resolve a YAML config file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        values = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        raise ConfigError(f"{path} is not valid YAML: {error}") from None
    try:
        return resolve(values)
    except ConfigError as error:
        raise ConfigError(f"{path}: {error}") from None


def parse_value(text: str):
    """A command-line value as YAML (numbers, booleans, lists); ``1e-3`` is a float too."""
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def apply_overrides(config: dict, args: list[str]) -> dict:
    """Apply ``["--train.lr", "1e-3", "--encoding", "prope", ...]`` (also ``--key=value``)."""
    return _merge(config, parse_overrides(args))


def parse_overrides(args: list[str]) -> dict:
    """``{section: {key: value}}`` of override options (keys checked when applied)."""
    updates: dict = {}
    index = 0
    while index < len(args):
        arg = args[index]
        if not arg.startswith("--"):
            raise ConfigError(f"expected an option like --section.key, got {arg!r}")
        key, has_value, value = arg[2:].partition("=")
        if not has_value:
            if index + 1 >= len(args):
                raise ConfigError(f"option {arg} needs a value")
            value = args[index + 1]
            index += 1
        index += 1
        key = SHORTCUTS.get(key, key)
        section, _, name = key.partition(".")
        if not name:
            raise ConfigError(
                f"unknown option --{key}; use --section.key (sections: {sorted(DEFAULTS)}) or one of "
                f"{['--' + s for s in SHORTCUTS]}"
            )
        updates.setdefault(section, {})[name] = parse_value(value)
    return updates


def save_config(config: dict, folder: str | Path) -> Path:
    """Write the resolved config to ``folder/config.yaml``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path
