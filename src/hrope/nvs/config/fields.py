"""What one setting accepts (:class:`Field`) and how a section declares its settings (:func:`setting`).

A section is a dataclass whose fields are declared with :func:`setting`: the default, the
:class:`Field` that checks a value, a one-line doc and flags (:class:`Setting`). :func:`settings_of`
reads them back as ``{name: Setting}`` in declaration order.
"""

from __future__ import annotations

import copy
import difflib
import math
from dataclasses import MISSING, dataclass, field, fields

from torch import nn

from ...errors import InputError

__all__ = [
    "ConfigError",
    "ModelError",
    "PredictorError",
    "Field",
    "Setting",
    "setting",
    "settings_of",
    "check_fields",
    "given_field",
    "given_values",
    "plain_values",
    "did_you_mean",
    "one_line",
]


class ConfigError(InputError):
    """A malformed config file or override (the message names the key)."""


class ModelError(ConfigError):
    """Invalid model configuration or input."""


class PredictorError(ConfigError):
    """Invalid predictor configuration or missing inputs (the message says what to supply)."""


def one_line(text: object) -> str:
    """``str(text)`` with its line breaks (and runs of whitespace) collapsed to single spaces."""
    return " ".join(str(text).split())


def did_you_mean(name: str, known, prefix: str = "") -> str:
    """``"did you mean <prefix><closest>? "`` for the known name closest to ``name`` (``""`` when none is close)."""
    close = difflib.get_close_matches(str(name), [str(k) for k in known], n=1)
    return f"did you mean {prefix}{close[0]}? " if close else ""


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return (_is_int(value) or isinstance(value, float)) and _is_finite(value)


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
    """What one config value accepts.

    ``kind``: ``int``, ``float`` (ints too; finite), ``bool``, ``str`` / ``path`` (a non-empty
    string), ``mapping``, ``module`` (an ``nn.Module`` or a non-empty import path), ``names`` (a list of
    distinct non-empty strings), ``color`` (a list ``[r, g, b]`` of numbers in [0, 1]), ``range`` (a list
    ``[low, high]`` of integers, ``max(0, low bound) <= low <= high``) or ``pair`` (a list
    ``[low, high]`` of finite numbers, ``low <= high``, both within the bounds).
    ``low`` / ``high``: inclusive bounds, ``above`` / ``below``: exclusive bounds; ``choices``: the
    accepted strings; ``nullable``: None is accepted too.
    """

    kind: str
    low: int | float | None = None
    high: int | float | None = None
    above: int | float | None = None
    below: int | float | None = None
    choices: tuple[str, ...] = ()
    nullable: bool = False

    def accepts(self, value) -> bool:
        if value is None:
            return self.nullable
        if self.kind in ("range", "pair"):
            element = _is_int if self.kind == "range" else _is_number
            return (
                isinstance(value, (list, tuple))
                and len(value) == 2
                and all(map(element, value))
                and value[0] <= value[1]
                and self._in_bounds(value[0])
                and self._in_bounds(value[1])
                and (self.kind == "pair" or value[0] >= 0)
            )
        if self.kind == "names":
            names = isinstance(value, (list, tuple)) and all(isinstance(v, str) and v for v in value)
            return names and len(set(value)) == len(value)
        if self.kind == "color":
            return (
                isinstance(value, (list, tuple))
                and len(value) == 3
                and all(_is_number(v) and 0 <= v <= 1 for v in value)
            )
        if self.kind == "int":
            return _is_int(value) and self._in_bounds(value)
        if self.kind == "float":
            return _is_number(value) and self._in_bounds(value)
        if self.kind in ("str", "path"):
            return isinstance(value, str) and (value in self.choices if self.choices else value != "")
        if self.kind == "module":
            return isinstance(value, nn.Module) or (isinstance(value, str) and value != "")
        return isinstance(value, {"bool": bool, "mapping": dict}[self.kind])

    def _in_bounds(self, value) -> bool:
        return (
            (self.low is None or value >= self.low)
            and (self.high is None or value <= self.high)
            and (self.above is None or value > self.above)
            and (self.below is None or value < self.below)
        )

    def describe(self) -> str:
        """What the field accepts, in words (``a positive integer``, ``one of auto, cpu, cuda``)."""
        if self.choices:
            text = "one of " + ", ".join(self.choices)
        elif self.kind == "int" and self.low in (0, 1) and self.high is None:
            text = "a positive integer" if self.low == 1 else "a non-negative integer"
        elif self.kind == "range":
            text = f"a list [low, high] of integers with {self.low or 0} <= low <= high"
        else:
            text = {
                "int": "an integer",
                "float": "a finite number",
                "bool": "true or false",
                "str": "a non-empty string",
                "path": "a path (a non-empty string)",
                "mapping": "a mapping",
                "module": "an nn.Module or an import path 'package.module:factory'",
                "pair": "a list [low, high] of finite numbers with low <= high",
                "names": "a list of distinct non-empty strings",
                "color": "a list [r, g, b] of numbers in [0, 1]",
            }[self.kind]
            text += self._describe_bounds()
        return "null or " + text if self.nullable else text

    def _describe_bounds(self) -> str:
        if self.low is not None and self.high is not None:
            return f" in [{self.low}, {self.high}]"
        lower = f" >= {self.low}" if self.low is not None else f" > {self.above}" if self.above is not None else ""
        upper = f" < {self.below}" if self.below is not None else ""
        if self.kind == "pair" and (lower or upper):
            return " (each" + lower + ("," if lower and upper else "") + upper + ")"
        return lower + ("," if lower and upper else "") + upper

    def check(self, key: str, value, error: type[Exception] = ConfigError) -> None:
        """Raise ``error`` naming ``key`` and what it accepts when ``value`` is not accepted."""
        if not self.accepts(value):
            raise error(f"{key} must be {self.describe()}, got {_show(value)}")


