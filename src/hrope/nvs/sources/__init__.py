"""Per-patch parameter sources for the geometric encodings (DESIGN.md §4.4).

An encoding may need per-token inputs: ``planes`` (hrope, hrope-lift, hrope-pf) or named params
(``depth`` for hrope-depth, ``rotation`` for hrope-so3, ``transform`` for hrope-se3 / hrope-full,
and whatever a query-frame encoding declares in ``param_names``). A :class:`ParameterSpec` says
how a raw head output decodes into one such input; a source produces the inputs:

- ``learned`` (:class:`LearnedSource`): one zero-initialised linear head per layer on the
  layer's normalised input; every token (context and target) predicts from its own hidden state.
- ``backbone`` (:class:`BackboneSource`): a frozen user module on the context images, features
  resampled to the patch grid, a small trainable head (last layer zero-initialised).
- ``external`` (:class:`ExternalSource`): per-pixel depth (+ optional normals) of the batch (synthetic
  depth, depth maps or sparse COLMAP points: ``data.depth``) or of a frozen user depth model,
  fitted per patch by least squares (:meth:`hrope.Planes.from_depth`) or robustly
  (:func:`hrope.nvs.sources.plane_fitting.robust_patch_planes`).
- ``oracle`` (:class:`OracleSource`): the batch's ground-truth planes (``batch.planes(p)``).

Values are dicts ``{name: tensor (B, N, ...)}``; planes travel as their plane vector
``m (B, N, 3)`` (camera frame, :class:`hrope.Planes`). Zero raw output decodes to the "neutral"
value (hrope-lift planes: m = 0, the plane at infinity, so ``hrope-lift`` starts exactly as
``prope``; hrope / hrope-pf planes: fronto-parallel at ``depth_init``; rotation / transforms:
identity; depth: ``depth_init``).

Modules, each importing only the ones before it: ``errors``, ``specs`` (specs and decoders),
``base`` (:class:`ParameterSource`), ``learned``, ``user_modules`` (user code by import path),
``backbone``, ``known_planes`` (:class:`GeometrySource`), ``external``, ``oracle``, ``options``
(the sources by name, their options and :func:`build_parameter_source`).
"""

from __future__ import annotations

from .backbone import BackboneSource
from .base import ParameterSource, fold_heads, unfold_heads
from .errors import PredictorError
from .external import ExternalSource
from .known_planes import GeometrySource
from .learned import LearnedSource
from .options import build_parameter_source
from .oracle import OracleSource
from .specs import (
    ParameterSpec,
    axis_angle_to_matrix,
    default_plane_decoder,
    encoding_inputs,
    flatten_values,
    parameter_specs,
    token_rays,
)
from .user_modules import import_factory, load_backbone

__all__ = [
    "PredictorError",
    "ParameterSpec",
    "parameter_specs",
    "ParameterSource",
    "LearnedSource",
    "BackboneSource",
    "GeometrySource",
    "ExternalSource",
    "OracleSource",
    "build_parameter_source",
    "default_plane_decoder",
    "fold_heads",
    "unfold_heads",
    "encoding_inputs",
    "flatten_values",
    "load_backbone",
    "axis_angle_to_matrix",
    "token_rays",
    "import_factory",
]
