"""Random valid inputs for every encoding, for tests, benchmarks and users' own checks (torch only).

Every generator takes a ``seed`` (or a ``torch.Generator``) and is deterministic. Cameras have
jittered intrinsics (fx != fy, principal point off-centre) and random rigid poses; planes face
their camera; per-token params are drawn per parameter name (and, for ``transform``, the
encoding's ``transform_kind``). ``scale`` sizes a whole scene (camera translations and every
length of the token inputs); :func:`inputs_at_clamps` puts the token inputs at the clamp policy's
bounds (docs/encodings.md, "Clamp policy").
"""

from __future__ import annotations

import math
from typing import cast

import torch
from torch import Tensor

from .cameras import Cameras
from .encodings import get_encoding
from .planes import MAX_DEPTH, MAX_INVERSE_DISTANCE, Planes

__all__ = [
    "random_rotation",
    "random_se3",
    "random_intrinsics",
    "random_cameras",
    "random_planes",
    "random_qkv",
    "encoding_params",
    "encoding_inputs",
    "inputs_at_clamps",
]

# The per-token params that are lengths in scene units (scaled with the scene); log_depth is one
# in log space. Rotations, log-depth half-widths and weights have no unit.
_LENGTHS = ("depth", "depth_split", "depth_sigma")


def random_rotation(
    *shape: int, generator: torch.Generator | None = None, dtype: torch.dtype = torch.float64
) -> Tensor:
    """Uniform random rotations ``(*shape, 3, 3)`` (QR of a Gaussian matrix, det fixed to +1)."""
    A = torch.randn(*shape, 3, 3, generator=generator, dtype=dtype)
    Q: Tensor
    Q, R = torch.linalg.qr(A)
    Q = Q * torch.sign(torch.diagonal(R, dim1=-2, dim2=-1))[..., None, :]
    det = torch.linalg.det(Q)
    Q[..., :, 0] = Q[..., :, 0] * det[..., None]
    return Q


def random_se3(
    *shape: int,
    generator: torch.Generator | None = None,
    dtype: torch.dtype = torch.float64,
    translation_scale: float = 1.0,
) -> Tensor:
    """Random rigid transforms ``(*shape, 4, 4)``: uniform rotation, Gaussian translation."""
    E = torch.zeros(*shape, 4, 4, dtype=dtype)
    E[..., :3, :3] = random_rotation(*shape, generator=generator, dtype=dtype)
    E[..., :3, 3] = translation_scale * torch.randn(*shape, 3, generator=generator, dtype=dtype)
    E[..., 3, 3] = 1.0
    return E


def random_intrinsics(
    B: int,
    V: int,
    image_size: tuple[int, int],
    generator: torch.Generator | None = None,
    dtype: torch.dtype = torch.float64,
) -> Tensor:
    """Pixel K ``(B, V, 3, 3)`` with focal 0.7–1.5 x the image side (fx != fy) and the principal
    point jittered by ±10 %."""
    H, W = image_size
    u = torch.rand(B, V, 4, generator=generator, dtype=dtype)
    K = torch.zeros(B, V, 3, 3, dtype=dtype)
    K[..., 0, 0] = W * (0.7 + 0.8 * u[..., 0])
    K[..., 1, 1] = H * (0.7 + 0.8 * u[..., 1])
    K[..., 0, 2] = W * (0.5 + 0.2 * (u[..., 2] - 0.5))
    K[..., 1, 2] = H * (0.5 + 0.2 * (u[..., 3] - 0.5))
    K[..., 2, 2] = 1.0
    return K


def random_cameras(
    B: int = 1,
    V: int = 2,
    image_size: tuple[int, int] = (32, 48),
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
    scale: float = 1.0,
) -> Cameras:
    """``(B, V)`` cameras: :func:`random_intrinsics` and :func:`random_se3` world-to-camera poses
    with translations ``scale`` times standard normal (a scene ``scale`` scene units across)."""
    g = torch.Generator().manual_seed(seed)
    K = random_intrinsics(B, V, image_size, g, dtype)  # then the poses: one seed, the same K and rotations at any scale
    return Cameras(K, random_se3(B, V, generator=g, dtype=dtype, translation_scale=scale), image_size)


def random_planes(B: int, N: int, seed: int = 0, dtype: torch.dtype = torch.float64, scale: float = 1.0) -> Planes:
    """``(B, N)`` planes facing the camera (normal within ~70° of -z) at depths 1–4 times ``scale``."""
    g = torch.Generator().manual_seed(seed + 1000)
    normal = torch.randn(B, N, 3, generator=g, dtype=dtype) * 0.6
    normal[..., 2] = -1.0
    depth = scale * (1.0 + 3.0 * torch.rand(B, N, generator=g, dtype=dtype))
    return Planes(normal, depth)


