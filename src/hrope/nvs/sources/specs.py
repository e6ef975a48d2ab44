"""What each per-token encoding input is and how a raw head output decodes into it.

A :class:`ParameterSpec` says how ``raw_dim`` head outputs per token decode into one input of an
encoding; :func:`parameter_specs` lists the specs an encoding needs. Zero raw output decodes to the
input's neutral value (see :mod:`hrope.nvs.sources`). Values are dicts ``{name: tensor (B, N, ...)}``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from ...cameras import Cameras
from ...encodings import Encoding
from ...geometry import make_se3, patch_rays
from ...planes import Planes, plane_vectors
from ..config import PLANE_DECODERS
from .errors import PredictorError

__all__ = [
    "ParameterSpec",
    "parameter_specs",
    "default_plane_decoder",
    "encoding_inputs",
    "flatten_values",
    "axis_angle_to_matrix",
    "token_rays",
    "FACING_NORMAL",
]

# Learned-head values at zero output for the query-frame encodings' uncertainty parameters.
RAYROPE_INIT_HALFWIDTH = 3.0  # RayRoPE's init_sigma (log-depth half-width)
WORLDROPE_INIT_SIGMA = 0.25  # fraction of depth_init

# Default camera-facing normal of a predicted plane (camera frame, OpenCV: z forward).
FACING_NORMAL = (0.0, 0.0, -1.0)


def token_rays(cameras: Cameras, grid: tuple[int, int]) -> Tensor:
    """Patch-centre rays ``(B, N, 3)`` (z = 1) of every token."""
    return patch_rays(cameras.normalized_K(torch.float32), grid).flatten(1, 2)


def _unit_normal(offset: Tensor) -> Tensor:
    base = torch.tensor(FACING_NORMAL, dtype=offset.dtype, device=offset.device)
    return F.normalize(base + offset, dim=-1)


def axis_angle_to_matrix(axis_angle: Tensor) -> Tensor:
    """Rotation matrices ``(..., 3, 3)`` from axis-angle vectors ``(..., 3)`` (exp of the skew matrix)."""
    x, y, z = axis_angle.unbind(-1)
    zero = torch.zeros_like(x)
    skew = torch.stack([zero, -z, y, z, zero, -x, -y, x, zero], -1).reshape(*axis_angle.shape, 3)
    return torch.linalg.matrix_exp(skew)


@dataclass(frozen=True)
class ParameterSpec:
    """How ``raw_dim`` head outputs per token decode into one encoding input.

    ``decode(raw (B, N, raw_dim), cameras, grid) -> value (B, N, ...)``; ``embed_dim`` is the size
    of the flattened value (the APE variants embed it).
    """

    name: str
    raw_dim: int
    embed_dim: int
    decode: Callable[[Tensor, Cameras, tuple[int, int]], Tensor]


def _plane_decoder(kind: str, neutral: str | None, depth_init: float) -> tuple[int, Callable]:
    """``(raw_dim, decode)`` of a plane head. Zero output decodes to the encoding's neutral planes.

    ``direct``: m = m0 + raw / depth_init (3 outputs; Jacobian I / depth_init, full rank everywhere),
    m0 = 0 (plane at infinity) or the fronto-parallel plane at depth_init, (0, 0, 1 / depth_init).
    ``normal-depth``: raw = (normal offset a (3), b), n = normalise(n0 + a) facing the camera; for
    the plane at infinity m = b n / (n·r̂) (signed inverse depth b: its Jacobian at zero has rank 1,
    the normal gets no gradient until b moves), otherwise a positive z-depth depth_init · exp(b)
    on the patch-centre ray (rank 3 at zero; every plane crosses every ray in front of the camera).
    """
    if kind == "direct":

        def direct(raw, cameras, grid):
            m = raw / depth_init
            return m if neutral == "infinity" else m + torch.tensor([0.0, 0.0, 1.0 / depth_init]).to(m)

        return 3, direct
    if neutral == "infinity":

        def signed_inverse_depth(raw, cameras, grid):
            return plane_vectors(_unit_normal(raw[..., :3]), raw[..., 3], token_rays(cameras, grid))

        return 4, signed_inverse_depth

    def positive_depth(raw, cameras, grid):
        inverse_depth = torch.exp(-raw[..., 3]) / depth_init
        return plane_vectors(_unit_normal(raw[..., :3]), inverse_depth, token_rays(cameras, grid))

    return 4, positive_depth


def _shifted(offset: float):
    return lambda raw, cameras, grid: raw[..., 0] + offset


def _scaled(scale: float):
    return lambda raw, cameras, grid: scale * raw[..., 0]


def _positive(scale: float, scalar: bool = False):
    if scalar:
        return lambda raw, cameras, grid: scale * torch.exp(raw[..., 0])
    return lambda raw, cameras, grid: scale * torch.exp(raw)


def _rotation(raw, cameras, grid):
    return axis_angle_to_matrix(raw)


def _rigid(raw, cameras, grid):
    return make_se3(axis_angle_to_matrix(raw[..., :3]), raw[..., 3:])


def _full(raw, cameras, grid):
    """G = exp(A) for the 16 raw outputs A: identity at zero output and never singular
    (det G = e^{tr A} > 0); I + A let training drive some tokens' G towards singular matrices,
    whose inverses blew the gradients up (docs/model.md)."""
    return torch.linalg.matrix_exp(raw.reshape(*raw.shape[:-1], 4, 4))


def _offset(raw, cameras, grid):
    """The raw outputs as a translation (zero at zero output), as ``_rigid``'s translation."""
    return raw


