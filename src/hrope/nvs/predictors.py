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
  (:func:`robust_patch_planes`).
- ``oracle`` (:class:`OracleSource`): the batch's ground-truth planes (``batch.planes(p)``).

Values are dicts ``{name: tensor (B, N, ...)}``; planes travel as their plane vector
``m (B, N, 3)`` (camera frame, :class:`hrope.Planes`). Zero raw output decodes to the "neutral"
value (hrope-lift planes: m = 0, the plane at infinity, so ``hrope-lift`` starts exactly as
``prope``; hrope / hrope-pf planes: fronto-parallel at ``depth_init``; rotation / transforms:
identity; depth: ``depth_init``).
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..cameras import Cameras
from ..encodings import Encoding, tangent_frames
from ..errors import InputError
from ..geometry import make_se3, patch_rays, patchify, pixel_rays
from ..planes import Planes, check_depth_maps, clamp_plane_vectors, plane_vectors
from .config.schema import (DEFAULT_MAX_INVERSE_DISTANCE, FALLBACKS, FITS, PLANE_DECODERS, SCOPES, TARGETS,
                            source_options)
from .transfer import transfer_depth, transfer_planes

__all__ = [
    "PredictorError", "ParameterSpec", "parameter_specs", "ParameterSource", "LearnedSource",
    "BackboneSource", "GeometrySource", "ExternalSource", "OracleSource", "build_parameter_source",
    "default_plane_decoder", "fold_heads", "unfold_heads", "encoding_inputs", "flatten_values", "load_backbone",
    "axis_angle_to_matrix", "token_rays",
    "patch_planes_from_normals", "import_factory", "robust_patch_planes",
]

# Learned-head values at zero output for the query-frame encodings' uncertainty parameters.
RAYROPE_INIT_HALFWIDTH = 3.0  # RayRoPE's init_sigma (log-depth half-width)
WORLDROPE_INIT_SIGMA = 0.25  # fraction of depth_init

# Default camera-facing normal of a predicted plane (camera frame, OpenCV: z forward).
FACING_NORMAL = (0.0, 0.0, -1.0)


class PredictorError(InputError):
    """Invalid predictor configuration or missing inputs (the message says what to supply)."""


# ----------------------------------------------------------------------------- decoding
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


def _plane_decoder(kind: str, neutral: str, depth_init: float) -> tuple[int, Callable]:
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


