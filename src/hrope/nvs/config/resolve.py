"""Resolving a run config: the defaults (:mod:`hrope.nvs.config.schema`) updated from a YAML file and
``--section.key value`` overrides, validated (:func:`check_config`)."""

from __future__ import annotations

import copy
from pathlib import Path

import torch
import yaml

from ..running.atomic import write_text
from .fields import ConfigError, Field, did_you_mean, one_line
from .schema import DEVICES, OPEN_SECTIONS, SETTINGS, SHORTCUTS, defaults

__all__ = [
    "load_config",
    "apply_overrides",
    "parse_overrides",
    "parse_value",
    "update_config",
    "resolve",
    "check_config",
    "check_device",
    "setting_value",
    "save_config",
]


def _merge(base: dict, update: dict, where: str = "") -> dict:
    out = copy.deepcopy(base)
    for key, value in update.items():
        path = f"{where}{key}"
        if where == "" and key not in base:
            raise ConfigError(f"unknown config section {key!r}; {did_you_mean(key, base)}known: {sorted(base)}")
        section = where.rstrip(".")
        if where and key not in base and section not in OPEN_SECTIONS and key not in SETTINGS[section]:
            raise ConfigError(
                f"unknown config key {path!r}; {did_you_mean(key, base, where)}known in {section!r}: {sorted(base)}"
            )
        if isinstance(base.get(key), dict) and where == "":
            if not isinstance(value, dict):
                raise ConfigError(f"config section {path!r} must be a mapping, got {type(value).__name__}")
            out[key] = _merge(base[key], value, f"{path}.")
        else:
            out[key] = copy.deepcopy(value)
    return out


def check_config(config: dict) -> dict:
    """``config`` itself when its setting (:data:`hrope.nvs.config.schema.SETTINGS`) accepts every
    ``data`` / ``train`` / ``eval`` value; otherwise a :class:`ConfigError` naming the first bad key
    (``model`` values are checked by :class:`hrope.nvs.model.ModelConfig`)."""
    for section, entries in SETTINGS.items():
        if section not in OPEN_SECTIONS:
            for key, declared in entries.items():
                if declared.shown or key in config[section]:
                    declared.check.check(f"{section}.{key}", config[section][key])
    data = config["data"]
    if data["context_gap"] is not None and data["context_gap"][0] < data["num_context"] - 1:
        raise ConfigError(
            f"data.context_gap {data['context_gap']} must have low >= data.num_context - 1 = "
            f"{data['num_context'] - 1} (distinct context frames)"
        )
    return config


def setting_value(values: dict, section: str, key: str):
    """``values[key]`` of a resolved config's ``section`` (the dict ``config[section]``), or the
    setting's default where the config leaves it out (a setting declared with ``shown=False``:
    written only when given, so that the resolved defaults, and the hashes of saved configs, stay
    as they were before it existed)."""
    return values[key] if key in values else SETTINGS[section][key].default


def check_device(name, key: str = "train.device") -> torch.device:
    """The torch device of a device option (one of :data:`DEVICES`; ``auto`` is CUDA when
    available); a :class:`ConfigError` naming ``key`` otherwise, and for ``cuda`` without CUDA."""
    Field("str", choices=DEVICES).check(key, name)
    available = torch.cuda.is_available()
    if name == "cuda" and not available:
        raise ConfigError(
            f"{key} is 'cuda' but torch.cuda.is_available() is False (no CUDA device or a CPU-only "
            f"torch build); use cpu or auto"
        )
    return torch.device("cuda" if available and name != "cpu" else "cpu")


def resolve(values: dict | None = None) -> dict:
    """Defaults updated with ``values``, validated (:func:`check_config`; unknown sections/keys
    raise :class:`ConfigError` too)."""
    if values is not None and not isinstance(values, dict):
        raise ConfigError(f"a config must be a mapping of sections, got {type(values).__name__}")
    return check_config(_merge(defaults(), values or {}))


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
            options = [*SHORTCUTS, *(f"{s}.{k}" for s, entries in SETTINGS.items() for k in entries)]
            raise ConfigError(
                f"unknown option --{key}; {did_you_mean(key, options, '--')}use --section.key (sections: "
                f"{sorted(SETTINGS)}) or one of {['--' + s for s in SHORTCUTS]}"
            )
        updates.setdefault(section, {})[name] = parse_value(value)
    return updates


def save_config(config: dict, folder: str | Path) -> Path:
    """Write the resolved config to ``folder/config.yaml`` (whole: :mod:`hrope.nvs.running.atomic`)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "config.yaml"
    write_text(path, yaml.safe_dump(config, sort_keys=False))
    return path
