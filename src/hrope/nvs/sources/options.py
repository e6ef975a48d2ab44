"""The sources by name: their checked options (``predictor_options``, declared in
:class:`hrope.nvs.config.PredictorOptions`) and the source they build."""

from __future__ import annotations

from ..config import source_options
from .backbone import BackboneSource
from .base import ParameterSource
from .errors import PredictorError
from .external import ExternalSource
from .learned import LearnedSource
from .oracle import OracleSource
from .specs import ParameterSpec
from .user_modules import user_module

__all__ = ["build_parameter_source"]


def build_parameter_source(
    name: str,
    specs: list[ParameterSpec],
    *,
    dim: int,
    num_layers: int,
    patch_size: int,
    options: dict | None = None,
    depth_init: float = 1.0,
    attention_heads: int = 1,
    data_params: tuple[str, ...] = (),
) -> ParameterSource:
    """A parameter source by name with its ``options`` (:data:`hrope.nvs.config.SOURCE_OPTIONS`): ``targets`` and, for
    ``oracle`` / ``external``, ``scope`` (see :class:`ParameterSource`); for ``learned``
    ``per_layer`` and ``per_head`` (one set of values for each of the ``attention_heads``); for
    ``backbone`` a ``module`` (nn.Module or import path ``'pkg.mod:factory'`` + ``module_kwargs``),
    a local ``checkpoint`` path, ``feature_dim`` and ``hidden_dim``; for
    ``external`` ``use_normals``, ``fit`` (+ ``min_points``, ``inlier_threshold``, ``fallback``) and
    ``depth`` (``data``, or ``model``: a depth model given like the backbone, + ``align``),
    ``depth_noise`` and ``depth_sparse`` (the data's depth as users have it), see
    :class:`ExternalSource`; for ``oracle`` and ``external`` ``max_inverse_distance``
    (:class:`GeometrySource`); ``plane_decoder`` is read by :func:`parameter_specs`.
    ``depth_init``: the depth that ``external`` and ``oracle`` use for patches whose plane never
    crosses the patch-centre ray. ``data_params``: the encoding's inputs read from data
    (``Encoding.data_param_names``, e.g. rayrope's ``known_depth``); only ``external`` reads them
    (off its depth maps)."""
    takes_planes = "planes" in {s.name for s in specs}
    options = source_options(name, options, PredictorError)
    if data_params and name != "external":
        raise PredictorError(
            f"the encoding reads {list(data_params)} from depth maps (rayrope's depth 'known' modes): "
            f"that needs model.predictor 'external', got {name!r}"
        )
    if options["targets"] == "transfer" and name in ("learned", "backbone") and not takes_planes:
        raise PredictorError(
            "predictor_options.targets 'transfer' carries planes over from the context views: it "
            "needs an encoding that takes planes"
        )
    if name == "learned":
        return LearnedSource(
            specs,
            dim,
            num_layers,
            options["per_layer"],
            options["targets"],
            attention_heads if options["per_head"] else 1,
        )
    if name == "oracle":
        return OracleSource(
            specs, patch_size, depth_init, options["targets"], options["scope"], options["max_inverse_distance"]
        )
    if name == "external":
        return _external_source(specs, patch_size, depth_init, options, data_params)
    return _backbone_source(specs, options)


def _external_source(
    specs: list[ParameterSpec], patch_size: int, depth_init: float, options: dict, data_params: tuple[str, ...]
) -> ExternalSource:
    """The ``external`` source of checked ``options``."""
    depth_model = user_module(options, "predictor_options.depth 'model'") if options["depth"] == "model" else None
    return ExternalSource(
        specs,
        patch_size,
        use_normals=options["use_normals"],
        depth_init=depth_init,
        targets=options["targets"],
        scope=options["scope"],
        fit=options["fit"],
        min_points=options["min_points"],
        inlier_threshold=options["inlier_threshold"],
        fallback=options["fallback"],
        depth_model=depth_model,
        align=options["align"],
        max_inverse_distance=options["max_inverse_distance"],
        data_params=data_params,
        depth_noise=options["depth_noise"],
        depth_sparse=options["depth_sparse"],
    )


def _backbone_source(specs: list[ParameterSpec], options: dict) -> BackboneSource:
    """The ``backbone`` source of checked ``options`` (its module imported or given)."""
    module = user_module(options, "the 'backbone' predictor")
    if options["feature_dim"] is None:
        raise PredictorError("the 'backbone' predictor needs predictor_options.feature_dim (channels C)")
    return BackboneSource(specs, module, int(options["feature_dim"]), int(options["hidden_dim"]), options["targets"])