@dataclass(frozen=True)
class Setting:
    """One declared setting: ``name``, ``default``, the :class:`Field` ``check`` and a one-line ``doc``.

    ``resume``: the value may differ when a run resumes (it does not change the trajectory);
    ``shown``: written into the resolved config when not given (only ``model`` has unshown keys: their
    values come from the preset); ``sparse``: written into a plain form only off its default (a
    setting added after configs, checkpoints and saved models were first written, so that theirs
    keep their form and hashes: :func:`plain_values`); ``shortcut``: a command-line alias (``--lr``).
    """

    name: str
    default: object
    check: Field
    doc: str
    resume: bool = False
    shown: bool = True
    sparse: bool = False
    shortcut: str | None = None


def setting(default, check: Field, doc: str, **flags):
    """A dataclass field declaring one :class:`Setting` (``flags``: its ``resume``, ``shown``,
    ``sparse``, ``shortcut``); a mapping or list default is copied for every instance."""
    metadata = {"setting": (check, doc, flags)}
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda: copy.deepcopy(default), metadata=metadata)
    return field(default=default, metadata=metadata)


def settings_of(section) -> dict[str, Setting]:
    """``{name: Setting}`` of a dataclass declared with :func:`setting`, in declaration order."""
    out = {}
    for entry in fields(section):
        if "setting" not in entry.metadata:  # bookkeeping, e.g. given_field()
            continue
        check, doc, flags = entry.metadata["setting"]
        default = entry.default if entry.default_factory is MISSING else entry.default_factory()
        out[entry.name] = Setting(entry.name, default, check, doc, **flags)
    return out


def check_fields(instance, prefix: str, error: type[Exception]) -> None:
    """Check every field of a dataclass ``instance`` declared with :func:`setting`; ``error`` names
    ``<prefix>.<field>`` and what it accepts."""
    for name, declared in settings_of(type(instance)).items():
        declared.check.check(f"{prefix}.{name}", getattr(instance, name), error)


def given_field():
    """A dataclass field holding the names of the settings given explicitly, in the order given
    (None: every setting): a section whose plain form lists only those (:func:`given_values`)."""
    return field(default=None, kw_only=True, compare=False, repr=False)


def given_values(instance) -> dict:
    """``{name: value}`` of the settings of ``instance`` named by its ``given`` field (every setting
    when it is None), in that order: the section as a config file writes it."""
    names = settings_of(type(instance)) if instance.given is None else instance.given
    return {name: getattr(instance, name) for name in names}


def plain_values(instance) -> dict:
    """``{name: value}`` of the settings of ``instance`` as a plain form writes them: every one, except
    a ``sparse`` setting at its default (so a setting added later changes no form written before it)."""
    return {
        name: getattr(instance, name)
        for name, declared in settings_of(type(instance)).items()
        if not (declared.sparse and getattr(instance, name) == declared.default)
    }
