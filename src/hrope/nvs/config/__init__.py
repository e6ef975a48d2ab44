"""Run configuration: YAML files with ``--key value`` / dotted command-line overrides, validated.

Every setting is declared once in :mod:`hrope.nvs.config.schema` (default, accepted values as a
:class:`Field`, one-line doc, whether it may change on resume, its shortcut): :data:`SETTINGS`.
A config has four sections: ``model`` (``preset`` plus :class:`hrope.nvs.model.ModelConfig` fields,
whose defaults come from the preset), ``data``, ``train`` and ``eval`` (:func:`defaults` holds every
key). Overrides are ``--section.key value`` (value parsed as YAML, so ``1e-3``, ``true``, ``[1, 2]``
work) or one of the shortcuts in :data:`SHORTCUTS` (``--encoding prope``). Unknown sections, keys
and options are errors that suggest the closest known one. Every run writes its resolved config
(``config.yaml``) next to its outputs; ``hrope config`` prints it with each key's doc
(:mod:`hrope.nvs.config_docs`, which also writes docs/config.md).

Settings declared with ``shown=False`` (the model's architecture fields, and settings added
after configs were first saved) are written into a resolved config only when given; read them
with :func:`setting_value`, which falls back to the default.

Validation: :func:`resolve`, :func:`update_config`, :func:`apply_overrides` (so :func:`load_config`
and checkpoint metadata too) check every ``data`` / ``train`` / ``eval`` value against its setting
(:func:`check_config`): types (a bool is never a number; ints are accepted for floats), ranges
(floats finite), choices and null. ``model`` values are checked by
:class:`hrope.nvs.model.ModelConfig` when the model is built, ``data.kind`` where the dataset is
built (:mod:`hrope.nvs.build_data`), device availability by :func:`check_device`. Every error is a
:class:`ConfigError` with a one-line message naming the key and what it accepts.
``train.grad_clip`` is the gradient-norm bound, > 0: clipping is always on (a large value makes it
a no-op).
"""

from .fields import ConfigError, Field, Setting, check_fields, did_you_mean, one_line, setting, settings_of
from .resolve import (
    apply_overrides,
    check_config,
    check_device,
    load_config,
    parse_overrides,
    parse_value,
    resolve,
    save_config,
    setting_value,
    update_config,
)
from .schema import (
    DEFAULT_MAX_INVERSE_DISTANCE,
    DEPTH_SOURCES,
    DEVICES,
    PLANE_DECODERS,
    PREDICTORS,
    PRESET,
    SETTINGS,
    SHORTCUTS,
    SOURCE_OPTIONS,
    SOURCE_TARGETS,
    DataSettings,
    EvalSettings,
    ModelSettings,
    PredictorOptions,
    TrainSettings,
    defaults,
    source_options,
)

__all__ = [
    "ConfigError",
    "Field",
    "Setting",
    "setting",
    "settings_of",
    "check_fields",
    "did_you_mean",
    "one_line",
    "SETTINGS",
    "SHORTCUTS",
    "DEVICES",
    "DEPTH_SOURCES",
    "PLANE_DECODERS",
    "DEFAULT_MAX_INVERSE_DISTANCE",
    "PREDICTORS",
    "PRESET",
    "SOURCE_OPTIONS",
    "SOURCE_TARGETS",
    "ModelSettings",
    "PredictorOptions",
    "DataSettings",
    "TrainSettings",
    "EvalSettings",
    "defaults",
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
    "source_options",
]
