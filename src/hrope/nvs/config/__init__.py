"""Run configuration: YAML files with ``--key value`` / dotted command-line overrides, checked once
into a frozen, typed :class:`RunConfig`.

Every setting is declared once in :mod:`hrope.nvs.config.schema` (default, accepted values as a
:class:`Field`, one-line doc, whether it may change on resume, its shortcut): :data:`SETTINGS`; the
parameter sources' options in :mod:`hrope.nvs.config.options`.
A config has four sections, read as attributes: ``config.model`` (a :class:`ModelConfig`: ``preset``
plus the LVSM's fields, whose defaults come from the preset; ``config.model.predictor_options`` the
:class:`SourceOptions` of its parameter source), ``config.data``, ``config.train`` and
``config.eval`` (:func:`defaults` holds every key; a setting declared ``sparse`` is written into
a plain form only off its default). Overrides are ``--section.key value`` (value parsed as YAML,
so ``1e-3``, ``true``, ``[1, 2]`` work) or one of the shortcuts in :data:`SHORTCUTS`
(``--encoding prope``). Unknown sections, keys and options are errors that suggest the closest
known one. Every run writes its config's plain form (``config.yaml``,
:meth:`RunConfig.to_dict`) next to its outputs; ``hrope config`` prints it with each key's doc
(:mod:`hrope.nvs.config_docs`, which also writes docs/config.md).

Checks: :func:`resolve`, :func:`update_config`, :func:`apply_overrides` and :func:`load_config` (so
checkpoint metadata and saved models too) build a :class:`RunConfig`, which checks every value
against its setting, types (a bool is never a number; ints are accepted for floats), ranges
(floats finite), choices and null, and every rule across keys: the model's (:class:`ModelConfig`),
the parameter source's options (:func:`source_options`) and those across sections and of
``data.kind`` (:class:`RunConfig`). Device availability is checked where the device is chosen
(:func:`check_device`). Every error is a :class:`ConfigError` (a :class:`ModelError` for the
model section, a :class:`PredictorError` for the parameter source) with a one-line message naming
the key and what it accepts. ``train.grad_clip`` is the gradient-norm bound, > 0: clipping is
always on (a large value makes it a no-op).
"""

from .fields import (
    ConfigError,
    Field,
    ModelError,
    PredictorError,
    Setting,
    check_fields,
    did_you_mean,
    one_line,
    setting,
    settings_of,
)
from .options import (
    DEFAULT_MAX_INVERSE_DISTANCE,
    PLANE_DECODERS,
    PREDICTORS,
    SOURCE_OPTIONS,
    SOURCE_TARGETS,
    BackboneOptions,
    ExternalOptions,
    LearnedOptions,
    OracleOptions,
    SourceOptions,
    source_options,
)
from .schema import (
    DEPTH_SOURCES,
    DEVICES,
    PRESET,
    SETTINGS,
    SHORTCUTS,
    DataSettings,
    EvalSettings,
    ModelSettings,
    TrainSettings,
    check_device,
    defaults,
)
from .model_config import APE_ENCODINGS, PRESETS, ModelConfig, encoding_names
from .run import HARMLESS_ON_RESUME, RunConfig, harmless_on_resume, synthetic_settings
from .resolve import (
    apply_overrides,
    load_config,
    parse_overrides,
    parse_value,
    resolve,
    save_config,
    update_config,
)

__all__ = [
    "ConfigError",
    "ModelError",
    "PredictorError",
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
    "PRESETS",
    "APE_ENCODINGS",
    "SOURCE_OPTIONS",
    "SOURCE_TARGETS",
    "ModelSettings",
    "SourceOptions",
    "LearnedOptions",
    "BackboneOptions",
    "ExternalOptions",
    "OracleOptions",
    "DataSettings",
    "TrainSettings",
    "EvalSettings",
    "ModelConfig",
    "RunConfig",
    "HARMLESS_ON_RESUME",
    "harmless_on_resume",
    "encoding_names",
    "synthetic_settings",
    "defaults",
    "load_config",
    "apply_overrides",
    "parse_overrides",
    "parse_value",
    "update_config",
    "resolve",
    "check_device",
    "save_config",
    "source_options",
]