def parameter_specs(encoding: Encoding, depth_init: float = 1.0, plane_decoder: str | None = None) -> list[ParameterSpec]:
    """The per-token inputs ``encoding`` needs, with their learned-head decoders.

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
            raise PredictorError(f"{encoding.name} needs planes in front of every camera: use plane_decoder "
                                 "'normal-depth'")
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
        if name not in table:
            raise PredictorError(
                f"no learned decoder for parameter {name!r} of encoding {encoding.name!r}; "
                f"known: {sorted(table)} (add one to hrope.nvs.predictors.parameter_specs)"
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


# ----------------------------------------------------------------------------- sources


class ParameterSource(nn.Module):
    """Base class. Sources with ``predicts_in_layers`` predict from the blocks' normalised inputs
    (in every block when ``per_layer``, else once from the first); the others give one set of values
    per forward pass (``static``) for all views of the batch.

    ``targets`` says where the target views' values come from (a target view has no image):
    ``hidden`` (the target tokens' own hidden states; learned only), ``neutral`` (the decoders'
    zero-output values, e.g. hrope-lift's plane at infinity) or ``transfer`` (geometry carried over
    from the context views, :mod:`hrope.nvs.transfer`; target patches no context surface reaches
    stay neutral). ``scope="all"`` (oracle, external) reads the target views' own ground truth
    instead: an upper bound that uses target geometry, labelled as such (:meth:`describe`).
    """

    predicts_in_layers = False
    per_layer = False
    attention_heads = 1  # > 1: one set of values per attention head (a heads axis after N)
    frozen: tuple[str, ...] = ()  # frozen user submodules: always in eval mode (fixed normalisation statistics)

    def __init__(self, specs: list[ParameterSpec], targets: str = "neutral", scope: str = "context") -> None:
        super().__init__()
        self.specs = specs
        self.targets, self.scope = targets, scope

    def train(self, mode: bool = True):
        super().train(mode)
        for name in self.frozen:
            if getattr(self, name) is not None:
                getattr(self, name).eval()
        return self

    def static(self, batch, cameras: Cameras, grid: tuple[int, int], num_context: int) -> dict[str, Tensor]:
        """Values ``{name: (B, V*P, ...)}`` for all V views of the (unfolded) batch."""
        raise NotImplementedError

    def layer(self, index: int, hidden: Tensor, cameras: Cameras, grid: tuple[int, int],
              num_context: int) -> dict[str, Tensor]:
        """Values from ``hidden (B, N, dim)``, the normalised input of block ``index``."""
        raise NotImplementedError

    def describe(self, name: str) -> str:
        """The label of a run with this source (``name``: the predictor's name) in reports."""
        if self.scope == "all":
            return f"{name}, with target geometry"
        return name if self.targets == "hidden" else f"{name}, targets {self.targets}"

    def with_targets(self, values: dict[str, Tensor], cameras: Cameras, grid: tuple[int, int], num_context: int,
                     transferred: dict[str, Tensor] | None = None, hit: Tensor | None = None) -> dict[str, Tensor]:
        """Values of all V views: the context rows of ``values`` (``(B, Vc*P or V*P, ...)``) and target
        rows per ``targets``: ``values``' own rows (``hidden``, or ``scope="all"``), the neutral
        values, or ``transferred`` values ``(B, Vt*P, ...)`` where ``hit (B, Vt*P)`` and neutral
        elsewhere (default: planes transferred from the context rows of ``values["planes"]``)."""
        if self.targets == "hidden" or self.scope == "all":
            return values
        B, start = cameras.batch_size, num_context * grid[0] * grid[1]
        some = next(iter(values.values()))
        neutral = self.decode(some.new_zeros(B, cameras.num_views * grid[0] * grid[1], self.raw_dim), cameras, grid)
        if self.targets == "transfer" and transferred is None:
            planes, hit = transfer_planes(values["planes"][:, :start], cameras, grid, num_context)
            transferred = {"planes": planes}
        out = {}
        for name, value in values.items():
            target = neutral[name][:, start:].to(value.dtype)
            if transferred is not None and name in transferred:
                shape = hit.shape + (1,) * (target.ndim - 2)
                target = torch.where(hit.reshape(shape), transferred[name].to(value.dtype), target)
            out[name] = torch.cat([value[:, :start], target], dim=1)
        return out

    def decode(self, raw: Tensor, cameras: Cameras, grid: tuple[int, int]) -> dict[str, Tensor]:
        """Split ``raw (B, N, sum raw_dim)`` per spec and decode (geometry in float32)."""
        raw = raw.float()
        out, start = {}, 0
        for spec in self.specs:
            out[spec.name] = spec.decode(raw[..., start : start + spec.raw_dim], cameras, grid)
            start += spec.raw_dim
        return out

    @property
    def raw_dim(self) -> int:
        return sum(s.raw_dim for s in self.specs)


def _zero_linear(in_dim: int, out_dim: int) -> nn.Linear:
    layer = nn.Linear(in_dim, out_dim)
    nn.init.zeros_(layer.weight)
    nn.init.zeros_(layer.bias)
    return layer


def fold_heads(value: Tensor) -> Tensor:
    """Per-head values ``(B, N, heads, ...)`` -> ``(B * heads, N, ...)``, element ``b * heads + h``
    (the batch layout of :meth:`hrope.Cameras.repeat_batch`)."""
    return value.transpose(1, 2).flatten(0, 1)


def unfold_heads(value: Tensor, heads: int) -> Tensor:
    """The inverse of :func:`fold_heads`: ``(B * heads, N, ...)`` -> ``(B, N, heads, ...)``."""
    return value.unflatten(0, (-1, heads)).transpose(1, 2)


class LearnedSource(ParameterSource):
    """``learned``: a zero-initialised ``Linear(dim, raw_dim)`` per token, in every layer
    (``per_layer``) or once, on the first block's input, for all layers.

    ``attention_heads`` > 1: one set of values per attention head (``Linear(dim, heads * raw_dim)``),
    returned with a heads axis, ``{name: (B, N, heads, ...)}``; each head's target values follow
    ``targets`` on their own (e.g. transferred from that head's context planes)."""

    predicts_in_layers = True

    def __init__(self, specs, dim: int, num_layers: int, per_layer: bool = True, targets: str = "hidden",
                 attention_heads: int = 1) -> None:
        super().__init__(specs, targets)
        self.per_layer = per_layer
        self.attention_heads = attention_heads
        self.heads = nn.ModuleList(_zero_linear(dim, attention_heads * self.raw_dim)
                                   for _ in range(num_layers if per_layer else 1))

    def layer(self, index, hidden, cameras, grid, num_context):
        raw = self.heads[index if self.per_layer else 0](hidden)
        count = self.attention_heads
        if count == 1:
            return self.with_targets(self.decode(raw, cameras, grid), cameras, grid, num_context)
        raw = fold_heads(raw.unflatten(-1, (count, self.raw_dim)))  # decoded and completed head by head
        cameras = cameras.repeat_batch(count)
        values = self.with_targets(self.decode(raw, cameras, grid), cameras, grid, num_context)
        return {name: unfold_heads(value, count) for name, value in values.items()}


def load_backbone(module: nn.Module, checkpoint: str | Path) -> nn.Module:
    """Load a LOCAL checkpoint into ``module`` (safetensors, or a torch file with weights_only=True)."""
    path = Path(checkpoint)
    if not path.is_file():
        raise PredictorError(f"predictor_options.checkpoint not found: {path} (a local file)")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        state = load_file(str(path))
    else:
        state = torch.load(path, map_location="cpu", weights_only=True)
        if isinstance(state, dict) and "state_dict" in state:
            state = state["state_dict"]
    module.load_state_dict(state)
    return module


def _views(cameras: Cameras, start: int, stop: int | None = None) -> Cameras:
    """The views ``[start, stop)`` of ``cameras`` (to the last view by default)."""
    return cameras.select_views(list(range(start, cameras.num_views if stop is None else stop)))


class BackboneSource(ParameterSource):
    """``backbone``: frozen ``module(images (B*Vc, 3, H, W) in [0, 1]) -> (B*Vc, C, h, w)`` features,
    bilinearly resampled to the patch grid, then ``Linear(C, hidden) -> GELU -> Linear(hidden, raw)``
    (last layer zero-initialised). Context views only; target views (no image) get neutral values,
    each decoder's zero-output value (e.g. identity transforms, hrope-lift's plane at infinity), or
    with ``targets="transfer"`` planes transferred from the context views."""

    frozen = ("backbone",)

    def __init__(self, specs, module: nn.Module, feature_dim: int, hidden_dim: int = 64,
                 targets: str = "neutral") -> None:
        super().__init__(specs, targets)
        self.backbone = module.eval().requires_grad_(False)
        self.head = nn.Sequential(nn.Linear(feature_dim, hidden_dim), nn.GELU(), _zero_linear(hidden_dim, self.raw_dim))

    def static(self, batch, cameras, grid, num_context):
        images = batch.images[:, :num_context]
        B, Vc = images.shape[:2]
        with torch.no_grad():
            features = self.backbone(images.flatten(0, 1))
        if features.ndim != 4:
            raise PredictorError(f"backbone must return (B, C, h, w) feature maps, got {tuple(features.shape)}")
        features = F.interpolate(features.float(), size=grid, mode="bilinear", align_corners=False)
        tokens = features.flatten(2).transpose(1, 2).reshape(B, Vc * grid[0] * grid[1], -1)
        return self.with_targets(self.decode(self.head(tokens), _views(cameras, 0, Vc), grid), cameras, grid,
                                 num_context)


def _values_from_planes(specs, planes: Planes, cameras: Cameras, grid,
                        depth_init: float = 1.0) -> dict[str, Tensor]:
    """Every supported encoding input derived from known planes.

    ``planes`` (m, as given); ``depth`` / ``log_depth``: where the plane crosses the patch-centre
    ray; uncertainties 0 (``log_depth_halfwidth``, ``depth_split``, ``depth_sigma``); ``rotation``:
    the patch's tangent frame F^T (camera -> plane axes); ``transform``: [[F^T, -F^T p], [0, 1]] with
    p the plane point on the ray (hrope-pf's G). A plane that never crosses the ray (m = 0, e.g. a
    patch without valid depth, or m ⟂ r̂) stands in as the fronto-parallel plane at ``depth_init``
    for every input but ``planes``, so all values stay finite.
    """
    cameras = cameras.to(dtype=torch.float32)
    normal, depth = planes.normal_and_depth(cameras, grid, torch.float32)
    missing = ~torch.isfinite(depth)
    depth = torch.where(missing, torch.full_like(depth, depth_init), depth)
    facing = torch.tensor(FACING_NORMAL, dtype=normal.dtype, device=normal.device)
    normal = torch.where(missing[..., None], facing, normal)
    frame_t = tangent_frames(normal).transpose(-1, -2)
    point = depth[..., None] * token_rays(cameras, grid)
    values = {
        "planes": planes.m(cameras, grid, torch.float32),
        "depth": depth,
        "log_depth": depth.clamp_min(1e-6).log(),
        "log_depth_halfwidth": torch.zeros_like(depth),
        "depth_split": torch.zeros_like(depth),
        "depth_sigma": depth.new_zeros(*depth.shape, 2),
        "rotation": frame_t,
        "transform": make_se3(frame_t, -(frame_t @ point[..., None]).squeeze(-1)),
        # hrope's per-patch pose offsets: none (a geometry source knows planes, not poses)
        "patch_rotation": torch.eye(3, dtype=depth.dtype, device=depth.device).expand(*depth.shape, 3, 3),
        "patch_translation": depth.new_zeros(*depth.shape, 3),
    }
    unknown = [s.name for s in specs if s.name not in values]
    if unknown:
        raise PredictorError(f"geometry sources cannot provide {unknown}")
    return {s.name: values[s.name] for s in specs}


def patch_planes_from_normals(depth: Tensor, normals: Tensor, cameras: Cameras, patch_size: int) -> Planes:
    """Per-patch planes with the mean pixel normal of the patch and the least-squares offset.

    ``depth (B, V, H, W)``, ``normals (B, V, 3, H, W)`` camera frame. The offset solves
    ``min_d Σ (n·X - d)^2`` over the patch's valid back-projected points X, i.e. the mean of n·X.
    A patch without valid depth gets the plane at infinity (m = 0); one whose normals cancel or whose
    plane contains the camera centre gets the fronto-parallel plane through its mean point.
    """
    check_depth_maps(depth, cameras, patch_size)
    ok = (torch.isfinite(depth) & (depth > 0)).float()[:, :, None]  # (B, V, 1, H, W)
    z = torch.where(ok > 0, depth[:, :, None], torch.zeros_like(ok)).float()
    points = pixel_rays(cameras.K.float(), cameras.image_size).movedim(-1, 2) * z  # (B, V, 3, H, W)

    def per_patch(x: Tensor) -> Tensor:  # (B, V, C, H, W) -> sum over each patch (B, N, C)
        return patchify(x, patch_size).sum(-1).flatten(1, 2)

    n_sum = per_patch(normals.float() * ok)
    count = per_patch(ok).squeeze(-1)
    mean_point = per_patch(points * ok) / count.clamp_min(1)[..., None]
    normal = F.normalize(n_sum, dim=-1)
    d = (normal * mean_point).sum(-1)
    good = (count > 0) & (n_sum.norm(dim=-1) > 1e-6) & (d.abs() > 1e-6)
    fronto = F.pad(1.0 / mean_point[..., 2:].clamp_min(1e-6), (2, 0))  # (0, 0, 1 / z̄)
    m = torch.where(good[..., None], normal / torch.where(good, d, torch.ones_like(d))[..., None],
                    torch.where((count > 0)[..., None], fronto, torch.zeros_like(fronto)))
    return Planes.from_m(m)


RANSAC_HYPOTHESES = 64  # planes tried per patch (fixed draws): 50 % outliers leave ~2e-4 of patches without a clean one


def _inliers(points: Tensor, valid: Tensor, normal: Tensor, offset: Tensor, threshold: float) -> Tensor:
    """``(B, N, K)``: valid points ``(B, N, K, 3)`` within ``threshold`` x their depth of the planes
    ``{X : normal·X = offset}`` (``normal (B, N, 3)`` unit, ``offset (B, N)``)."""
    distance = ((points * normal[:, :, None]).sum(-1) - offset[..., None]).abs()
    return valid & (distance < threshold * points[..., 2])


def robust_patch_planes(depth: Tensor, cameras: Cameras, patch_size: int, min_points: int = 5,
                        threshold: float = 0.02, fallback: str = "median") -> Planes:
    """Per-patch planes from z-depth ``(B, V, H, W)`` (sparse, e.g. SfM points, or dense) that ignore outliers.

    Pixels with finite positive depth are back-projected (pixel centres). A patch with at least
    ``min_points`` of them runs RANSAC: :data:`RANSAC_HYPOTHESES` planes through three of its points
    (the same fixed draws in every patch), a point being an inlier when its distance to the plane is
    below ``threshold`` times its depth; the plane with the most inliers is refitted to its inliers by
    least squares (:meth:`hrope.Planes.from_depth`). A patch with fewer points, or fewer inliers,
    gets the ``fallback`` (:data:`FALLBACKS`): ``median``, the fronto-parallel plane at the median depth
    of its points, or of its view's points when it has none (the plane at infinity, m = 0, when the
    view has none either); ``infinity``, the plane at infinity.
    """
    check_depth_maps(depth, cameras, patch_size)
    depth, cameras = depth.float(), cameras.to(dtype=torch.float32)
    B, V, H, W = depth.shape
    p = patch_size
    ok = torch.isfinite(depth) & (depth > 0)
    z = torch.where(ok, depth, torch.zeros_like(depth))
    points = patchify((pixel_rays(cameras.K, (H, W)) * z[..., None]).movedim(-1, 2), p).mT.flatten(1, 2)  # (B, N, K, 3)
    valid = patchify(ok[:, :, None].float(), p)[:, :, :, 0].flatten(1, 2) > 0  # (B, N, K)
    # three distinct valid points per hypothesis: positions in the patch's valid points, mapped through `order`
    count = valid.sum(-1, keepdim=True).clamp_min(3)  # (B, N, 1)
    draws = torch.rand(RANSAC_HYPOTHESES, 3, generator=torch.Generator().manual_seed(0)).to(depth.device)
    first = (draws[:, 0] * count).long()
    second = (first + 1 + (draws[:, 1] * (count - 1)).long()) % count
    third = (draws[:, 2] * (count - 2)).long()
    third = third + (third >= torch.minimum(first, second)).long()
    third = third + (third >= torch.maximum(first, second)).long()
    order = torch.argsort((~valid).to(torch.uint8), dim=-1, stable=True)  # valid points first
    index = order.gather(-1, torch.cat([first, second, third], -1))  # (B, N, 3 * hypotheses)
    corners = points.gather(2, index[..., None].expand(-1, -1, -1, 3)).unflatten(2, (3, RANSAC_HYPOTHESES))
    a, b = corners[:, :, 1] - corners[:, :, 0], corners[:, :, 2] - corners[:, :, 0]  # (B, N, hypotheses, 3)
    normal = torch.cross(a, b, dim=-1)
    area = normal.norm(dim=-1)
    proper = area > 1e-6 * a.norm(dim=-1) * b.norm(dim=-1)  # not (nearly) collinear
    normal = normal / area.clamp_min(torch.finfo(area.dtype).tiny)[..., None]
    offset = (normal * corners[:, :, 0]).sum(-1)
    scores = torch.stack([_inliers(points, valid, normal[:, :, h], offset[:, :, h], threshold).sum(-1)
                          for h in range(RANSAC_HYPOTHESES)], -1)
    best = torch.where(proper, scores, -1).argmax(-1, keepdim=True)  # (B, N, 1)
    best_normal = normal.gather(2, best[..., None].expand(-1, -1, -1, 3))[:, :, 0]
    inliers = _inliers(points, valid, best_normal, offset.gather(2, best)[..., 0], threshold)  # (B, N, K)
    inlier_map = inliers.reshape(B, V, H // p, W // p, p, p).transpose(3, 4).reshape(B, V, H, W)
    grid = (H // p, W // p)
    fitted = Planes.from_depth(depth, cameras, p, valid=inlier_map).m(cameras, grid)
    if fallback == "infinity":
        rest = torch.zeros_like(fitted)
    else:
        patch_median = torch.where(valid, points[..., 2], torch.nan).nanmedian(-1).values  # (B, N), nan: no point
        view_median = torch.where(ok, depth, torch.nan).flatten(2).nanmedian(-1).values  # (B, V)
        median = torch.where(patch_median.isnan(), view_median.repeat_interleave(grid[0] * grid[1], 1), patch_median)
        rest = F.pad((1.0 / median).nan_to_num(0.0)[..., None], (2, 0))  # (0, 0, 1 / z), 0 without any depth
    enough = inliers.sum(-1) >= min_points  # (so the patch has that many valid points too)
    return Planes.from_m(torch.where(enough[..., None], fitted, rest))


def _median_scale(predicted: Tensor, reference: Tensor) -> Tensor:
    """``(B, V, 1, 1)``: per view, the median of ``reference / predicted`` over the pixels where both
    depths ``(B, V, H, W)`` are valid; a view without such pixels takes its scene's median."""
    both = torch.isfinite(reference) & (reference > 0) & torch.isfinite(predicted) & (predicted > 0)
    ratio = torch.where(both, reference / predicted, torch.nan)
    per_view = ratio.flatten(2).nanmedian(-1).values
    scale = torch.where(per_view.isnan(), ratio.flatten(1).nanmedian(-1).values[:, None], per_view)
    if scale.isnan().any():
        raise PredictorError("predictor_options.align 'median': a scene has no pixel with both data depth and "
                             "positive model depth to scale the depth model's output by")
    return scale[..., None, None]


class GeometrySource(ParameterSource):
    """Sources of known geometry (``external``, ``oracle``): planes turned into every encoding input
    by :meth:`values_of`. ``max_inverse_distance`` (default :data:`DEFAULT_MAX_INVERSE_DISTANCE`):
    planes closer to the camera centre than 1 / max_inverse_distance are moved out to that
    distance, normal kept (|m| capped, :func:`hrope.planes.clamp_plane_vectors`), before anything
    is derived from them; None leaves them to the encodings' own clamp (|m| <=
    :data:`hrope.planes.MAX_INVERSE_DISTANCE`, an overflow guard)."""

    def __init__(self, specs, targets: str, scope: str, depth_init: float = 1.0,
                 max_inverse_distance: float | None = DEFAULT_MAX_INVERSE_DISTANCE) -> None:
        super().__init__(specs, targets, scope)
        self.depth_init, self.max_inverse_distance = depth_init, max_inverse_distance

    def values_of(self, planes: Planes, cameras: Cameras, grid: tuple[int, int]) -> dict[str, Tensor]:
        """The encoding inputs ``{name: (B, N, ...)}`` of known ``planes`` seen by ``cameras``."""
        if self.max_inverse_distance is not None:
            m = planes.m(cameras.to(dtype=torch.float32), grid, torch.float32)
            planes = Planes.from_m(clamp_plane_vectors(m, self.max_inverse_distance))
        return _values_from_planes(self.specs, planes, cameras, grid, self.depth_init)


class ExternalSource(GeometrySource):
    """``external``: planes from per-pixel depth (and normals when present and ``use_normals``), one
    plane per patch. The depth is the batch's (``batch.depth``: synthetic depth, depth maps or sparse
    COLMAP points) or, with a ``depth_model``, that frozen module's output on the views' images,
    ``(N, 3, H, W)`` in [0, 1] -> ``(N, H', W')`` or ``(N, 1, H', W')`` z-depth (resized bilinearly to
    ``(H, W)``), scaled per view to the batch's depth by the median ratio (``align="median"``) or
    used as it is, in scene units (``align="none"``).

    ``fit="least-squares"``: :meth:`hrope.Planes.from_depth` (or :func:`patch_planes_from_normals`);
    patches without valid depth get the plane at infinity. ``fit="robust"``:
    :func:`robust_patch_planes` with ``min_points``, ``inlier_threshold`` and ``fallback`` (normals
    unused). Depth-like inputs of planes that miss the patch ray use ``depth_init``
    (see ``_values_from_planes``).

    ``scope="context"`` (default) reads the context views' depth only; the target views get neutral
    values or (``targets="transfer"``) planes fitted to the context depth splatted into each target
    camera (:func:`hrope.nvs.transfer.transfer_depth`; target patches without splatted depth stay
    neutral). ``scope="all"`` fits every view's own depth: an upper bound with target geometry."""

    frozen = ("depth_model",)

    def __init__(self, specs, patch_size: int, use_normals: bool = True, depth_init: float = 1.0,
                 targets: str = "neutral", scope: str = "context", *, fit: str = "least-squares",
                 min_points: int = 5, inlier_threshold: float = 0.02, fallback: str = "median",
                 depth_model: nn.Module | None = None, align: str = "median",
                 max_inverse_distance: float | None = DEFAULT_MAX_INVERSE_DISTANCE) -> None:
        super().__init__(specs, targets, scope, depth_init, max_inverse_distance)
        self.patch_size = patch_size
        self.use_normals = use_normals
        self.fit, self.min_points, self.inlier_threshold, self.fallback = fit, min_points, inlier_threshold, fallback
        self.depth_model = None if depth_model is None else depth_model.eval().requires_grad_(False)
        self.align = align

    def _fit(self, depth: Tensor, normals: Tensor | None, cameras: Cameras) -> Planes:
        if self.fit == "robust":
            return robust_patch_planes(depth, cameras, self.patch_size, self.min_points, self.inlier_threshold,
                                       self.fallback)
        if self.use_normals and normals is not None:
            return patch_planes_from_normals(depth, normals, cameras, self.patch_size)
        return Planes.from_depth(depth.float(), cameras.to(dtype=torch.float32), self.patch_size)

    def _depth(self, batch, views: int) -> Tensor:
        """Depth ``(B, views, H, W)`` of the first ``views`` views (class doc)."""
        reference = getattr(batch, "depth", None)
        reference = None if reference is None else reference[:, :views]
        if self.depth_model is None:
            if reference is None:
                raise PredictorError("the 'external' predictor needs per-pixel depth in the batch (batch.depth): set "
                                     "data.depth (points: COLMAP points3D.txt; maps: depth_file_path) or "
                                     "predictor_options.depth: model")
            return reference
        images = batch.images[:, :views]
        B, V, _, H, W = images.shape
        with torch.no_grad():
            predicted = self.depth_model(images.flatten(0, 1))
        predicted = predicted[:, 0] if predicted.ndim == 4 and predicted.shape[1] == 1 else predicted
        if predicted.ndim != 3 or len(predicted) != B * V:
            raise PredictorError(f"the depth model must return (N, H, W) or (N, 1, H, W) depth for N = {B * V} "
                                 f"images, got {tuple(predicted.shape)}")
        predicted = F.interpolate(predicted[:, None].float(), size=(H, W), mode="bilinear",
                                  align_corners=False).reshape(B, V, H, W)
        if self.align == "none":
            return predicted
        if reference is None:
            raise PredictorError("predictor_options.align 'median' scales the depth model's output to the data's "
                                 "depth: set data.depth (points or maps), or align: none for a model that outputs "
                                 "scene units")
        return predicted * _median_scale(predicted, reference)

    def static(self, batch, cameras, grid, num_context):
        normals = getattr(batch, "normals", None) if self.depth_model is None else None
        if self.scope == "all":
            depth = self._depth(batch, cameras.num_views)
            return self.values_of(self._fit(depth, normals, cameras), cameras, grid)
        context, targets = _views(cameras, 0, num_context), _views(cameras, num_context)
        depth = self._depth(batch, num_context)
        planes = self._fit(depth, None if normals is None else normals[:, :num_context], context)
        values = self.values_of(planes, context, grid)
        transferred = hit = None
        if self.targets == "transfer":
            splatted = transfer_depth(depth.float(), cameras.to(dtype=torch.float32), num_context)
            fitted = self._fit(splatted, None, targets.to(dtype=torch.float32))
            transferred = self.values_of(fitted, targets, grid)
            hit = patchify(torch.isfinite(splatted)[:, :, None].float(), self.patch_size).sum(-1).flatten(1) > 0
        return self.with_targets(values, cameras, grid, num_context, transferred, hit)


class OracleSource(GeometrySource):
    """``oracle``: the dataset's ground-truth per-patch planes ``batch.planes(patch_size)``;
    ``depth_init`` as for ``external``. ``scope="context"`` (default): the context views' planes
    only, targets neutral or (``targets="transfer"``) the context planes transferred into the
    target cameras, the fair upper bound for a method that predicts planes from images;
    ``scope="all"``: every view's own planes, an upper bound with target geometry."""

    def __init__(self, specs, patch_size: int, depth_init: float = 1.0, targets: str = "neutral",
                 scope: str = "context",
                 max_inverse_distance: float | None = DEFAULT_MAX_INVERSE_DISTANCE) -> None:
        super().__init__(specs, targets, scope, depth_init, max_inverse_distance)
        self.patch_size = patch_size

    def static(self, batch, cameras, grid, num_context):
        planes = batch.planes(self.patch_size) if hasattr(batch, "planes") else None
        if planes is None:
            raise PredictorError("the 'oracle' predictor needs ground-truth planes (batch.planes(patch_size))")
        if self.scope == "all":
            return self.values_of(planes, cameras, grid)
        context_m = planes.m(cameras, grid, torch.float32)[:, :num_context * grid[0] * grid[1]]
        transferred = hit = None
        if self.targets == "transfer":
            target_m, hit = transfer_planes(context_m, cameras.to(dtype=torch.float32), grid, num_context)
            transferred = self.values_of(Planes.from_m(target_m), _views(cameras, num_context), grid)
        values = self.values_of(Planes.from_m(context_m), _views(cameras, 0, num_context), grid)
        return self.with_targets(values, cameras, grid, num_context, transferred, hit)


def import_factory(path: str) -> Callable[..., nn.Module]:
    """The callable named by ``'package.module:name'`` (user code that builds a backbone or depth model)."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise PredictorError(f"predictor_options.module must look like 'package.module:factory', got {path!r}")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as error:
        raise PredictorError(f"predictor_options.module {path!r} cannot be imported: {error}") from error


def _user_module(options: dict, what: str) -> nn.Module:
    """The module of ``predictor_options.module`` (built from an import path with ``module_kwargs``),
    with the LOCAL ``checkpoint`` loaded when given; ``what`` names its user in errors."""
    module = options["module"]
    if isinstance(module, str):
        module = import_factory(module)(**options["module_kwargs"])
    if not isinstance(module, nn.Module):
        raise PredictorError(f"{what} needs predictor_options.module: an nn.Module or an import path "
                             "'package.module:factory' (called with predictor_options.module_kwargs)")
    if options["checkpoint"]:
        load_backbone(module, options["checkpoint"])
    return module


def build_parameter_source(name: str, specs: list[ParameterSpec], *, dim: int, num_layers: int, patch_size: int,
                           options: dict | None = None, depth_init: float = 1.0,
                           attention_heads: int = 1) -> ParameterSource:
    """A parameter source by name with its ``options`` (:data:`hrope.nvs.config.SOURCE_OPTIONS`):
    ``targets`` and, for ``oracle`` / ``external``, ``scope`` (see :class:`ParameterSource`); for ``learned``
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
    options = source_options(name, options, PredictorError)
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
        depth_model = _user_module(options, "predictor_options.depth 'model'") if options["depth"] == "model" else None
        return ExternalSource(specs, patch_size, use_normals=options["use_normals"], depth_init=depth_init,
                              targets=options["targets"], scope=options["scope"], fit=options["fit"],
                              min_points=options["min_points"], inlier_threshold=options["inlier_threshold"],
                              fallback=options["fallback"], depth_model=depth_model, align=options["align"],
                              max_inverse_distance=options["max_inverse_distance"])
    module = _user_module(options, "the 'backbone' predictor")
    if options["feature_dim"] is None:
        raise PredictorError("the 'backbone' predictor needs predictor_options.feature_dim (channels C)")
    return BackboneSource(specs, module, int(options["feature_dim"]), int(options["hidden_dim"]), options["targets"])
