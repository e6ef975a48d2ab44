"""Run configuration: YAML files with ``--key value`` / dotted command-line overrides, validated.

A config has four sections: ``model`` (``preset`` plus :class:`hrope.nvs.model.ModelConfig` fields,
whose defaults come from the preset), ``data``, ``train`` and ``eval`` (every key and its default
in :data:`DEFAULTS`).
Overrides are ``--section.key value`` (value parsed as YAML, so ``1e-3``, ``true``, ``[1, 2]``
work) or one of the shortcuts in :data:`SHORTCUTS` (``--encoding prope``). Unknown keys are
errors. Every run writes its resolved config (``config.yaml``) next to its outputs.

Validation: :func:`resolve`, :func:`update_config`, :func:`apply_overrides` (so :func:`load_config`
and checkpoint metadata too) check every ``data`` / ``train`` / ``eval`` value against
:data:`SCHEMA` (:func:`check_config`): types (a bool is never a number; ints are accepted for
floats), ranges (floats finite), choices and null. ``model`` values are checked by
:class:`hrope.nvs.model.ModelConfig` when the model is built, ``data.kind`` where the dataset is
built (:mod:`hrope.nvs.build_data`), device availability by :func:`check_device`. Every error is a
:class:`ConfigError` with a one-line message naming the key and what it accepts.
``train.grad_clip`` is the gradient-norm bound, > 0: clipping is always on (a large value makes it
a no-op).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml

from ..errors import InputError

__all__ = ["ConfigError", "DEFAULTS", "SCHEMA", "SHORTCUTS", "DEVICES", "Field", "load_config", "apply_overrides",
           "parse_overrides", "update_config", "resolve", "check_config", "check_device", "one_line", "save_config"]


class ConfigError(InputError):
    """A malformed config file or override (the message names the key)."""


def one_line(text: str) -> str:
    """``text`` with its line breaks (and runs of whitespace) collapsed to single spaces."""
    return " ".join(str(text).split())


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_finite(value) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an int too large for a float
        return False


def _show(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


@dataclass(frozen=True)
class Field:
    """What one config value accepts (:data:`SCHEMA`, :class:`hrope.nvs.model.ModelConfig`).

    ``kind``: ``int``, ``float`` (ints too; finite), ``bool``, ``str`` / ``path`` (a non-empty
    string), ``mapping`` or ``range`` (a list ``[low, high]`` of integers, ``0 <= low <= high``).
    ``low`` / ``high``: inclusive bounds, ``above``: an exclusive lower bound; ``choices``: the
    accepted strings; ``nullable``: None is accepted too.
    """

    kind: str
    low: int | float | None = None
    high: int | float | None = None
    above: int | float | None = None
    choices: tuple[str, ...] = ()
    nullable: bool = False

    def accepts(self, value) -> bool:
        if value is None:
            return self.nullable
        if self.kind == "range":
            return (isinstance(value, (list, tuple)) and len(value) == 2 and all(map(_is_int, value))
                    and 0 <= value[0] <= value[1])
        if self.kind == "int":
            return _is_int(value) and self._in_bounds(value)
        if self.kind == "float":
            return (_is_int(value) or isinstance(value, float)) and _is_finite(value) and self._in_bounds(value)
        if self.kind in ("str", "path"):
            return isinstance(value, str) and (value in self.choices if self.choices else value != "")
        return isinstance(value, {"bool": bool, "mapping": dict}[self.kind])

    def _in_bounds(self, value) -> bool:
        return ((self.low is None or value >= self.low) and (self.high is None or value <= self.high)
                and (self.above is None or value > self.above))

    def describe(self) -> str:
        """What the field accepts, in words (``a positive integer``, ``one of auto, cpu, cuda``)."""
        if self.choices:
            text = "one of " + ", ".join(self.choices)
        elif self.kind == "int" and self.low in (0, 1) and self.high is None:
            text = "a positive integer" if self.low == 1 else "a non-negative integer"
        else:
            text = {"int": "an integer", "float": "a finite number", "bool": "true or false",
                    "str": "a non-empty string", "path": "a path (a non-empty string)", "mapping": "a mapping",
                    "range": "a list [low, high] of integers with 0 <= low <= high"}[self.kind]
            if self.low is not None and self.high is not None:
                text += f" in [{self.low}, {self.high}]"
            elif self.low is not None:
                text += f" >= {self.low}"
            elif self.above is not None:
                text += f" > {self.above}"
        return "null or " + text if self.nullable else text

    def check(self, key: str, value, error: type[InputError] = ConfigError) -> None:
        """Raise ``error`` naming ``key`` and what it accepts when ``value`` is not accepted."""
        if not self.accepts(value):
            raise error(f"{key} must be {self.describe()}, got {_show(value)}")



DEFAULTS: dict = {
    "model": {"preset": "tiny", "encoding": "none", "predictor": "learned"},
    "data": {
        "kind": "room",  # synthetic: room | object; real (hrope.nvs.data.LOADERS): re10k | co3d | dl3dv | ...
        "root": None,  # real data: the dataset folder (required for real kinds)
        "eval_root": None,  # real data: held-out folder for evaluation (None = root)
        "eval_index": None,  # RE10K evaluation index JSON (2 context + 3 targets per scene), eval only
        "context_gap": None,  # [low, high] frames between the outer context views (None = kind default)
        "num_scenes": 256,  # synthetic: training scenes; real data: at most this many (None = all)
        "num_context": 2,
        "num_target": 1,
        "seed": 0,
        "cache": True,  # synthetic: keep generated scenes in memory; real: keep decoded views on disk (cache_dir)
        "prefetch": True,  # load the next step's scenes in a background thread while this step trains
        "synthetic": {},  # synthetic kinds: overrides of hrope.nvs.data.SyntheticConfig (e.g. {fov_deg: [40, 60]})
        "depth": "none",  # real folder kinds: none | points (COLMAP points3D.txt) | maps (depth_file_path per frame)
        "depth_scale": 0.001,  # scene units per count of a 16-bit PNG depth map (0.001: millimetres)
        "image_factor": None,  # real folder kinds: read images_N/ (1: images/); None: images/, else the smallest N
        "undistort": True,  # real data: undistort lens-distorted captures to pinhole images (False: ignore, warn)
        "cache_dir": None,  # real data, data.cache on: folder of decoded views (None: $XDG_CACHE_HOME/hrope/images)
        "workers": 0,  # real data: threads decoding the views of one example (0: the loading thread)
    },
    "train": {
        "out": "runs/default",
        "steps": 1000,
        "batch_size": 4,
        "lr": 4e-4,
        "min_lr_ratio": 0.1,
        "warmup": 100,
        "weight_decay": 0.05,
        "grad_clip": 1.0,  # gradient-norm bound, > 0 (clipping is always on; a large value is a no-op)
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

DEVICES = ("auto", "cpu", "cuda")
DEPTH_SOURCES = ("none", "points", "maps")  # data.depth (hrope.nvs.data.real.depth_maps)
_COUNT = Field("int", low=1)
_SEED = Field("int", low=0, high=2**63 - 1)
_NON_NEGATIVE = Field("float", low=0)
_OPTIONAL_PATH = Field("path", nullable=True)

# What every data / train / eval key of DEFAULTS accepts (checked by check_config).
SCHEMA: dict[str, dict[str, Field]] = {
    "data": {
        "kind": Field("str"),  # the known kinds are checked where the dataset is built (hrope.nvs.build_data)
        "root": _OPTIONAL_PATH,
        "eval_root": _OPTIONAL_PATH,
        "eval_index": _OPTIONAL_PATH,
        "context_gap": Field("range", nullable=True),  # and low >= num_context - 1 (check_config)
        "num_scenes": Field("int", low=1, nullable=True),
        "num_context": _COUNT,
        "num_target": _COUNT,
        "seed": _SEED,
        "cache": Field("bool"),
        "prefetch": Field("bool"),
        "synthetic": Field("mapping", nullable=True),  # its keys: hrope.nvs.build_data.synthetic_config
        "depth": Field("str", choices=DEPTH_SOURCES),
        "depth_scale": Field("float", above=0),
        "image_factor": Field("int", low=1, nullable=True),
        "undistort": Field("bool"),
        "cache_dir": _OPTIONAL_PATH,
        "workers": Field("int", low=0),
    },
    "train": {
        "out": Field("path"),
        "steps": _COUNT,
        "batch_size": _COUNT,
        "lr": Field("float", above=0),
        "min_lr_ratio": Field("float", low=0, high=1),
        "warmup": Field("int", low=0),
        "weight_decay": _NON_NEGATIVE,
        "grad_clip": Field("float", above=0),
        "bf16": Field("bool"),
        "seed": _SEED,
        "device": Field("str", choices=DEVICES),  # availability: check_device, where the device is chosen
        "log_every": _COUNT,
        "image_every": Field("int", low=0),  # 0: no image grids
        "checkpoint_every": _COUNT,
        "perceptual_weight": _NON_NEGATIVE,
        "parameter_lr_scale": _NON_NEGATIVE,
        "threads": Field("int", low=0),
        "max_nonfinite_steps": _COUNT,
        "init_from": _OPTIONAL_PATH,
    },
    "eval": {
        "num_scenes": Field("int", low=1, nullable=True),
        "batch_size": _COUNT,
        "lpips_weights": _OPTIONAL_PATH,
        "num_grid_scenes": Field("int", low=0),
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


def check_config(config: dict) -> dict:
    """``config`` itself when every ``data`` / ``train`` / ``eval`` value is one :data:`SCHEMA`
    accepts; otherwise a :class:`ConfigError` naming the first bad key."""
    for section, fields in SCHEMA.items():
        for key, field in fields.items():
            field.check(f"{section}.{key}", config[section][key])
    data = config["data"]
    if data["context_gap"] is not None and data["context_gap"][0] < data["num_context"] - 1:
        raise ConfigError(f"data.context_gap {data['context_gap']} must have low >= data.num_context - 1 = "
                          f"{data['num_context'] - 1} (distinct context frames)")
    return config


def check_device(name, key: str = "train.device") -> torch.device:
    """The torch device of a device option (one of :data:`DEVICES`; ``auto`` is CUDA when
    available); a :class:`ConfigError` naming ``key`` otherwise, and for ``cuda`` without CUDA."""
    Field("str", choices=DEVICES).check(key, name)
    available = torch.cuda.is_available()
    if name == "cuda" and not available:
        raise ConfigError(f"{key} is 'cuda' but torch.cuda.is_available() is False (no CUDA device or a CPU-only "
                          f"torch build); use cpu or auto")
    return torch.device("cuda" if available and name != "cpu" else "cpu")


def resolve(values: dict | None = None) -> dict:
    """Defaults updated with ``values``, validated (:func:`check_config`; unknown sections/keys
    raise :class:`ConfigError` too)."""
    if values is not None and not isinstance(values, dict):
        raise ConfigError(f"a config must be a mapping of sections, got {type(values).__name__}")
    return check_config(_merge(DEFAULTS, values or {}))


def update_config(config: dict, values: dict) -> dict:
    """``config`` updated with ``{section: {key: value}}``, validated (unknown sections/keys raise)."""
    return check_config(_merge(config, values))


def load_config(path: str | Path) -> dict:
    """Read and resolve a YAML config file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        values = yaml.safe_load(path.read_text())
    except UnicodeDecodeError:
        raise ConfigError(f"{path} is not a UTF-8 text file (a YAML config)") from None
    except yaml.YAMLError as error:
        raise ConfigError(f"{path} is not valid YAML: {one_line(error)}") from None
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
    """Apply ``["--train.lr", "1e-3", "--encoding", "prope", ...]`` (also ``--key=value``), validated."""
    return update_config(config, parse_overrides(args))


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
