"""The sources by name: their options (``predictor_options``), checked, and the source they build."""

from __future__ import annotations

from ..config import Field
from ..plane_fitting import FALLBACKS, FITS
from .backbone import BackboneSource
from .base import SCOPES, TARGETS, ParameterSource
from .errors import PredictorError
from .external import ExternalSource
from .known_planes import DEFAULT_MAX_INVERSE_DISTANCE
from .learned import LearnedSource
from .oracle import OracleSource
from .specs import ParameterSpec
from .user_modules import user_module

__all__ = ["PREDICTORS", "SOURCE_OPTIONS", "SOURCE_TARGETS", "OPTION_FIELDS", "source_options",
           "build_parameter_source"]

PREDICTORS = ("learned", "backbone", "external", "oracle")


# every source's options (predictor_options) with their defaults; "targets" choices per source
SOURCE_OPTIONS = {
    "learned": {"plane_decoder": None, "per_layer": True, "per_head": False, "targets": "hidden"},
    "backbone": {"plane_decoder": None, "module": None, "module_kwargs": {}, "checkpoint": None, "feature_dim": None,
                 "hidden_dim": 64, "targets": "neutral"},
    "external": {"use_normals": True, "scope": "context", "targets": "neutral", "depth": "data",
                 "fit": "least-squares", "min_points": 5, "inlier_threshold": 0.02, "fallback": "median",
                 "module": None, "module_kwargs": {}, "checkpoint": None, "align": "median",
                 "max_inverse_distance": DEFAULT_MAX_INVERSE_DISTANCE},
    "oracle": {"scope": "context", "targets": "neutral", "max_inverse_distance": DEFAULT_MAX_INVERSE_DISTANCE},
}
SOURCE_TARGETS = {"learned": TARGETS, "backbone": ("neutral", "transfer"), "external": ("neutral", "transfer"),
                  "oracle": ("neutral", "transfer")}
# what the options accept, where more than one value type or choice would be wrong
OPTION_FIELDS = {
    "scope": Field("str", choices=SCOPES), "per_layer": Field("bool"), "per_head": Field("bool"),
    "use_normals": Field("bool"),
    "depth": Field("str", choices=("data", "model")), "fit": Field("str", choices=FITS),
    "min_points": Field("int", low=3), "inlier_threshold": Field("float", above=0),
    "fallback": Field("str", choices=FALLBACKS), "align": Field("str", choices=("median", "none")),
    "max_inverse_distance": Field("float", above=0, nullable=True),
}


def source_options(name: str, options: dict | None) -> dict:
    """``options`` of parameter source ``name`` completed with the defaults; unknown keys and bad
    choices raise :class:`PredictorError` naming the key and what is accepted."""
    if name not in SOURCE_OPTIONS:
        raise PredictorError(f"unknown predictor {name!r}; available: {', '.join(PREDICTORS)}")
    known = SOURCE_OPTIONS[name]
    unknown = sorted(set(options or {}) - set(known))
    if unknown:
        raise PredictorError(f"unknown predictor_options {unknown} for predictor {name!r}; known: {sorted(known)}")
    values = {**known, **(options or {})}
    if values["targets"] not in SOURCE_TARGETS[name]:
        raise PredictorError(f"predictor_options.targets must be one of {list(SOURCE_TARGETS[name])} for predictor "
                             f"{name!r}, got {values['targets']!r}")
    for key, field in OPTION_FIELDS.items():
        if key in values:
            field.check(f"predictor_options.{key}", values[key], PredictorError)
    if values.get("scope") == "all" and "targets" in (options or {}):
        raise PredictorError("predictor_options.scope 'all' reads the target views' own geometry; it takes no "
                             "targets option")
    if name == "external" and (values["module"] is not None) != (values["depth"] == "model"):
        raise PredictorError("predictor_options.module is the depth model of depth: model (and it needs one); got "
                             f"depth {values['depth']!r} with module {values['module']!r}")
    return values


def build_parameter_source(name: str, specs: list[ParameterSpec], *, dim: int, num_layers: int, patch_size: int,
                           options: dict | None = None, depth_init: float = 1.0,
                           attention_heads: int = 1) -> ParameterSource:
    """A parameter source by name with its ``options`` (:data:`SOURCE_OPTIONS`): ``targets`` and, for
    ``oracle`` / ``external``, ``scope`` (see :class:`ParameterSource`); for ``learned``
    ``per_layer`` and ``per_head`` (one set of values for each of the ``attention_heads``); for
    ``backbone`` a ``module`` (nn.Module or import path ``'pkg.mod:factory'`` + ``module_kwargs``),
    a local ``checkpoint`` path, ``feature_dim`` and ``hidden_dim``; for
    ``external`` ``use_normals``, ``fit`` (+ ``min_points``, ``inlier_threshold``, ``fallback``) and
    ``depth`` (``data``, or ``model``: a depth model given like the backbone, + ``align``), see
    :class:`ExternalSource`; for ``oracle`` and ``external`` ``max_inverse_distance``
    (:class:`GeometrySource`); ``plane_decoder`` is read by :func:`parameter_specs`.
    ``depth_init``: the depth that ``external`` and ``oracle`` use for patches whose plane never
    crosses the patch-centre ray."""
    takes_planes = "planes" in {s.name for s in specs}
    options = source_options(name, options)
    if options["targets"] == "transfer" and name in ("learned", "backbone") and not takes_planes:
        raise PredictorError("predictor_options.targets 'transfer' carries planes over from the context views: it "
                             "needs an encoding that takes planes")
    if name == "learned":
        return LearnedSource(specs, dim, num_layers, options["per_layer"], options["targets"],
                             attention_heads if options["per_head"] else 1)
    if name == "oracle":
        return OracleSource(specs, patch_size, depth_init, options["targets"], options["scope"],
                            options["max_inverse_distance"])
    if name == "external":
        depth_model = user_module(options, "predictor_options.depth 'model'") if options["depth"] == "model" else None
        return ExternalSource(specs, patch_size, use_normals=options["use_normals"], depth_init=depth_init,
                              targets=options["targets"], scope=options["scope"], fit=options["fit"],
                              min_points=options["min_points"], inlier_threshold=options["inlier_threshold"],
                              fallback=options["fallback"], depth_model=depth_model, align=options["align"],
                              max_inverse_distance=options["max_inverse_distance"])
    module = user_module(options, "the 'backbone' predictor")
    if options["feature_dim"] is None:
        raise PredictorError("the 'backbone' predictor needs predictor_options.feature_dim (channels C)")
    return BackboneSource(specs, module, int(options["feature_dim"]), int(options["hidden_dim"]), options["targets"])
