"""Resolving a run config: the defaults (:mod:`hrope.nvs.config.schema`) updated from a YAML file and
``--section.key value`` overrides, checked once as a :class:`~hrope.nvs.config.RunConfig`."""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

from ..running.atomic import write_text
from .fields import ConfigError, did_you_mean, one_line
from .run import RunConfig
from .schema import OPEN_SECTIONS, SETTINGS, SHORTCUTS, defaults

__all__ = [
    "load_config",
    "apply_overrides",
    "parse_overrides",
    "parse_value",
    "update_config",
    "resolve",
    "save_config",
]


def _merge(base: dict, update: dict, where: str = "") -> dict:
    out = copy.deepcopy(base)
    for key, value in update.items():
        path = f"{where}{key}"
        if where == "" and key not in base:
            raise ConfigError(f"unknown config section {key!r}; {did_you_mean(key, base)}known: {sorted(base)}")
        section = where.rstrip(".")
        if where and section not in OPEN_SECTIONS and key not in SETTINGS[section]:  # a plain form omits sparse keys
            known = SETTINGS[section]
            raise ConfigError(
                f"unknown config key {path!r}; {did_you_mean(key, known, where)}known in {section!r}: {sorted(known)}"
            )
        if isinstance(base.get(key), dict) and where == "":
            if not isinstance(value, dict):
                raise ConfigError(f"config section {path!r} must be a mapping, got {type(value).__name__}")
            out[key] = _merge(base[key], value, f"{path}.")
        else:
            out[key] = copy.deepcopy(value)
    return out


def resolve(values: dict | None = None) -> RunConfig:
    """The defaults updated with ``values`` (``{section: {key: value}}``), checked (unknown sections
    and keys raise :class:`ConfigError` too)."""
    if values is not None and not isinstance(values, dict):
        raise ConfigError(f"a config must be a mapping of sections, got {type(values).__name__}")
    return RunConfig.from_dict(_merge(defaults(), values or {}))


def update_config(config: RunConfig, values: dict) -> RunConfig:
    """``config`` updated with ``{section: {key: value}}``, checked (unknown sections/keys raise)."""
    return RunConfig.from_dict(_merge(config.to_dict(), values))


def load_config(path: str | Path) -> RunConfig:
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
    except ConfigError as error:  # its class kept (a ModelError, a PredictorError)
        raise type(error)(f"{path}: {error}") from None


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


def apply_overrides(config: RunConfig, args: list[str]) -> RunConfig:
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


def save_config(config: RunConfig, folder: str | Path) -> Path:
    """Write the config's plain form to ``folder/config.yaml`` (whole: :mod:`hrope.nvs.running.atomic`)."""
    path = Path(folder) / "config.yaml"
    write_text(path, yaml.safe_dump(config.to_dict(), sort_keys=False))
    return path