def default_plane_decoder(encoding: Encoding) -> str:
    """``direct`` where the neutral planes are at infinity (the only full-rank choice there), else
    ``normal-depth`` (full rank, and every plane stays in front of the camera, which ``hrope-pf``
    needs)."""
    return "direct" if encoding.neutral_planes == "infinity" else "normal-depth"


def parameter_specs(
    encoding: Encoding, depth_init: float = 1.0, plane_decoder: str | None = None
) -> list[ParameterSpec]:
    """The per-token inputs ``encoding`` needs, with their learned-head decoders (those it reads from
    data, ``data_param_names``, are left to the caller).

    Planes decode with ``plane_decoder`` (:data:`PLANE_DECODERS`, default
    :func:`default_plane_decoder`); zero output gives the encoding's ``neutral_planes``:
    ``hrope-lift`` the plane at infinity (so it starts as PRoPE), ``hrope`` and ``hrope-pf`` the
    fronto-parallel plane at ``depth_init`` (for ``hrope`` the plane at infinity would reduce H to
    K̂R and drop the camera translation; ``hrope-pf`` needs a point on the ray, so it takes only
    ``normal-depth``).
    """
    specs = []
    if encoding.needs_planes:
        kind = plane_decoder or default_plane_decoder(encoding)
        if kind not in PLANE_DECODERS:
            raise PredictorError(f"unknown plane_decoder {kind!r}; available: {', '.join(PLANE_DECODERS)}")
        if kind == "direct" and encoding.planes_in_front:
            raise PredictorError(
                f"{encoding.name} needs planes in front of every camera: use plane_decoder 'normal-depth'"
            )
        raw_dim, decode = _plane_decoder(kind, encoding.neutral_planes, depth_init)
        specs.append(ParameterSpec("planes", raw_dim, 3, decode))
    transform = _full if encoding.transform_kind == "invertible" else _rigid
    table = {
        "depth": ParameterSpec("depth", 1, 1, _positive(depth_init, scalar=True)),
        "rotation": ParameterSpec("rotation", 3, 9, _rotation),
        "transform": ParameterSpec("transform", 16 if transform is _full else 6, 16, transform),
        # rayrope (RayRoPE's head: raw outputs in log-depth, init (log depth_init, 3))
        "log_depth": ParameterSpec("log_depth", 1, 1, _shifted(math.log(depth_init))),
        "log_depth_halfwidth": ParameterSpec("log_depth_halfwidth", 1, 1, _shifted(RAYROPE_INIT_HALFWIDTH)),
        # worldrope: one hypothesis at init (split 0), sigmas WORLDROPE_INIT_SIGMA * depth_init
        "depth_split": ParameterSpec("depth_split", 1, 1, _scaled(depth_init)),
        "depth_sigma": ParameterSpec("depth_sigma", 2, 2, _positive(WORLDROPE_INIT_SIGMA * depth_init)),
        # hrope pose="per-patch": E_u = [[ΔR, Δt], [0, 1]] E_c, the camera pose at zero output
        "patch_rotation": ParameterSpec("patch_rotation", 3, 9, _rotation),
        "patch_translation": ParameterSpec("patch_translation", 3, 3, _offset),
    }
    for name in encoding.param_names:
        if name in encoding.data_param_names:  # fed from data (e.g. a depth source), not a learned head
            continue
        if name not in table:
            raise PredictorError(
                f"no learned decoder for parameter {name!r} of encoding {encoding.name!r}; "
                f"known: {sorted(table)} (add one to hrope.nvs.sources.specs.parameter_specs)"
            )
        specs.append(table[name])
    return specs


def encoding_inputs(values: dict[str, Tensor]) -> tuple[Planes | None, dict[str, Tensor]]:
    """Split decoded values into ``(planes, params)`` for ``Encoding.prepare``."""
    params = dict(values)
    m = params.pop("planes", None)
    return (Planes.from_m(m) if m is not None else None), params


def flatten_values(values: dict[str, Tensor], specs: list[ParameterSpec]) -> Tensor:
    """Concatenate decoded values ``(B, N, sum embed_dim)`` in spec order (the APE input)."""
    return torch.cat([values[s.name].reshape(*values[s.name].shape[:2], -1) for s in specs], dim=-1)
