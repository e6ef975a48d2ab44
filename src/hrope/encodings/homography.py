"""HRoPE: per-token plane-induced homographies (DESIGN.md §4).

Token t of view c carries the plane m_t = n_t / d_t in its camera frame (:class:`hrope.Planes`).

``hrope-lift`` (§4.2, gauge-invariant): D_t = Λ_t E_c with Λ_t = [[K̂_c, 0], [-m_t^T, 1]], so the
top-left 3x3 block of D_i D_j^-1 is K̂_i (R_ij + t_ij m_j^T) K̂_j^-1, the homography from view j to
view i induced by the key's plane. m = 0 gives PRoPE; det D = det K̂.

``hrope`` (§4.3, the paper's Eq. 5): H = K̂_c (R + κ t n_w^T) with the plane in the world frame,
(R, t) the camera's pose or a per-patch pose E_u = ΔE E_c, in a gauge (by default the world
translated to the mean camera centre, which makes H_i H_j^-1 world-frame invariant).
In terms of m this is H ∝ K̂ (s I + t m^T) R with s = 1 - m·t (= d_w / d_c), the scale-free form
used here; det(s I + t m^T) = s^2 and (s I + t m^T)^-1 = (I - t m^T) / s (Sherman–Morrison,
since s + m·t = 1). H̃ = H / |det H|^(1/3) has det ±1 (unit |det|, SL(3) up to sign).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ..cameras import Cameras
from ..geometry import geometry_dtype, invert_intrinsics, invert_se3, lift
from ..planes import MAX_INVERSE_DISTANCE, Planes, clamp_plane_vectors
from ..shapes import check_rotations
from .base import Encoding, EncodingError, TokenTransform, per_token_param
from .layout import ROPE_BASE, HeadLayout

__all__ = ["HRoPE", "HRoPELift"]

# The Eq. 5 form's clamp on top of the shared |m| <= MAX_INVERSE_DISTANCE (docs/encodings.md, "Clamp
# policy"): |s| = |1 - m·t| >= MIN_WORLD_OFFSET_RATIO, t the token's translation in the gauge (planes
# through the gauge's origin are degenerate in the world-frame parameterisation). Together they bound
# the condition number of every H̃.
MIN_WORLD_OFFSET_RATIO = 0.05

# hrope's options: the world frame Eq. 5 is evaluated in, and where (R, t) come from.
GAUGES = ("centroid", "world")
POSES = ("camera", "per-patch")
PATCH_POSE_PARAMS = ("patch_rotation", "patch_translation")  # the params of pose="per-patch"


def _token_planes(planes: Planes, cameras: Cameras, grid: tuple[int, int], dtype: torch.dtype) -> Tensor:
    """Plane vectors reshaped to ``(B, V, P, 3)`` (unclamped)."""
    m = planes.m(cameras, grid, dtype)
    return m.reshape(cameras.batch_size, cameras.num_views, grid[0] * grid[1], 3)


class _Views(NamedTuple):
    """The per-view parts ``(B, V, ...)`` of ``hrope-lift``'s D_t and D_t^-1: ``base``
    [[K̂R, K̂t], [0, 1]] and ``neg_Rt`` -[R | t] ``(3, 4)`` (D's last row is e4 + m^T neg_Rt),
    ``base_inv`` [[R^T K̂^-1, -R^T t], [0, 1]], ``column`` [-R^T t; 1] ``(4, 1)``
    (D^-1 = base_inv + column [(K̂^-T m)^T, 0]) and ``K_inv`` ``(3, 3)``."""

    base: Tensor
    neg_Rt: Tensor
    base_inv: Tensor
    column: Tensor
    K_inv: Tensor


def _views(cameras: Cameras, dtype: torch.dtype) -> _Views:
    K = cameras.normalized_K(dtype)
    E = cameras.world_to_cam.to(dtype)
    R, t = E[..., :3, :3], E[..., :3, 3:]
    K_inv, R_T = invert_intrinsics(K), R.transpose(-1, -2)
    RT_t = R_T @ t
    last = E.new_tensor([0.0, 0.0, 0.0, 1.0]).expand(*E.shape[:-2], 1, 4)
    base = torch.cat([K @ E[..., :3, :], last], dim=-2)
    base_inv = torch.cat([torch.cat([R_T @ K_inv, -RT_t], dim=-1), last], dim=-2)
    column = torch.cat([-RT_t, last[..., 3:]], dim=-2)
    return _Views(base, -E[..., :3, :], base_inv, column, K_inv)


class HRoPELift(Encoding):
    """``hrope-lift``: D_t = Λ_t E_c, Λ_t = [[K̂, 0], [-m^T, 1]], tiled 4x4 blocks + 2D RoPE.

    Λ_t^-1 = [[K̂^-1, 0], [m^T K̂^-1, 1]] (closed form). Needs ``planes``; m is clamped to
    ``|m| <= MAX_INVERSE_DISTANCE`` (the clamp policy).
    """

    name = "hrope-lift"
    needs_planes = True
    neutral_planes = "infinity"  # m = 0: exactly prope
    per_view = "left"  # D_t = P_c (I - ĉ_c u_t^T): PRoPE's P_c times a per-token rank-one update

    def view_factor(self, cameras: Cameras) -> tuple[Tensor, Tensor]:
        """PRoPE's P_c = lift(K̂_c) E_c and P_c^-1 ``(B, V, 4, 4)``: D_t = P_c A_t with
        A_t = I - ĉ_c u_t^T, ĉ_c = E_c^-1 e_4 the camera centre and u_t = E_c^T (m_t, 0)."""
        dtype = geometry_dtype(cameras.K.dtype)
        K = cameras.normalized_K(dtype)
        E = cameras.world_to_cam.to(dtype)
        return lift(K) @ E, invert_se3(E) @ lift(invert_intrinsics(K))

    def rank_one_rest(self, cameras: Cameras, grid: tuple[int, int], planes: Planes) -> tuple[Tensor, Tensor]:
        """ĉ_c = (-R^T t, 1) ``(B, V, 4)`` and u_t = E_c^T (m_t, 0) = (R^T m_t, m_t·t) ``(B, V, P, 4)``
        (m clamped as in :meth:`lifts`): A_t = I - ĉ_c u_t^T with :meth:`view_factor`'s P_c."""
        dtype = geometry_dtype(cameras.K.dtype)
        v = _views(cameras, dtype)
        m = clamp_plane_vectors(_token_planes(planes, cameras, grid, dtype))  # (B, V, P, 3)
        return v.column[..., 0], -(m @ v.neg_Rt)

    def prepare(
        self, cameras: Cameras, grid: tuple[int, int], head_dim: int, planes: Planes | None = None, **params: Tensor
    ) -> TokenTransform:
        """Needs ``planes (B, N)``; D_t = blockdiag(Λ_t E_c tiles, RoPE)."""
        self.check_inputs(planes, params)
        assert planes is not None  # check_inputs: needs_planes
        D, D_inv = self.lifts(cameras, grid, planes)
        return self.token_transform(HeadLayout(head_dim, block=4), cameras, grid, D, D_inv)

    @staticmethod
    def lifts(cameras: Cameras, grid: tuple[int, int], planes: Planes) -> tuple[Tensor, Tensor]:
        """D_t = Λ_t E_c and D_t^-1 = E_c^-1 Λ_t^-1, each ``(B, V, P, 4, 4)``.

        Only the plane varies per token, so both are per-view matrices plus one per-token row or
        a rank-one update (no per-token matrix products):
        D = [[K̂R, K̂t], [-(R^T m)^T, 1 - m·t]],
        D^-1 = [[R^T K̂^-1 - (R^T t)(K̂^-T m)^T, -R^T t], [(K̂^-T m)^T, 1]].
        """
        dtype = geometry_dtype(cameras.K.dtype)
        v = _views(cameras, dtype)
        m = clamp_plane_vectors(_token_planes(planes, cameras, grid, dtype))  # (B, V, P, 3)
        D = v.base[:, :, None] + F.pad((m @ v.neg_Rt)[..., None, :], (0, 0, 3, 0))  # the per-token last row
        D_inv = v.base_inv[:, :, None] + v.column[:, :, None] * F.pad(m @ v.K_inv, (0, 1))[..., None, :]
        return D, D_inv


class HRoPE(Encoding):
    """``hrope``: the paper's Eq. 5, H̃ = normalise(K̂ (R + κ t n_w^T)) per token, plus 2D RoPE.

    Tiled 3x3 blocks (q by H̃_i^T, k and v by H̃_j^-1, o by H̃_i) by default; ``lift4=True`` tiles
    the 4x4 ``diag(H̃, 1)`` instead. Needs ``planes``.

    ``gauge``, the world frame Eq. 5 is evaluated in: ``"centroid"`` (default) translates each
    batch sample's world so that its origin is the mean camera centre c̄ (E_c -> E_c [[I, c̄], [0, 1]],
    rotation unchanged), which makes every H̃_i H̃_j^-1 world-frame invariant; ``"world"`` uses the
    given frame (a camera at the world origin has t = 0 and H = K̂R: its planes drop out).
    ``pose``: ``"camera"`` (default) takes (R, t) from the token's camera; ``"per-patch"`` composes
    the params ``patch_rotation (B, N, 3, 3)`` and ``patch_translation (B, N, 3)`` with it,
    E_u = [[ΔR, Δt], [0, 1]] E_c (in the gauge), and reads the token's plane in E_u's frame;
    identity / zero offsets give ``pose="camera"`` exactly.
    """

    name = "hrope"
    needs_planes = True
    neutral_planes = "fronto-parallel"  # the plane at infinity would drop the camera translation (H = K̂R)

    def __init__(
        self,
        lift4: bool = False,
        rope_base: float = ROPE_BASE,
        min_world_offset_ratio: float = MIN_WORLD_OFFSET_RATIO,
        max_inverse_distance: float = MAX_INVERSE_DISTANCE,
        gauge: str = "centroid",
        pose: str = "camera",
    ) -> None:
        super().__init__(rope_base)
        if gauge not in GAUGES:
            raise EncodingError(f"hrope: gauge must be one of {', '.join(GAUGES)}; got {gauge!r}")
        if pose not in POSES:
            raise EncodingError(f"hrope: pose must be one of {', '.join(POSES)}; got {pose!r}")
        self.lift4 = lift4
        self.min_world_offset_ratio = min_world_offset_ratio
        self.max_inverse_distance = max_inverse_distance
        self.gauge = gauge
        self.pose = pose
        if pose == "per-patch":
            self.param_names = PATCH_POSE_PARAMS  # a fact of this instance (the class default is ())

    def poses(self, cameras: Cameras, grid: tuple[int, int], **params: Tensor) -> tuple[Tensor, Tensor]:
        """World-to-token R ``(B, V, 1 or P, 3, 3)`` and t ``(B, V, 1 or P, 3)`` in the gauge, per
        view (``pose="camera"``) or per token (``"per-patch"``), in the geometry dtype.

        Centroid gauge: t <- t + R c̄, c̄ the mean over the sample's views of the centres -R^T t.
        Per-patch: R_u = ΔR R, t_u = ΔR t + Δt.
        """
        dtype = geometry_dtype(cameras.K.dtype)
        E = cameras.world_to_cam.to(dtype)
        R, t = E[..., :3, :3], E[..., :3, 3:]  # (B, V, 3, 3), (B, V, 3, 1)
        if self.gauge == "centroid":
            centroid = -(R.transpose(-1, -2) @ t).mean(1, keepdim=True)  # (B, 1, 3, 1)
            t = t + R @ centroid
        R, t = R[:, :, None], t[:, :, None]
        if self.pose == "per-patch":
            dR = per_token_param(params["patch_rotation"], cameras, grid, (3, 3), "patch_rotation", dtype)
            check_rotations(dR, "patch_rotation", error=EncodingError)
            dt = per_token_param(params["patch_translation"], cameras, grid, (3,), "patch_translation", dtype)
            R, t = dR @ R, dR @ t + dt[..., None]
        return R, t[..., 0]

    def homographies(
        self, cameras: Cameras, grid: tuple[int, int], planes: Planes, **params: Tensor
    ) -> tuple[Tensor, Tensor]:
        """SL(3)-normalised H̃ and H̃^-1, each ``(B, V, P, 3, 3)``, for the poses of :meth:`poses`.

        Per token only the plane m varies besides (R, t), so both are rank-one updates:
        (s I + t m^T) R = s R + t (R^T m)^T and R^T (I - t m^T) = R^T - (R^T t) m^T.
        """
        dtype = geometry_dtype(cameras.K.dtype)
        K = cameras.normalized_K(dtype)[:, :, None]  # (B, V, 1, 3, 3)
        K_inv = invert_intrinsics(K)
        R, t = self.poses(cameras, grid, **params)
        m = self.clamp_planes(_token_planes(planes, cameras, grid, dtype), t)  # (B, V, P, 3)
        s = (1.0 - (m * t).sum(-1))[..., None, None]  # (B, V, P, 1, 1); never in (-eps, eps) after the clamp
        # Eq. 5's H = K̂ A / s, A = s R + t (R^T m)^T (scale-free d_w R + t n_w^T), has det
        # fx fy / s; dividing by its |det|^(1/3) gives the scale below (the sign of s is kept, so
        # H̃ equals the literal normalised Eq. 5 matrix, det ±1).
        focal = (K[..., 0, 0] * K[..., 1, 1])[..., None, None]
        scale = torch.sign(s) * (focal * s.square()).pow(1.0 / 3.0)
        R_T, t, m = R.transpose(-1, -2), t[..., None], m[..., None, :]  # t a column, m a row
        H = (s * (K @ R) + (K @ t) * (m @ R)) / scale
        H_inv = (R_T @ K_inv - (R_T @ t) * (m @ K_inv)) * (scale / s)
        return H, H_inv

    def clamp_planes(self, m: Tensor, t: Tensor) -> Tensor:
        """Apply the documented clamps to planes m ``(..., 3)`` given the tokens' translations t in
        the gauge (from :meth:`poses`): ``|m| <= max_inverse_distance``, then move m along t so
        that ``|1 - m·t| >= min_world_offset_ratio`` (sign of 1 - m·t kept, + when 0)."""
        m = clamp_plane_vectors(m, self.max_inverse_distance)
        s = 1.0 - (m * t).sum(-1, keepdim=True)
        eps = self.min_world_offset_ratio
        target = torch.where(s < 0, -1.0, 1.0).to(s.dtype) * eps  # eps exactly in s's dtype
        clamped = torch.where(s.abs() < eps, target, s)
        t_sq = (t * t).sum(-1, keepdim=True)
        # s differs from 1 only when |t| > 0, so the division is safe where it matters
        return m + (s - clamped) * t / torch.where(t_sq > 0, t_sq, torch.ones_like(t_sq))

    def prepare(
        self, cameras: Cameras, grid: tuple[int, int], head_dim: int, planes: Planes | None = None, **params: Tensor
    ) -> TokenTransform:
        """Needs ``planes (B, N)`` (and, with ``pose="per-patch"``, ``patch_rotation (B, N, 3, 3)``,
        ``patch_translation (B, N, 3)``); D_t = blockdiag(H̃_t tiles, RoPE)."""
        self.check_inputs(planes, params)
        assert planes is not None  # check_inputs: needs_planes
        H, H_inv = self.homographies(cameras, grid, planes, **params)
        if self.lift4:
            H, H_inv = lift(H), lift(H_inv)
        layout = HeadLayout(head_dim, block=4 if self.lift4 else 3)
        return self.token_transform(layout, cameras, grid, H, H_inv)