def random_qkv(
    B: int, heads: int, N: int, head_dim: int, seed: int = 0, dtype: torch.dtype = torch.float64
) -> tuple[Tensor, Tensor, Tensor]:
    """Standard normal q, k, v, each ``(B, heads, N, head_dim)``."""
    g = torch.Generator().manual_seed(seed + 2000)
    q, k, v = (torch.randn(B, heads, N, head_dim, generator=g, dtype=dtype) for _ in range(3))
    return q, k, v


def _param(name: str, transform_kind: str | None, B: int, N: int, g: torch.Generator, dtype: torch.dtype) -> Tensor:
    """One valid random per-token param ``(B, N, ...)`` by its name."""
    if name == "depth":  # z-depth 1–4
        return 1.0 + 3.0 * torch.rand(B, N, generator=g, dtype=dtype)
    if name == "log_depth":  # z-depth e^0.5–e^2
        return 0.5 + 1.5 * torch.rand(B, N, generator=g, dtype=dtype)
    if name in ("log_depth_halfwidth", "depth_split"):
        return (0.5 if name == "log_depth_halfwidth" else 1.0) * torch.rand(B, N, generator=g, dtype=dtype)
    if name == "depth_sigma":
        return 0.5 * torch.rand(B, N, 2, generator=g, dtype=dtype)
    if name in ("rotation", "patch_rotation"):
        return random_rotation(B, N, generator=g, dtype=dtype)
    if name == "patch_translation":
        return 0.3 * torch.randn(B, N, 3, generator=g, dtype=dtype)
    if name == "transform" and transform_kind == "rigid":
        return random_se3(B, N, generator=g, dtype=dtype)
    if name == "transform":  # any invertible 4x4 near the identity
        return torch.eye(4, dtype=dtype) + 0.3 * torch.randn(B, N, 4, 4, generator=g, dtype=dtype)
    raise KeyError(f"no random generator for per-token param {name!r}")


def encoding_params(name: str, B: int, N: int, seed: int = 0, dtype: torch.dtype = torch.float64) -> dict[str, Tensor]:
    """Valid random per-token params ``{param: (B, N, ...)}`` of encoding ``name`` (its ``param_names``)."""
    encoding = get_encoding(name)
    g = torch.Generator().manual_seed(seed + 3000)
    return {p: _param(p, encoding.transform_kind, B, N, g, dtype) for p in encoding.param_names}


def encoding_inputs(
    name: str,
    cameras: Cameras,
    grid: tuple[int, int],
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
    scale: float = 1.0,
) -> dict[str, Planes | dict[str, Tensor] | None]:
    """``planes`` and ``params`` keyword arguments for encoding ``name`` on random valid geometry,
    every length times ``scale`` (plane depths, depth params and per-patch translations; log-depths
    shifted by log ``scale``; per-token transforms T conjugated to S T S^-1, S = diag(scale, scale,
    scale, 1)): with ``random_cameras(scale=scale)``, the scene of scale 1 in other units."""
    B, N = cameras.batch_size, cameras.num_views * grid[0] * grid[1]
    planes = random_planes(B, N, seed, dtype, scale) if get_encoding(name).needs_planes else None
    params = encoding_params(name, B, N, seed, dtype)
    if scale != 1.0:
        for key, value in params.items():
            if key in _LENGTHS or key == "patch_translation":
                params[key] = scale * value
            elif key == "log_depth":
                params[key] = value + math.log(scale)
            elif key == "transform":
                d = value.new_tensor([scale, scale, scale, 1.0])
                params[key] = value * d[:, None] / d
    return {"planes": planes, "params": params}


def inputs_at_clamps(
    name: str,
    cameras: Cameras,
    grid: tuple[int, int],
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
    max_inverse_distance: float = MAX_INVERSE_DISTANCE,
) -> dict[str, Planes | dict[str, Tensor] | None]:
    """:func:`encoding_inputs` moved to the largest values the clamp policy keeps (docs/encodings.md,
    "Clamp policy"): planes at ``|m| = max_inverse_distance`` (by default ``MAX_INVERSE_DISTANCE``,
    0.01 scene units from the camera; the random plane's direction kept), depths, depth sigmas and
    log-depths at ``MAX_DEPTH``. The other params (rotations, transforms, which are validated rather
    than bounded) keep their random values."""
    inputs = encoding_inputs(name, cameras, grid, seed, dtype)
    planes, params = inputs["planes"], dict(cast("dict[str, Tensor]", inputs["params"]))
    if isinstance(planes, Planes):
        m = planes.m(cameras, grid, dtype)
        planes = Planes.from_m(max_inverse_distance * m / m.norm(dim=-1, keepdim=True))
    for key, value in params.items():
        if key in ("depth", "depth_sigma"):
            params[key] = torch.full_like(value, MAX_DEPTH)
        elif key == "log_depth":
            params[key] = torch.full_like(value, math.log(MAX_DEPTH))
    return {"planes": planes, "params": params}
