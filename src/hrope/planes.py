"""`Planes`: one 3D plane per patch token, in that token's own camera frame (DESIGN.md §4.1).

A plane is stored as the vector m = n / d, the plane being {X_c : m · X_c = 1} in camera
coordinates. m is sign-free ((n, d) and (-n, -d) agree), m = 0 is the plane at infinity, and
the point at z-depth z along the patch-centre ray r̂ = K̂^-1 (u, v, 1) lies on the plane when
z = 1 / (m · r̂).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .cameras import Cameras
from .errors import InputError, checking_values
from .geometry import patch_rays, patchify, pixel_rays
from .shapes import check_finite, check_shapes

__all__ = [
    "Planes",
    "PlaneError",
    "plane_vectors",
    "check_depth_maps",
    "clamp_plane_vectors",
    "clamp_depth",
    "clamp_inverse_depth",
    "MAX_INVERSE_DISTANCE",
    "MIN_DEPTH",
    "MAX_DEPTH",
    "MIN_GRAZING_COS",
]

# The clamp policy of the plane- and depth-based encodings (docs/encodings.md, "Clamp policy"), in
# scene units: a plane is at least MIN_DEPTH from its camera centre (|m| <= MAX_INVERSE_DISTANCE),
# and a point placed on a patch-centre ray has a z-depth in [MIN_DEPTH, MAX_DEPTH].
MAX_INVERSE_DISTANCE = 100.0
MIN_DEPTH = 1.0 / MAX_INVERSE_DISTANCE
MAX_DEPTH = 100.0

# A (normal, depth) plane seen at a grazing angle contains (almost) the camera centre and
# m = n / (z n·r̂) diverges. |cos| of the angle between the normal and the patch-centre ray is
# clamped to at least this value (about 87 degrees from the normal), keeping the sign.
MIN_GRAZING_COS = 0.05


def plane_vectors(normal: Tensor, inverse_depth: Tensor, rays: Tensor) -> Tensor:
    """Plane vectors ``m = inverse_depth * n / (n·r̂)`` ``(..., 3)`` of planes with unit ``normal``
    crossing the ray ``r̂`` (unit z) at z-depth ``1 / inverse_depth``.

    ``|n·r̂| / |r̂|`` is clamped to at least ``MIN_GRAZING_COS`` (sign kept, + when exactly 0) so a
    plane through the camera centre stays finite; inverse_depth 0 gives the plane at infinity.
    """
    ray_norm: Tensor = rays.norm(dim=-1)
    cos = (normal * rays).sum(-1) / ray_norm
    sign = torch.where(cos < 0, -1.0, 1.0).to(cos.dtype)
    cos = sign * cos.abs().clamp_min(MIN_GRAZING_COS)
    return normal * (inverse_depth / (cos * ray_norm))[..., None]


def clamp_plane_vectors(m: Tensor, max_inverse_distance: float = MAX_INVERSE_DISTANCE) -> Tensor:
    """Planes ``m (..., 3)`` scaled down to ``|m| <= max_inverse_distance``, direction kept (identity
    inside the bound).

    m is divided by max(1, max_i |m_i| / bound), then by max(1, |m| / bound): the same result as the
    second step alone, but the norm of a huge m cannot overflow, and dividing (rather than
    multiplying by a tiny factor) keeps its gradients finite."""
    m = m / (m.abs().amax(-1, keepdim=True) / max_inverse_distance).clamp_min(1.0)
    norm: Tensor = m.norm(dim=-1, keepdim=True)
    return m / (norm / max_inverse_distance).clamp_min(1.0)


def clamp_depth(z: Tensor) -> Tensor:
    """z-depths of points on patch-centre rays clamped to ``[MIN_DEPTH, MAX_DEPTH]``."""
    return z.clamp(MIN_DEPTH, MAX_DEPTH)


def clamp_inverse_depth(w: Tensor) -> Tensor:
    """The same clamp on inverse depths ``w = 1/z``, for callers that invert after it (so the
    gradient of ``1/w`` stays finite for tiny w)."""
    return w.clamp(1.0 / MAX_DEPTH, 1.0 / MIN_DEPTH)


class PlaneError(InputError):
    """Invalid plane input."""


def check_depth_maps(depth: Tensor, cameras: Cameras, patch_size: int) -> None:
    """A clear :class:`PlaneError` unless ``depth`` is ``(B, V, H, W)`` for ``cameras`` (same B, V and
    image size) with H and W divisible by ``patch_size``."""
    height, width = cameras.image_size
    dims = {"B": cameras.batch_size, "V": cameras.num_views, "H": height, "W": width}
    shape = "depth must have shape {expected} (the cameras' B, V and image size), got {shape}"
    check_shapes({"depth": (depth, "B V H W")}, error=PlaneError, dims=dims, messages={"type": shape, "shape": shape})
    H, W = depth.shape[-2:]
    if H % patch_size or W % patch_size:
        raise PlaneError(f"image size {(H, W)} is not divisible by patch_size {patch_size}")


class Planes:
    """Per-token planes ``(B, N)`` with N = V * grid_h * grid_w tokens (view-major, x fastest).

    Build from a normal and a depth, ``Planes(normal, depth)``: ``normal (B, N, 3)`` in the
    token's camera frame (rescaled to unit length; a zero normal is an error) and ``depth (B, N)``,
    the positive z-depth at which the plane crosses the patch-centre ray (depths below ``MIN_DEPTH``
    count as ``MIN_DEPTH``, the clamp policy of docs/encodings.md). Or build from the plane
    vector directly with ``Planes.from_m(m)``, ``m (B, N, 3)``. Both convert to m with
    :meth:`m`, which needs the cameras and grid because the patch-centre rays depend on them.
    """

    def __init__(self, normal: Tensor, depth: Tensor) -> None:
        check_shapes(
            {"normal": (normal, "B N 3"), "depth": (depth, "B N")}, error=PlaneError, same_device=True, floating=True
        )
        self._check_values(normal, depth)
        self.normal: Tensor | None = normal / normal.norm(dim=-1, keepdim=True)
        self.depth: Tensor | None = depth
        self._m: Tensor | None = None

    @staticmethod
    def _check_values(normal: Tensor, depth: Tensor) -> None:
        finite = "normal and depth must be finite (found NaN or inf)"
        check_finite({"normal": normal, "depth": depth}, error=PlaneError, message=finite)
        if not checking_values():
            return
        if (depth <= 0).any():
            raise PlaneError(f"depth must be positive, min is {float(depth.min()):g}")
        if (normal.norm(dim=-1) < 1e-6).any():
            raise PlaneError("normal has (near) zero length; a plane needs a direction")

    @classmethod
    def from_m(cls, m: Tensor) -> Planes:
        """Planes from the plane vector ``m = n / d`` ``(B, N, 3)`` in each token's camera frame."""
        check_shapes({"m": (m, "B N 3")}, error=PlaneError, floating=True)
        check_finite({"m": m}, error=PlaneError)
        planes = cls.__new__(cls)
        planes.normal = planes.depth = None
        planes._m = m
        return planes

    @property
    def shape(self) -> tuple[int, int]:
        """``(B, N)``."""
        ref = self._m if self._m is not None else self.depth
        assert ref is not None  # depth is set whenever m is not
        B, N = ref.shape[:2]
        return B, N

    def m(self, cameras: Cameras, grid: tuple[int, int], dtype: torch.dtype | None = None) -> Tensor:
        """Plane vectors ``(B, N, 3)`` in each token's camera frame.

        From (normal, depth): ``m = n / (z n·r̂)``, with z raised to at least ``MIN_DEPTH`` and
        ``|n·r̂| / |r̂|`` clamped to at least ``MIN_GRAZING_COS`` (sign kept, + when exactly 0) so a
        very near plane, or one through the camera centre, stays finite (with finite gradients).
        """
        self._check_tokens(cameras, grid)
        if self._m is not None:
            return self._m if dtype is None else self._m.to(dtype)
        assert self.normal is not None and self.depth is not None  # set whenever m is not
        normal = self.normal if dtype is None else self.normal.to(dtype)
        depth = self.depth if dtype is None else self.depth.to(dtype)
        rays = patch_rays(cameras.normalized_K(normal.dtype), grid).flatten(1, 2)
        return plane_vectors(normal, 1.0 / depth.clamp_min(MIN_DEPTH), rays)

    def world_normal_and_kappa(self, cameras: Cameras, grid: tuple[int, int]) -> tuple[Tensor, Tensor]:
        """World-frame plane ``{X : kappa * n_w · X = 1}``: unit ``n_w (B, N, 3)``, ``kappa (B, N)``.

        With camera-frame ``(n_c, d_c)``: ``n_w = R^T n_c``, ``d_w = d_c - n_c · t``,
        ``kappa = 1 / d_w`` (inf when the plane contains the world origin).
        """
        m = self.m(cameras, grid, cameras.K.dtype)
        R, t = self._per_token(cameras, grid)
        m_norm = m.norm(dim=-1)
        n_c = m / m_norm.clamp_min(torch.finfo(m.dtype).tiny)[..., None]
        d_c = 1.0 / m_norm
        n_w = (R.transpose(-1, -2) @ n_c[..., None]).squeeze(-1)
        d_w = d_c - (n_c * t).sum(-1)
        return n_w, 1.0 / d_w

    def normal_and_depth(
        self, cameras: Cameras, grid: tuple[int, int], dtype: torch.dtype | None = None
    ) -> tuple[Tensor, Tensor]:
        """Unit normal facing the camera ``(B, N, 3)`` and z-depth ``1 / (m·r̂)`` ``(B, N)``.

        The depth is inf for m = 0 and negative when the plane is crossed behind the camera.
        """
        m = self.m(cameras, grid, dtype)
        rays = patch_rays(cameras.normalized_K(m.dtype), grid).flatten(1, 2)
        normal = -m / m.norm(dim=-1, keepdim=True).clamp_min(torch.finfo(m.dtype).tiny)
        return normal, 1.0 / (m * rays).sum(-1)

    @classmethod
    def from_depth(cls, depth: Tensor, cameras: Cameras, patch_size: int, valid: Tensor | None = None) -> Planes:
        """Least-squares plane per patch from a z-depth map ``(B, V, H, W)``.

        Each pixel (centre at +0.5) is back-projected to ``X = z K^-1 (x, y, 1)``. The patch's
        plane is the orthogonal least-squares fit through the weighted centroid c (normal n = the
        covariance's smallest eigenvector), exact for points on a plane, converted to
        ``m = n / (n · c)`` with the grazing clamp of :meth:`m`. Invalid pixels (``valid`` False,
        non-finite or non-positive depth) get weight 0; a patch with fewer than 3 valid pixels gets
        the fronto-parallel plane through its centroid, one with none the plane at infinity (m = 0).
        Returns ``Planes.from_m`` with ``N = V * (H / p) * (W / p)`` tokens.
        """
        check_depth_maps(depth, cameras, patch_size)
        H, W = depth.shape[-2:]
        ok = torch.isfinite(depth) & (depth > 0)
        if valid is not None:
            ok = ok & valid
        z = torch.where(ok, depth, torch.zeros_like(depth))
        points = pixel_rays(cameras.K.to(depth.dtype), (H, W)) * z[..., None]
        points = patchify(points.movedim(-1, 2), patch_size).mT.flatten(1, 2)  # (B, N, p*p, 3)
        weight = patchify(ok[:, :, None].to(depth.dtype), patch_size).mT.flatten(1, 2)  # (B, N, p*p, 1)
        count = weight.sum(-2)  # (B, N, 1)
        centroid = (points * weight).sum(-2) / count.clamp_min(1)
        centred = (points - centroid[..., None, :]) * weight
        _, vectors = torch.linalg.eigh(centred.transpose(-1, -2) @ centred)
        normal = vectors[..., 0]  # smallest eigenvalue first
        fronto = torch.tensor([0.0, 0.0, 1.0], dtype=depth.dtype, device=depth.device)
        normal = torch.where(count >= 3, normal, fronto)
        offset = (normal * centroid).sum(-1, keepdim=True)  # n · c, signed
        min_offset = MIN_GRAZING_COS * centroid.norm(dim=-1, keepdim=True)
        offset = torch.where(offset < 0, -1.0, 1.0) * torch.maximum(offset.abs(), min_offset)
        m = torch.where(count > 0, normal / offset, torch.zeros_like(normal))
        return cls.from_m(m)

    @property
    def device(self) -> torch.device:
        ref = self._m if self._m is not None else self.depth
        assert ref is not None  # depth is set whenever m is not
        return ref.device

    def _check_tokens(self, cameras: Cameras, grid: tuple[int, int]) -> None:
        expected = (cameras.batch_size, cameras.num_views * grid[0] * grid[1])
        if self.shape != expected:
            raise PlaneError(f"planes have (B, N) = {self.shape}, but cameras and grid {tuple(grid)} imply {expected}")
        if self.device != cameras.device:
            raise PlaneError(f"planes are on {self.device} but the cameras are on {cameras.device}")

    @staticmethod
    def _per_token(cameras: Cameras, grid: tuple[int, int]) -> tuple[Tensor, Tensor]:
        """World-to-camera ``R (B, N, 3, 3)`` and ``t (B, N, 3)`` of every token's view."""
        P = grid[0] * grid[1]
        R = cameras.R.repeat_interleave(P, dim=1)
        t = cameras.t.repeat_interleave(P, dim=1)
        return R, t

    def rescaled(self, factor: float | Tensor) -> Planes:
        """The same planes in another length unit, as :meth:`hrope.Cameras.rescaled` with the same
        ``factor`` (a positive float or ``(B,)``): depths times it, or m = n / d divided by it."""
        value = torch.as_tensor(factor, dtype=None if isinstance(factor, Tensor) else torch.float64, device=self.device)
        per_token = value.view(*value.shape, 1)  # (B, 1): over the tokens
        if self._m is not None:
            return Planes.from_m(self._m / per_token[..., None].to(self._m))
        assert self.normal is not None and self.depth is not None  # set whenever m is not
        return Planes(self.normal, self.depth * per_token.to(self.depth))

    def __repr__(self) -> str:
        return f"Planes(B={self.shape[0]}, N={self.shape[1]})"
