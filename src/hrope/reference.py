"""Dense float64 references of the encodings (tests only; never used by the fast path).

For each token the full ``head_dim x head_dim`` matrix D_t is built from the documented formulas
(docs/encodings.md, DESIGN.md §3–4) by this module's own code: head layout, RoPE angles,
normalised intrinsics, patch-centre rays, plane vectors, the documented input clamps, tangent
frames and explicit per-token block formulas; no closed-form inverses. Of the fast path it uses
only the encoding classes (dispatch and their options), ``Cameras``, ``get_encoding``,
``EncodingError`` and documented constants, so a bug in a fast-path helper shows up as a mismatch.
Attention is then explicit:

    a_ij = softmax_j((D_i^T q_i)·(D_j^-1 k_j) * scale),   o_i = D_i Σ_j a_ij D_j^-1 v_j.

Tokens without a camera (registers, text: ``camera_tokens``) are tokens whose D is the identity
matrix (:func:`with_identity_tokens`); cross-attention is :func:`dense_attention` with the two
token sets' matrices, a KV cache the same attention over the concatenated sequence with its mask.
This costs O(N d^2) memory and O(N^2) time: use it on small inputs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar, cast

import torch
from torch import Tensor

from .cameras import Cameras
from .encodings import (
    GTA,
    CaPE,
    Encoding,
    EncodingError,
    HRoPE,
    HRoPEDepth,
    HRoPEFull,
    HRoPELift,
    HRoPELiftUV,
    HRoPEPF,
    HRoPESE3,
    HRoPESO3,
    NoEncoding,
    PRoPE,
    RayRoPE,
    RoPE2D,
    URoPE,
    WorldRoPE,
    get_encoding,
)

# Documented constants only (docs/encodings.md, docs/encodings_query_frame.md): the grazing clamp
# |n·r̂|/|r̂| >= 0.05 of Planes(normal, depth), the clamp policy's MAX_INVERSE_DISTANCE = 100,
# MIN_DEPTH = 0.01 and MAX_DEPTH = 100, POSITION_MARGIN = 2, RayRoPE's ray offsets (0, 0), (1, 0),
# (0, 1) and coordinate periods 4 / 8 / 80 (8 asinh(10) for its asinh coordinate).
from .encodings.query_frame import POSITION_MARGIN
from .encodings.rayrope import RAY_OFFSETS
from .encodings.urope import RELEASED_CLAMP, RELEASED_DEPTH_EPS
from .planes import MAX_DEPTH, MAX_INVERSE_DISTANCE, MIN_DEPTH, MIN_GRAZING_COS

if TYPE_CHECKING:  # annotations only: the reference uses no fast-path helper
    from .planes import Planes
    from .tokens import CameraTokens

__all__ = [
    "multiview_attention",
    "token_matrices",
    "dense_attention",
    "query_frame_matrices",
    "query_frame_attention",
    "query_frame_cross_attention",
    "Layout",
    "camera_token_positions",
    "with_identity_tokens",
]

_T = TypeVar("_T")


class Layout(NamedTuple):
    """One head's channels: ``[num_blocks tiles of block x block | identity | RoPE-x 2F | RoPE-y 2F]``.

    ``block`` 0: no geometric tiles; ``num_freqs`` F = head_dim // 8 with RoPE, 0 without.
    """

    head_dim: int
    block: int
    num_freqs: int

    @property
    def geo_dim(self) -> int:
        return self.head_dim - 4 * self.num_freqs

    @property
    def num_blocks(self) -> int:
        return self.geo_dim // self.block if self.block else 0


class _Tokens(NamedTuple):
    """Per-token float64 geometry, each ``(B, N, ...)``: K̂ ``(3, 3)``, world-to-camera E ``(4, 4)``,
    its R ``(3, 3)`` and t ``(3,)``, and the patch-centre ray r̂ = K̂^-1 (u, v, 1) ``(3,)``."""

    K: Tensor
    E: Tensor
    R: Tensor
    t: Tensor
    ray: Tensor


def _normalized_K(K: Tensor, image_size: tuple[int, int]) -> Tensor:
    """K̂ = S K ``(..., 3, 3)`` for zero-skew pixel K, S = [[1/W, 0, -1/2], [0, 1/H, -1/2], [0, 0, 1]]."""
    H, W = image_size
    S = torch.tensor([[1.0 / W, 0.0, -0.5], [0.0, 1.0 / H, -0.5], [0.0, 0.0, 1.0]], dtype=torch.float64)
    return S @ K.double()


def _tokens(cameras: Cameras, grid: tuple[int, int]) -> _Tokens:
    """The per-token geometry of N = V * grid_h * grid_w tokens (view-major, x fastest)."""
    P = grid[0] * grid[1]
    K = _normalized_K(cameras.K, cameras.image_size).repeat_interleave(P, 1)
    E = cameras.world_to_cam.double().repeat_interleave(P, 1)
    uv = _uv_grid(grid, (0.5, 0.5)).repeat(cameras.num_views, 1)  # (N, 2)
    pix = torch.cat([uv, torch.ones_like(uv[:, :1])], -1).expand(*K.shape[:2], 3)
    ray = torch.linalg.solve(K, pix[..., None]).squeeze(-1)
    return _Tokens(K, E, E[..., :3, :3], E[..., :3, 3], ray)


def _mv(M: Tensor, x: Tensor) -> Tensor:
    """Matrix-vector product ``M (..., r, c) x (..., c) -> (..., r)``."""
    return (M @ x[..., None]).squeeze(-1)


def _block4(A: Tensor, b: Tensor, c: Tensor | None = None, delta: Tensor | None = None) -> Tensor:
    """``[[A, b], [c^T, δ]] (..., 4, 4)`` from A ``(..., 3, 3)``, b, c ``(..., 3)`` (c = 0) and δ ``(...)`` (1)."""
    c = torch.zeros_like(b) if c is None else c
    delta = torch.ones_like(b[..., 0]) if delta is None else delta
    top = torch.cat([A, b[..., None]], -1)
    bottom = torch.cat([c, delta[..., None]], -1)[..., None, :]
    return torch.cat([top, bottom], -2)


# ----------------------------------------------------------------------------- planes and frames
def _plane_vectors(planes: Planes, tok: _Tokens) -> Tensor:
    """Camera-frame plane vectors m ``(B, N, 3)``: the stored m of ``Planes.from_m``, else
    m = n / (z n·r̂) with z at least MIN_DEPTH and n·r̂ pushed out to at least MIN_GRAZING_COS |r̂|
    in magnitude (sign kept, + when exactly 0)."""
    if planes.normal is None:
        return cast(Tensor, planes._m).double()  # Planes.from_m
    n, z = planes.normal.double(), cast(Tensor, planes.depth).double()
    z = torch.where(z < MIN_DEPTH, torch.full_like(z, MIN_DEPTH), z)
    n_dot_r = (n * tok.ray).sum(-1)
    floor = MIN_GRAZING_COS * tok.ray.norm(dim=-1)
    n_dot_r = torch.where(n_dot_r.abs() < floor, torch.where(n_dot_r < 0, -floor, floor), n_dot_r)
    return n / (z * n_dot_r)[..., None]


def _nearest_plane(m: Tensor, limit: float = MAX_INVERSE_DISTANCE) -> Tensor:
    """The clamp policy's plane bound: a plane m ``(..., 3)`` nearer than 1/limit to its camera
    centre (``|m| > limit``) is moved out along its normal to distance 1/limit."""
    norm = m.norm(dim=-1, keepdim=True)
    too_close = norm > limit
    return torch.where(too_close, limit * m / torch.where(too_close, norm, torch.ones_like(norm)), m)


def _ray_point_depth(z: Tensor) -> Tensor:
    """The clamp policy's depth bound: z-depths of points placed on rays, limited to [MIN_DEPTH, MAX_DEPTH]."""
    return torch.minimum(torch.maximum(z, torch.full_like(z, MIN_DEPTH)), torch.full_like(z, MAX_DEPTH))


def _clamp_planes(encoding: HRoPE, m: Tensor, t: Tensor) -> Tensor:
    """``hrope``'s documented clamps of m ``(B, N, 3)`` with the tokens' translations t ``(B, N, 3)``
    in its gauge.

    First m is shortened to ``|m| = max_inverse_distance`` if longer (:func:`_nearest_plane`); then,
    where ``|s| = |1 - m·t| < min_world_offset_ratio``, its component along t is replaced so that s
    becomes ± that bound (the sign of s, + when s = 0).
    """
    eps = encoding.min_world_offset_ratio
    m = _nearest_plane(m, encoding.max_inverse_distance)
    s = 1.0 - (m * t).sum(-1, keepdim=True)
    near_origin = s.abs() < eps
    target = torch.where(s < 0, -1.0, 1.0).to(s.dtype) * eps
    t_sq = (t * t).sum(-1, keepdim=True)
    t_dual = t / torch.where(near_origin, t_sq, torch.ones_like(t_sq))  # t / |t|^2; |t| > 0 wherever s != 1
    m_along_t = (m * t).sum(-1, keepdim=True) * t_dual
    return torch.where(near_origin, m - m_along_t + (1.0 - target) * t_dual, m)


def _tangent_frames(normal: Tensor) -> Tensor:
    """Right-handed frames ``F = [t1, t2, n]`` (columns) ``(..., 3, 3)`` for unit normals ``(..., 3)``:
    t1 the camera x axis (y axis when |n_x| > 0.9) projected onto the plane, t2 = n x t1."""
    e_x = torch.tensor([1.0, 0.0, 0.0], dtype=normal.dtype)
    e_y = torch.tensor([0.0, 1.0, 0.0], dtype=normal.dtype)
    axis = torch.where(normal[..., :1].abs() > 0.9, e_y, e_x)
    projector = torch.eye(3, dtype=normal.dtype) - normal[..., :, None] * normal[..., None, :]
    t1 = _mv(projector, axis)
    t1 = t1 / t1.norm(dim=-1, keepdim=True)
    (nx, ny, nz), (ux, uy, uz) = normal.unbind(-1), t1.unbind(-1)
    t2 = torch.stack([ny * uz - nz * uy, nz * ux - nx * uz, nx * uy - ny * ux], -1)
    return torch.stack([t1, t2, normal], -1)


# ----------------------------------------------------------------------------- geometric blocks
# Each builder returns the geometric block of every token, (B, N, b, b), from the encoding's
# definition; 4x4 ones are written out as [[K̂ M R, K̂ (M t + w)], [c^T R, c^T t + δ]] by hand
# for D = lift(K̂) G E with G = [[M, w], [c^T, δ]].


def _prope(encoding: Encoding, tok: _Tokens, planes: Planes | None, params: dict[str, Tensor]) -> Tensor:
    """P = lift(K̂) E = [[K̂R, K̂t], [0, 1]]."""
    return _block4(tok.K @ tok.R, _mv(tok.K, tok.t))


def _gta(encoding: GTA, tok: _Tokens, planes: Planes | None, params: dict[str, Tensor]) -> Tensor:
    """E with the translation times the learnable scale when there is one: [[R, s t], [0, 1]]."""
    scale = 1.0 if encoding.translation_scale is None else encoding.translation_scale.double()
    return _block4(tok.R, scale * tok.t)


def _cape(encoding: CaPE, tok: _Tokens, planes: Planes | None, params: dict[str, Tensor]) -> Tensor:
    """EscherNet's P^-T for P = [[R, t], [0, 1]] (a row vector times P^-T is P^-1 times the column),
    by a general matrix inverse; ``form="transposed"``: E = P."""
    E = _block4(tok.R, tok.t)
    return E if encoding.form == "transposed" else torch.linalg.inv(E).transpose(-1, -2)


def _hrope_pose(encoding: HRoPE, tok: _Tokens, params: dict[str, Tensor]) -> Tensor:
    """World-to-token ``E (B, N, 4, 4)`` in ``hrope``'s gauge: ``"centroid"`` moves the world origin
    to the mean camera centre c̄ of the sample (E [[I, c̄], [0, 1]]; every view has the same number
    of tokens, so the mean over tokens is the mean over views), ``"world"`` keeps E; ``pose="per-patch"``
    then composes [[ΔR, Δt], [0, 1]] E."""
    E = tok.E
    if encoding.gauge == "centroid":
        centre = torch.linalg.inv(E)[..., :3, 3].mean(1, keepdim=True)  # (B, 1, 3)
        E = E @ _block4(torch.eye(3, dtype=E.dtype).expand_as(tok.R), centre.expand_as(tok.t))
    if encoding.pose == "per-patch":
        E = _block4(params["patch_rotation"].double(), params["patch_translation"].double()) @ E
    return E


def _hrope(encoding: HRoPE, tok: _Tokens, planes: Planes, params: dict[str, Tensor]) -> Tensor:
    """Eq. 5 literally: H = K̂ (R + κ t n_w^T) with (R, t) the token's pose in the gauge
    (:func:`_hrope_pose`) and the clamped plane put in the world frame through that pose
    (n_w = R^T n_c, d_w = d_c - n_c·t, κ = 1/d_w), over |det H|^(1/3); diag(H̃, 1) with lift4."""
    E = _hrope_pose(encoding, tok, params)
    R, t = E[..., :3, :3], E[..., :3, 3]
    m = _clamp_planes(encoding, _plane_vectors(planes, tok), t)
    inverse_d_c = m.norm(dim=-1)
    n_c = m / inverse_d_c.clamp_min(torch.finfo(m.dtype).tiny)[..., None]
    kappa = 1.0 / (1.0 / inverse_d_c - (n_c * t).sum(-1))  # 0 for the plane at infinity
    n_w = _mv(R.transpose(-1, -2), n_c)
    H = tok.K @ (R + kappa[..., None, None] * t[..., :, None] * n_w[..., None, :])
    H = H / torch.linalg.det(H).abs().pow(1.0 / 3.0)[..., None, None]
    return _block4(H, torch.zeros_like(t)) if encoding.lift4 else H


def _hrope_lift(encoding: Encoding, tok: _Tokens, planes: Planes, params: dict[str, Tensor]) -> Tensor:
    """Λ E with Λ = [[K̂, 0], [-m^T, 1]], m within the plane bound."""
    m = _nearest_plane(_plane_vectors(planes, tok))
    return _block4(tok.K, torch.zeros_like(m), -m) @ tok.E


def _hrope_depth(encoding: Encoding, tok: _Tokens, planes: Planes | None, params: dict[str, Tensor]) -> Tensor:
    """G = [[I, -p], [0, 1]], p = z r̂ with z within the depth bound: D = [[K̂R, K̂ (t - p)], [0, 1]]."""
    p = _ray_point_depth(params["depth"].double())[..., None] * tok.ray
    return _block4(tok.K @ tok.R, _mv(tok.K, tok.t - p))


def _hrope_so3(encoding: Encoding, tok: _Tokens, planes: Planes | None, params: dict[str, Tensor]) -> Tensor:
    """G = lift(R_u): D = [[K̂ R_u R, K̂ R_u t], [0, 1]]."""
    R_u = params["rotation"].double()
    return _block4(tok.K @ R_u @ tok.R, _mv(tok.K @ R_u, tok.t))


def _hrope_se3(encoding: Encoding, tok: _Tokens, planes: Planes | None, params: dict[str, Tensor]) -> Tensor:
    """G = [[R_u, t_u], [0, 1]]: D = [[K̂ R_u R, K̂ (R_u t + t_u)], [0, 1]]."""
    G = params["transform"].double()
    R_u, t_u = G[..., :3, :3], G[..., :3, 3]
    return _block4(tok.K @ R_u @ tok.R, _mv(tok.K, _mv(R_u, tok.t) + t_u))


def _hrope_pf(encoding: Encoding, tok: _Tokens, planes: Planes, params: dict[str, Tensor]) -> Tensor:
    """G = [[F^T, -F^T p], [0, 1]] with m within the plane bound, the camera-facing normal
    n = -m/|m|, p = z r̂ where the plane crosses the ray, z = 1 / (m·r̂) within the depth bound, and
    F = [t1, t2, n]: D = [[K̂ F^T R, K̂ F^T (t - p)], [0, 1]]."""
    m = _nearest_plane(_plane_vectors(planes, tok))
    normal = -m / m.norm(dim=-1, keepdim=True)
    p = _ray_point_depth(1.0 / (m * tok.ray).sum(-1, keepdim=True)) * tok.ray
    KF_T = tok.K @ _tangent_frames(normal).transpose(-1, -2)
    return _block4(KF_T @ tok.R, _mv(KF_T, tok.t - p))


def _hrope_full(encoding: Encoding, tok: _Tokens, planes: Planes | None, params: dict[str, Tensor]) -> Tensor:
    """Any G = [[A, b], [c^T, δ]]: D = [[K̂ A R, K̂ (A t + b)], [c^T R, c^T t + δ]]."""
    G = params["transform"].double()
    A, b, c, delta = G[..., :3, :3], G[..., :3, 3], G[..., 3, :3], G[..., 3, 3]
    return _block4(
        tok.K @ A @ tok.R, _mv(tok.K, _mv(A, tok.t) + b), _mv(tok.R.transpose(-1, -2), c), (c * tok.t).sum(-1) + delta
    )


class _Spec(NamedTuple):
    """What the reference knows of one encoding class: tile size b (0: no tiles), whether 2D RoPE
    is on, and the builder of the ``(B, N, b, b)`` blocks ``(encoding, tokens, planes, params)``."""

    block: int
    rope: bool
    build: Callable[..., Tensor] | None = None


_SPECS: dict[type[Encoding], _Spec] = {
    NoEncoding: _Spec(0, rope=False),
    RoPE2D: _Spec(0, rope=True),
    PRoPE: _Spec(4, rope=True, build=_prope),
    GTA: _Spec(4, rope=True, build=_gta),
    CaPE: _Spec(4, rope=False, build=_cape),
    HRoPE: _Spec(3, rope=True, build=_hrope),  # 4 with lift4=True, see _layout
    HRoPELift: _Spec(4, rope=True, build=_hrope_lift),
    HRoPEDepth: _Spec(4, rope=True, build=_hrope_depth),
    HRoPESO3: _Spec(4, rope=True, build=_hrope_so3),
    HRoPESE3: _Spec(4, rope=True, build=_hrope_se3),
    HRoPEPF: _Spec(4, rope=True, build=_hrope_pf),
    HRoPEFull: _Spec(4, rope=True, build=_hrope_full),
}


def _for_class(table: dict[type[Encoding], _T], encoding: Encoding) -> _T:
    """The entry of ``table`` for the encoding's class or its nearest registered base class."""
    for cls in type(encoding).__mro__:
        if cls in table:
            return table[cls]
    raise EncodingError(f"no dense reference for encoding class {type(encoding).__name__} ({encoding.name!r})")


def _layout(encoding: Encoding, spec: _Spec, head_dim: int) -> Layout:
    """The head layout of ``encoding``; hrope with ``lift4`` tiles diag(H̃, 1) as 4x4 blocks."""
    block = 4 if isinstance(encoding, HRoPE) and encoding.lift4 else spec.block
    return Layout(head_dim, block, head_dim // 8 if spec.rope else 0)


def _rope_matrix(layout: Layout, grid: tuple[int, int], num_views: int, base: float) -> Tensor:
    """``(N, d, d)``: identity with the 2x2 rotations R(θ) on the split pairs (c, c + F) of the RoPE
    channels, θ = ix * w_f on the x quarter and iy * w_f on the y quarter, w_f = base^(-f/F)."""
    d, F = layout.head_dim, layout.num_freqs
    token = torch.arange(grid[0] * grid[1]).repeat(num_views)
    index = (token % grid[1], token // grid[1])  # (ix, iy) of every token
    D = torch.eye(d, dtype=torch.float64).repeat(token.numel(), 1, 1)
    for axis in range(2):
        for f in range(F):
            a = layout.geo_dim + 2 * F * axis + f
            theta = index[axis].double() * base ** (-f / F)
            D[:, a, a], D[:, a, a + F] = theta.cos(), -theta.sin()
            D[:, a + F, a], D[:, a + F, a + F] = theta.sin(), theta.cos()
    return D


def _tile(blocks: Tensor, layout: Layout, D: Tensor) -> Tensor:
    """Write per-token ``blocks (B, N, b, b)`` on the geometric diagonal of ``D (B, N, d, d)``."""
    b = layout.block
    for i in range(layout.num_blocks):
        D[..., i * b : (i + 1) * b, i * b : (i + 1) * b] = blocks
    return D


def token_matrices(
    encoding: str | Encoding,
    cameras: Cameras,
    grid: tuple[int, int],
    head_dim: int,
    planes: Planes | None = None,
    params: dict[str, Tensor] | None = None,
) -> tuple[Tensor, Layout]:
    """Every token's full transform D_t ``(B, N, head_dim, head_dim)`` in float64, and its :class:`Layout`.

    Relative encodings only (for query-frame encodings the key transform depends on the query).
    """
    encoding = get_encoding(encoding)
    params = params or {}
    encoding.check_inputs(planes, params)
    grid = cast("tuple[int, int]", tuple(grid))  # a list is accepted too
    spec = _for_class(_SPECS, encoding)
    layout = _layout(encoding, spec, head_dim)
    D = _rope_matrix(layout, grid, cameras.num_views, encoding.rope_base).repeat(cameras.batch_size, 1, 1, 1)
    if spec.build is not None:
        D = _tile(spec.build(encoding, _tokens(cameras, grid), planes, params), layout, D)
    return D, layout


def camera_token_positions(camera_tokens: CameraTokens, length: int) -> Tensor:
    """Positions ``(N,)`` of the camera tokens among ``length``: ``arange(length)[camera_tokens]`` for a
    slice, integer positions (the i-th: camera token i) or a boolean mask (sequence order)."""
    if not isinstance(camera_tokens, (slice, Tensor)):
        camera_tokens = torch.tensor(list(camera_tokens), dtype=torch.long)
    elif isinstance(camera_tokens, Tensor):
        camera_tokens = camera_tokens.cpu()
    return torch.arange(length)[camera_tokens]


def with_identity_tokens(D: Tensor, camera_tokens: CameraTokens, length: int) -> Tensor:
    """Per-token matrices ``(B, length, d, d)``: the camera tokens' ``D (B, N, d, d)`` at their
    positions (:func:`camera_token_positions`), the identity matrix at every other position."""
    B, N, d, _ = D.shape
    full = torch.eye(d, dtype=D.dtype).repeat(B, length, 1, 1)
    positions = camera_token_positions(camera_tokens, length)
    if positions.numel() != N:
        raise EncodingError(f"camera_tokens gives {positions.numel()} positions for {N} camera tokens")
    full[:, positions] = D
    return full


def _sdpa_options(
    q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None, dropout_p: float, is_causal: bool, enable_gqa: bool
) -> tuple[Tensor, Tensor, Tensor | None]:
    """SDPA's keyword options for the dense references: k and v with their heads repeated
    (``enable_gqa``) and the mask to apply (``is_causal`` -> the lower-triangular boolean mask)."""
    if dropout_p != 0.0:
        raise ValueError(
            f"dropout_p must be 0.0 for the dense reference, got {dropout_p}: "
            "a deterministic reference cannot reproduce random dropout"
        )
    if is_causal:
        if attn_mask is not None:
            raise EncodingError("pass either attn_mask or is_causal, not both")
        attn_mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
    if enable_gqa and k.shape[1] != q.shape[1]:
        if q.shape[1] % k.shape[1]:
            raise EncodingError(
                f"enable_gqa: {q.shape[1]} query heads are not a multiple of {k.shape[1]} key/value heads"
            )
        repeat = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
    return k, v, attn_mask


def _softmax(logits: Tensor, attn_mask: Tensor | None) -> Tensor:
    """Softmax over keys after SDPA's mask: boolean (False = masked out) or additive."""
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            logits = logits.masked_fill(~attn_mask, float("-inf"))
        else:
            logits = logits + attn_mask.double()
    return torch.softmax(logits, dim=-1)


def dense_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    D_q: Tensor,
    D_k: Tensor,
    *,
    transform_values: bool = True,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> Tensor:
    """Explicit attention with per-token matrices ``D_q (B, Nq, d, d)``, ``D_k (B, Nk, d, d)``.

    q ``(B, heads, Nq, d)``, k and v ``(B, heads, Nk, d)``; returns float64 ``(B, heads, Nq, d)``.
    SDPA's options as in :func:`multiview_attention`.
    """
    k, v, attn_mask = _sdpa_options(q, k, v, attn_mask, dropout_p, is_causal, enable_gqa)
    q, k, v = q.double(), k.double(), v.double()
    D_k_inv = torch.linalg.inv(D_k)[:, None]
    q_t = (D_q.transpose(-1, -2)[:, None] @ q[..., None]).squeeze(-1)
    k_t = (D_k_inv @ k[..., None]).squeeze(-1)
    v_t = (D_k_inv @ v[..., None]).squeeze(-1) if transform_values else v
    logits = q_t @ k_t.transpose(-1, -2) * (scale if scale is not None else 1.0 / math.sqrt(q.shape[-1]))
    out = _softmax(logits, attn_mask) @ v_t
    if transform_values:
        out = (D_q[:, None] @ out[..., None]).squeeze(-1)
    return out


def multiview_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    encoding: str | Encoding,
    cameras: Cameras,
    grid: tuple[int, int],
    planes: Planes | None = None,
    params: dict[str, Tensor] | None = None,
    camera_tokens: CameraTokens | None = None,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> Tensor:
    """Dense float64 reference of :func:`hrope.multiview_attention`: same arguments and output.

    q, k, v ``(B, heads, N, head_dim)``; returns float64 ``(B, heads, N, head_dim)`` computed on the
    CPU from every token's full ``head_dim x head_dim`` matrix. SDPA's options: ``attn_mask``
    (boolean, True = attend, or additive), ``is_causal`` (lower-triangular over all N tokens; not
    with ``attn_mask``), ``scale``, ``enable_gqa``, and ``dropout_p`` only as 0.0 (ValueError
    otherwise: a deterministic reference cannot reproduce dropout). The documented input clamps of
    the fast path (the grazing clamp of ``Planes(normal, depth)``, ``hrope``'s plane clamps) are
    implemented here too, so float64 fast-path outputs equal this to about 1e-9. With
    ``camera_tokens`` q, k, v have L tokens, the camera tokens at those positions
    (:func:`camera_token_positions`) and identity matrices elsewhere.
    """
    encoding = get_encoding(encoding)
    sdpa: dict[str, Any] = {
        "attn_mask": attn_mask,
        "dropout_p": dropout_p,
        "is_causal": is_causal,
        "scale": scale,
        "enable_gqa": enable_gqa,
    }
    if encoding.query_frame:
        return query_frame_attention(
            q,
            k,
            v,
            encoding=encoding,
            cameras=cameras,
            grid=grid,
            params=params,
            planes=planes,
            camera_tokens=camera_tokens,
            **sdpa,
        )
    D, _ = token_matrices(encoding, cameras, grid, q.shape[-1], planes, params)
    if camera_tokens is not None:
        D = with_identity_tokens(D, camera_tokens, q.shape[2])
    return dense_attention(q, k, v, D, D, transform_values=encoding.transform_values, **sdpa)


# ----------------------------------------------------------------------------- query-frame encodings
# Independent float64 construction of rayrope / urope / worldrope (docs/encodings_query_frame.md):
# world points through explicit matrix inverses, explicit 2x2 expected-rotation blocks, one
# head_dim x head_dim matrix per (query view, key token), explicit softmax over all N keys.


def _uv_grid(grid: tuple[int, int], offset: tuple[float, float]) -> Tensor:
    """Normalised image coordinates ``(P, 2)`` of ``(ix + ox, iy + oy)``, x fastest."""
    gh, gw = grid
    iy, ix = torch.meshgrid(torch.arange(gh, dtype=torch.float64), torch.arange(gw, dtype=torch.float64), indexing="ij")
    return torch.stack([(ix.reshape(-1) + offset[0]) / gw - 0.5, (iy.reshape(-1) + offset[1]) / gh - 0.5], -1)


def _world_points(K_inv: Tensor, cam_to_world: Tensor, uv: Tensor, depth: Tensor) -> Tensor:
    """World points at z-depth ``depth (B, P)`` along the rays through ``uv (P, 2)`` of one view."""
    pix = torch.cat([uv, torch.ones_like(uv[:, :1])], -1)  # (P, 3)
    cam = depth[..., None] * (K_inv[:, None] @ pix[..., None]).squeeze(-1)  # (B, P, 3)
    hom = torch.cat([cam, torch.ones_like(cam[..., :1])], -1)
    return (cam_to_world[:, None] @ hom[..., None]).squeeze(-1)[..., :3]


def _in_camera(E: Tensor, X: Tensor) -> Tensor:
    """World points ``X (B, ..., 3)`` in the camera of world-to-camera ``E (B, 4, 4)``."""
    shape = X.shape
    X = X.reshape(shape[0], -1, 3)
    out = (E[:, None, :3, :3] @ X[..., None]).squeeze(-1) + E[:, None, :3, 3]
    return out.reshape(shape)


def _project(K: Tensor, X: Tensor, grid: tuple[int, int]) -> tuple[Tensor, Tensor]:
    """Query-image positions in patch units ``(..., 2)`` and the 2x3 Jacobian ``(..., 2, 3)``.

    Depth mirrored and floored (|Z| >= MIN_DEPTH), positions clamped (see encodings.query_frame).
    """
    gh, gw = grid
    size = torch.tensor([gw, gh], dtype=torch.float64)
    Ze = X[..., 2].abs().clamp_min(MIN_DEPTH)
    Xe = torch.cat([X[..., :2], Ze[..., None]], -1)
    Kb = K.reshape(K.shape[0], *([1] * (X.ndim - 2)), 3, 3)
    img = (Kb @ Xe[..., None]).squeeze(-1)
    pos = size * (img[..., :2] / Ze[..., None] + 0.5)
    pos = torch.maximum(torch.minimum(pos, (1 + POSITION_MARGIN) * size), -POSITION_MARGIN * size)
    f = torch.stack([Kb[..., 0, 0], Kb[..., 1, 1]], -1) * size  # (..., 2)
    J = torch.zeros(*X.shape[:-1], 2, 3, dtype=torch.float64)
    J[..., 0, 0] = f[..., 0] / Ze
    J[..., 1, 1] = f[..., 1] / Ze
    J[..., 0, 2] = -f[..., 0] * X[..., 0] / Ze**2
    J[..., 1, 2] = -f[..., 1] * X[..., 1] / Ze**2
    return pos, J


def _image_rope_freqs(head_dim: int, base: float) -> Tensor:
    num = head_dim // 4
    return torch.tensor([base ** (-f / num) for f in range(num)], dtype=torch.float64)


def _rotation_block(theta: Tensor) -> Tensor:
    """``(..., 2, 2)`` rotation matrices R(θ)."""
    c, s = theta.cos(), theta.sin()
    return torch.stack([torch.stack([c, -s], -1), torch.stack([s, c], -1)], -2)


def _blocks_to_matrix(blocks: Tensor, head_dim: int, quarters: bool = False) -> Tensor:
    """Pair blocks ``(..., n, 2, 2)`` on channels (p, p + head_dim/2) -> ``(..., d, d)`` (identity after n);
    ``quarters``: pair p < d/4 on (p, p + d/4), pair d/4 + p on (d/2 + p, 3d/4 + p) (urope's head groups)."""
    half, quarter = head_dim // 2, head_dim // 4
    M = torch.eye(head_dim, dtype=torch.float64).expand(*blocks.shape[:-3], head_dim, head_dim).clone()
    for p in range(blocks.shape[-3]):
        idx = [p, p + half]
        if quarters:
            idx = [p, p + quarter] if p < quarter else [p + quarter, p + half]
        for r in range(2):
            for c in range(2):
                M[..., idx[r], idx[c]] = blocks[..., p, r, c]
    return M


def _project_released(K: Tensor, X: Tensor, grid: tuple[int, int]) -> Tensor:
    """URoPE's released projection: (K_patch X)_xy / (|Z| + 1e-5), K_patch the intrinsics in patch
    units, clamped to [-64, 96] patches."""
    gh, gw = grid
    K_patch = torch.diag(torch.tensor([gw, gh, 1.0], dtype=torch.float64)) @ (
        K + torch.tensor([[0, 0, 0.5], [0, 0, 0.5], [0, 0, 0]], dtype=torch.float64)
    )
    img = (K_patch.reshape(K.shape[0], *([1] * (X.ndim - 2)), 3, 3) @ X[..., None]).squeeze(-1)
    return (img[..., :2] / (X[..., 2:3].abs() + RELEASED_DEPTH_EPS)).clamp(*RELEASED_CLAMP)


def _urope_anchors(encoding: URoPE, head: tuple[int, int] | None) -> list[float]:
    """The anchors of one head: every anchor (interleaved), the head's group's left bin edge, or none
    (a head left out: the last ``leaveout_heads``)."""
    if encoding.layout == "interleaved":
        return list(encoding.anchors)
    h, heads = cast("tuple[int, int]", head)
    groups = (heads - encoding.leaveout_heads) // encoding.group_size
    if h >= groups * encoding.group_size:
        return []
    width = (encoding.max_depth - encoding.min_depth) / groups
    return [encoding.min_depth + (h // encoding.group_size) * width]


def _urope_blocks(
    encoding: URoPE, cams: dict[str, Any], grid: tuple[int, int], head_dim: int, view: int, params: dict[str, Tensor]
) -> Tensor:
    freqs = _image_rope_freqs(head_dim, encoding.rope_base)
    anchors = _urope_anchors(encoding, cams["head"])
    if not anchors:
        return _rotation_block(
            torch.zeros(cams["B"], cams["V"] * grid[0] * grid[1], 2 * len(freqs), dtype=torch.float64)
        )
    blocks = []
    uv = _uv_grid(grid, (0.5, 0.5))
    for key_view in range(cams["V"]):
        per_anchor = []
        for anchor in anchors:
            depth = torch.full((cams["B"], grid[0] * grid[1]), anchor, dtype=torch.float64)
            world = _world_points(cams["K_inv"][:, key_view], cams["C2W"][:, key_view], uv, depth)
            X = _in_camera(cams["E"][:, view], world)
            released = encoding.projection == "released"
            per_anchor.append(
                _project_released(cams["K"][:, view], X, grid) if released else _project(cams["K"][:, view], X, grid)[0]
            )
        pos = torch.stack(per_anchor, -2)  # (B, P, A, 2)
        per_pair = []
        for axis in range(2):
            for f, w in enumerate(freqs):
                per_pair.append(_rotation_block(w * pos[:, :, f % len(anchors), axis]))
        blocks.append(torch.stack(per_pair, -3))
    return torch.cat(blocks, 1)


def _urope_query_matrices(
    encoding: URoPE, grid: tuple[int, int], num_views: int, head_dim: int, head: tuple[int, int] | None
) -> Tensor:
    """Query matrices ``(N, d, d)`` of URoPE's released projection: RoPE on the query's own patch centre
    (identity for a head left out)."""
    gh, gw = grid
    iy, ix = torch.meshgrid(torch.arange(gh, dtype=torch.float64), torch.arange(gw, dtype=torch.float64), indexing="ij")
    centre = torch.stack([ix.reshape(-1) + 0.5, iy.reshape(-1) + 0.5], -1).repeat(num_views, 1)  # (N, 2)
    rotated = 1.0 if _urope_anchors(encoding, head) else 0.0
    freqs = _image_rope_freqs(head_dim, encoding.rope_base)
    blocks = torch.stack([_rotation_block(rotated * w * centre[:, axis]) for axis in range(2) for w in freqs], -3)
    return _blocks_to_matrix(blocks, head_dim, quarters=encoding.layout == "head_groups")


def _head_groups(encoding: Encoding) -> bool:
    """Whether the encoding uses the released URoPE module's head-group layout (quarter pairs)."""
    return getattr(encoding, "layout", "interleaved") == "head_groups"


def _left_out(encoding: Encoding, head: tuple[int, int] | None) -> bool:
    """Whether head h of ``head`` = (h, heads) is one of the last ``leaveout_heads`` (not rotated)."""
    return head is not None and head[0] >= head[1] - int(getattr(encoding, "leaveout_heads", 0))


def _worldrope_blocks(
    encoding: WorldRoPE,
    cams: dict[str, Any],
    grid: tuple[int, int],
    head_dim: int,
    view: int,
    params: dict[str, Tensor],
) -> Tensor:
    freqs = _image_rope_freqs(head_dim, encoding.rope_base)
    P = grid[0] * grid[1]
    if _left_out(encoding, cams["head"]):
        return _rotation_block(torch.zeros(cams["B"], cams["V"] * P, 2 * len(freqs), dtype=torch.float64))
    weights = (encoding.near_weight, 1.0 - encoding.near_weight)
    blocks = []
    for key_view in range(cams["V"]):
        rows = slice(key_view * P, (key_view + 1) * P)
        depth, split = params["depth"][:, rows].double(), params["depth_split"][:, rows].double()
        sigma = params["depth_sigma"][:, rows].double()
        sigma = torch.minimum(sigma.abs(), torch.full_like(sigma, MAX_DEPTH))  # |σ| within the depth bound
        uv = _uv_grid(grid, (0.5, 0.5))
        pix = torch.cat([uv, torch.ones_like(uv[:, :1])], -1)
        ray = (cams["K_inv"][:, key_view, None] @ pix[..., None]).squeeze(-1)  # (B, P, 3)
        R_qk = cams["E"][:, view, :3, :3] @ cams["C2W"][:, key_view, :3, :3]
        total: Tensor | float = 0.0  # a tensor from the first endpoint on
        for m, sign in enumerate((-1.0, 1.0)):
            z = _ray_point_depth(depth + sign * split / 2)
            world = _world_points(cams["K_inv"][:, key_view], cams["C2W"][:, key_view], uv, z)
            mean = _in_camera(cams["E"][:, view], world)
            cov = sigma[..., m, None, None] ** 2 * ray[..., :, None] * ray[..., None, :]
            if encoding.footprint:
                fx, fy = cams["K_key"][:, key_view, 0, 0, None], cams["K_key"][:, key_view, 1, 1, None]
                cov = cov + torch.diag_embed(
                    torch.stack(
                        [(z / (grid[1] * fx)) ** 2 / 12, (z / (grid[0] * fy)) ** 2 / 12, torch.zeros_like(z)], -1
                    )
                )
            cov_q = R_qk[:, None] @ cov @ R_qk[:, None].transpose(-1, -2)
            pos, J = _project(cams["K"][:, view], mean, grid)
            cov_img = J @ cov_q @ J.transpose(-1, -2)  # (B, P, 2, 2)
            per_pair = []
            for axis in range(2):
                for w in freqs:
                    omega = torch.zeros(2, dtype=torch.float64)
                    omega[axis] = w
                    damping = torch.exp(-0.5 * (omega @ cov_img @ omega))
                    per_pair.append(damping[..., None, None] * _rotation_block(omega @ pos[..., None]).squeeze(-3))
            total = total + weights[m] * torch.stack(per_pair, -3)
        blocks.append(cast(Tensor, total))
    return torch.cat(blocks, 1)


# RayRoPE's released arithmetic (docs/encodings_query_frame.md §2): direction eps 1e-6 on the
# homogeneous point, |z| as sqrt(z^2 + 1e-9) floored at 1e-4, w floored at 1e-4, no spread below 0.01.
_OFFICIAL_EPS = {"direction": 1e-6, "z_square": 1e-9, "floor": 1e-4, "flat": 1e-2}
_RAYROPE_DEPTH_PERIOD = {"depth": 80.0, "inverse": 80.0, "asinh": 8.0 * math.asinh(10.0)}
_RAYROPE_MAX_DISPARITY = 20.0


def _rayrope_end_depths(encoding: RayRoPE, mu: Tensor, s: Tensor, known: Tensor | None) -> list[Tensor]:
    """z-depths ``(B, P, 3 rays)`` of the two segment ends (μ - s first)."""
    ends = []
    for sign in (-1.0, 1.0):
        predicted = (
            (mu + sign * s).clamp(math.log(MIN_DEPTH), encoding.max_log_depth).exp()[..., None].expand(-1, -1, 3)
        )
        if known is None:
            ends.append(predicted)
            continue
        d = known.clamp(MIN_DEPTH, MAX_DEPTH)
        if encoding.depth == "known+halfwidth":
            d = (d.log() + sign * s[..., None]).clamp(math.log(MIN_DEPTH), math.log(MAX_DEPTH)).exp()
        ends.append(torch.where(known > 0, d, predicted))
    return ends


def _rayrope_depth_coordinate(encoding: RayRoPE, z: Tensor) -> Tensor:
    """The depth coordinate of a (signed, or already mirrored) query-frame z-depth."""
    m = encoding.max_depth_coordinate
    if encoding.depth_coordinate == "depth":
        return torch.minimum(torch.maximum(z, torch.full_like(z, -m)), torch.full_like(z, m))
    if encoding.depth_coordinate == "asinh":
        a = torch.asinh(z)
        return torch.minimum(torch.maximum(a, torch.full_like(a, -math.asinh(m))), torch.full_like(a, math.asinh(m)))
    return torch.minimum(1.0 / z.abs(), torch.full_like(z, _RAYROPE_MAX_DISPARITY))


def _rayrope_ray_coords(
    encoding: RayRoPE, cams: dict[str, Any], view: int, key_view: int, uv: Tensor, depth: Tensor
) -> tuple[Tensor, Tensor]:
    """Direction ``(B, P, 2)`` and depth coordinate ``(B, P)`` of the points at ``depth (B, P)`` on
    the rays through ``uv`` of key view ``key_view``, in query view ``view``."""
    if encoding.numerics == "exact":
        world = _world_points(cams["K_inv"][:, key_view], cams["C2W"][:, key_view], uv, depth)
        X = _in_camera(cams["E"][:, view], world)
        y = (cams["K"][:, view, None] @ X[..., None]).squeeze(-1)
        return y[..., :2] / y.norm(dim=-1, keepdim=True).clamp_min(1e-6), _rayrope_depth_coordinate(encoding, X[..., 2])
    # homogeneous point [K^-1 (u, v, 1), 1/d] in the key camera, to world, through lift(K_q) E_q
    eps = _OFFICIAL_EPS
    pix = torch.cat([uv, torch.ones_like(uv[:, :1])], -1)
    cam = (cams["K_inv"][:, key_view, None] @ pix[..., None]).squeeze(-1)  # (B, P, 3)
    hom = torch.cat([cam, 1.0 / depth[..., None]], -1)
    lift_K = torch.zeros(cams["B"], 4, 4, dtype=torch.float64)
    lift_K[:, :3, :3] = cams["K"][:, view]
    lift_K[:, 3, 3] = 1.0
    P_q = lift_K @ cams["E"][:, view] @ cams["C2W"][:, key_view]
    p = (P_q[:, None] @ hom[..., None]).squeeze(-1)
    direction = p[..., :2] / (p[..., :3].norm(dim=-1, keepdim=True) + eps["direction"])
    z = torch.sqrt(p[..., 2] ** 2 + eps["z_square"]).clamp_min(eps["floor"])
    w = p[..., 3].clamp_min(eps["floor"])
    if encoding.depth_coordinate == "inverse":
        return direction, (w / z).clamp(0.0, _RAYROPE_MAX_DISPARITY)
    return direction, _rayrope_depth_coordinate(encoding, z / w)


def _expected_rotation_block(encoding: RayRoPE, lo: Tensor, hi: Tensor) -> Tensor:
    """E[R(θ)] ``(..., 2, 2)`` for θ uniform on [lo, hi] (official numerics: R(lo) when |hi - lo| <= 0.01)."""
    delta = hi - lo
    official = encoding.numerics == "official"
    flat = delta.abs() <= _OFFICIAL_EPS["flat"] if official else delta.abs() < 1e-6
    safe = torch.where(flat, torch.ones_like(delta), delta)
    at = lo if official else (lo + hi) / 2
    e_cos = torch.where(flat, at.cos(), (hi.sin() - lo.sin()) / safe)
    e_sin = torch.where(flat, at.sin(), (lo.cos() - hi.cos()) / safe)
    return torch.stack([torch.stack([e_cos, -e_sin], -1), torch.stack([e_sin, e_cos], -1)], -2)


def _rayrope_blocks(
    encoding: RayRoPE, cams: dict[str, Any], grid: tuple[int, int], head_dim: int, view: int, params: dict[str, Tensor]
) -> Tensor:
    num_freqs = head_dim // 24
    P = grid[0] * grid[1]
    periods = [4.0] * 3 + [8.0] * 6 + [_RAYROPE_DEPTH_PERIOD[encoding.depth_coordinate]] * 3
    blocks = []
    for key_view in range(cams["V"]):
        rows = slice(key_view * P, (key_view + 1) * P)
        mu, s = params["log_depth"][:, rows].double(), params["log_depth_halfwidth"][:, rows].double()
        known = params["known_depth"][:, rows].double() if "known_depth" in params else None
        centre = _in_camera(cams["E"][:, view], cams["C2W"][:, key_view, None, :3, 3])  # (B, 1, 3)
        coords = []  # per end: (B, P, 12)
        for depth in _rayrope_end_depths(encoding, mu, s, known):
            per_ray = [
                _rayrope_ray_coords(encoding, cams, view, key_view, _uv_grid(grid, offset), depth[..., r])
                for r, offset in enumerate(RAY_OFFSETS)
            ]
            dirs = [direction for direction, _ in per_ray]
            coords.append(torch.cat([centre.expand(-1, P, -1), *dirs, torch.stack([z for _, z in per_ray], -1)], -1))
        per_pair = []
        for f in range(num_freqs):
            for c, period in enumerate(periods):
                w = 2 * math.pi / period * encoding.freq_base**f
                per_pair.append(_expected_rotation_block(encoding, w * coords[0][..., c], w * coords[1][..., c]))
        blocks.append(torch.stack(per_pair, -3))
    return torch.cat(blocks, 1)


_QUERY_FRAME_BLOCKS: dict[type[Encoding], Callable[..., Tensor]] = {
    URoPE: _urope_blocks,
    WorldRoPE: _worldrope_blocks,
    RayRoPE: _rayrope_blocks,
}


def _lift_uv_matrices(
    encoding: Encoding,
    cameras: Cameras,
    grid: tuple[int, int],
    head_dim: int,
    planes: Planes,
    head: tuple[int, int] | None = None,
) -> tuple[Tensor, Tensor]:
    """``hrope-lift-uv``'s key matrices ``(B, Vq, N, d, d)`` and query matrices ``(B, N, d, d)``.

    Geometric channels [0, g): hrope-lift's tiles (its reference D_t's top-left g x g block), D_j^-T
    for a key, D_i for a query. RoPE channels [g, d): the key's ray-plane point at z-depth
    1/(m·r̂) (MAX_DEPTH when m·r̂ <= 1/MAX_DEPTH; then the depth bound) taken to the world and into
    query view c, projected; R(w_f x), R(w_f y) on the split pairs of those r = d - g channels
    (head groups: on their quarter pairs, and the identity for a head left out).
    """
    D, layout = token_matrices(HRoPELift(), cameras, grid, head_dim, planes)
    g, r = layout.geo_dim, head_dim - layout.geo_dim
    geo_q = D[..., :g, :g]
    geo_k = torch.linalg.inv(geo_q).transpose(-1, -2)
    tok = _tokens(cameras, grid)
    m = _nearest_plane(_plane_vectors(planes, tok))
    w = (m * tok.ray).sum(-1)  # (B, N)
    depth = _ray_point_depth(torch.where(w > 1.0 / MAX_DEPTH, 1.0 / w, torch.full_like(w, MAX_DEPTH)))
    E = cameras.world_to_cam.double()
    K = _normalized_K(cameras.K, cameras.image_size)
    C2W = torch.linalg.inv(E)
    B, V, P = cameras.batch_size, cameras.num_views, grid[0] * grid[1]
    uv = _uv_grid(grid, (0.5, 0.5))
    freqs = _image_rope_freqs(r, encoding.rope_base)
    world = torch.cat(
        [_world_points(torch.linalg.inv(K[:, k]), C2W[:, k], uv, depth[:, k * P : (k + 1) * P]) for k in range(V)], 1
    )  # (B, N, 3)
    M_key = torch.zeros(B, V, V * P, head_dim, head_dim, dtype=torch.float64)
    for c in range(V):
        pos, _ = _project(K[:, c], _in_camera(E[:, c], world), grid)  # (B, N, 2)
        rotated = 0.0 if _left_out(encoding, head) else 1.0
        blocks = torch.stack(
            [_rotation_block(rotated * w_f * pos[..., axis]) for axis in range(2) for w_f in freqs], -3
        )
        M_key[:, c, :, :g, :g] = geo_k
        M_key[:, c, :, g:, g:] = _blocks_to_matrix(blocks, r, quarters=_head_groups(encoding))
    view_of = torch.arange(V * P) // P
    M_query = M_key[:, view_of, torch.arange(V * P)].clone()
    M_query[..., :g, :g] = geo_q
    return M_key, M_query


def query_frame_matrices(
    encoding: str | Encoding,
    cameras: Cameras,
    grid: tuple[int, int],
    head_dim: int,
    params: dict[str, Tensor] | None = None,
    key_cameras: Cameras | None = None,
    key_grid: tuple[int, int] | None = None,
    head: tuple[int, int] | None = None,
) -> Tensor:
    """Key matrices ``(B, Vq, Nk, d, d)`` of a query-frame encoding: token j's expected rotation in
    query view c's frame (2x2 blocks E[R(θ)] on the split pairs). Query token i uses entry
    ``[:, view(i), i]``. The keys are ``cameras``' own tokens, or (cross-attention) the
    ``key_grid`` tokens of ``key_cameras`` with ``params`` theirs. ``head`` = (h, heads): the
    matrices of head h of ``heads`` (``layout="head_groups"``, on quarter pairs)."""
    encoding = get_encoding(encoding)
    key_cameras = cameras if key_cameras is None else key_cameras
    E_key = key_cameras.world_to_cam.double()
    K_key = _normalized_K(key_cameras.K, key_cameras.image_size)
    cams: dict[str, Any] = {
        "B": cameras.batch_size,
        "V": key_cameras.num_views,
        "E": cameras.world_to_cam.double(),
        "K": _normalized_K(cameras.K, cameras.image_size),
        "K_key": K_key,
        "K_inv": torch.linalg.inv(K_key),
        "C2W": torch.linalg.inv(E_key),
        "head": head,
    }
    quarters = _head_groups(encoding)
    build = _for_class(_QUERY_FRAME_BLOCKS, encoding)
    key_grid = tuple(grid if key_grid is None else key_grid)  # type: ignore[assignment]
    return torch.stack(
        [
            _blocks_to_matrix(build(encoding, cams, key_grid, head_dim, view, params or {}), head_dim, quarters)
            for view in range(cameras.num_views)
        ],
        1,
    )


def _rotates_values(encoding: Encoding) -> bool:
    return bool(getattr(encoding, "rotate_values", True))


def query_frame_cross_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    encoding: str | Encoding,
    query_cameras: Cameras,
    key_cameras: Cameras,
    grid: tuple[int, int],
    key_grid: tuple[int, int] | None = None,
    query_params: dict[str, Tensor] | None = None,
    key_params: dict[str, Tensor] | None = None,
    attn_mask: Tensor | None = None,
    scale: float | None = None,
) -> Tensor:
    """Dense reference of a query-frame cross-attention: query i (view c of ``query_cameras``) with
    its own matrix M_i (its own frame, ``query_params``), key j of ``key_cameras`` with M_j^(c)
    (``key_params``):

        a_ij = softmax_j((M_i^T q_i)·(M_j^(c)T k_j) * scale),   o_i = M_i Σ_j a_ij M_j^(c)T v_j

    (without the M on v and o when the encoding does not rotate values). q ``(B, heads, Nq, d)``,
    k, v ``(B, heads, Nk, d)``; returns float64 ``(B, heads, Nq, d)``; ``attn_mask`` ``(..., Nq, Nk)``.
    """
    encoding = get_encoding(encoding)
    q, k, v = q.double(), k.double(), v.double()
    d = q.shape[-1]
    M_k = query_frame_matrices(encoding, query_cameras, grid, d, key_params, key_cameras, key_grid)  # (B, Vq, Nk, d, d)
    M_own = query_frame_matrices(encoding, query_cameras, grid, d, query_params)  # (B, Vq, Nq, d, d)
    Vq, Nq = M_own.shape[1:3]
    view_of = torch.arange(Nq) // (Nq // Vq)
    M_q = M_own[:, view_of, torch.arange(Nq)]  # (B, Nq, d, d)
    M_kq = M_k[:, view_of]  # (B, Nq, Nk, d, d)
    q_t = (M_q.transpose(-1, -2)[:, None] @ q[..., None]).squeeze(-1)
    k_t = (M_kq.transpose(-1, -2)[:, None] @ k[:, :, None, :, :, None]).squeeze(-1)  # (B, H, Nq, Nk, d)
    values = _rotates_values(encoding)
    v_t = (M_kq.transpose(-1, -2)[:, None] @ v[:, :, None, :, :, None]).squeeze(-1) if values else v[:, :, None]
    logits = (q_t[:, :, :, None, :] * k_t).sum(-1) * (scale if scale is not None else 1.0 / math.sqrt(d))
    out = (_softmax(logits, attn_mask)[..., None] * v_t).sum(-2)
    return (M_q[:, None] @ out[..., None]).squeeze(-1) if values else out


def query_frame_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    encoding: str | Encoding,
    cameras: Cameras,
    grid: tuple[int, int],
    params: dict[str, Tensor] | None = None,
    planes: Planes | None = None,
    camera_tokens: CameraTokens | None = None,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    head: tuple[int, int] | None = None,
) -> Tensor:
    """Dense reference of a query-frame encoding: with M_j^(c) from :func:`query_frame_matrices`,

        a_ij = softmax_j((M_i^T q_i)·(M_j^(c)T k_j) * scale),   o_i = M_i Σ_j a_ij M_j^(c)T v_j,

    c the view of query i and M_i = M_i^(c) (the transpose, not the inverse, on the key side);
    without the M on v and o when the encoding does not rotate values (``rotate_values=False``).
    q, k, v ``(B, heads, N, head_dim)``; returns float64 ``(B, heads, N, head_dim)``. SDPA's
    options as in :func:`multiview_attention` (``is_causal`` is causal over the whole sequence).

    With ``camera_tokens`` q, k, v have L tokens and identity tokens get M = I on both sides, except
    that an identity query sees camera key j through M_j^(view(j)), the key in its own view's frame.
    ``hrope-lift-uv`` (needs ``planes``) has query matrices of their own (:func:`_lift_uv_matrices`),
    and so has ``urope`` with ``projection="released"`` (its own patch centre). ``urope`` with
    ``layout="head_groups"`` (``urope``, ``worldrope``, ``hrope-lift-uv``) runs head by head (``head`` =
    (h, heads): q, k, v hold head h alone).
    """
    k, v, attn_mask = _sdpa_options(q, k, v, attn_mask, dropout_p, is_causal, enable_gqa)
    q, k, v = q.double(), k.double(), v.double()
    B, H, L, d = q.shape
    encoding = get_encoding(encoding)
    if _head_groups(encoding) and head is None:
        masks = [
            attn_mask
            if attn_mask is None or attn_mask.ndim < 3 or attn_mask.shape[-3] == 1
            else attn_mask[..., [h], :, :]
            for h in range(H)
        ]
        options: dict[str, Any] = {
            "encoding": encoding,
            "cameras": cameras,
            "grid": grid,
            "params": params,
            "planes": planes,
            "camera_tokens": camera_tokens,
            "scale": scale,
        }
        return torch.cat(
            [
                query_frame_attention(q[:, [h]], k[:, [h]], v[:, [h]], attn_mask=masks[h], head=(h, H), **options)
                for h in range(H)
            ],
            1,
        )
    own_query: Tensor | None = None  # the queries' matrices when they are not the keys' own (hrope-lift-uv)
    if isinstance(encoding, HRoPELiftUV):
        encoding.check_inputs(planes, params or {})
        M, own_query = _lift_uv_matrices(encoding, cameras, grid, d, cast("Planes", planes), head)
    else:
        M = query_frame_matrices(encoding, cameras, grid, d, params, head=head)  # (B, V, N, d, d)
        if isinstance(encoding, URoPE) and encoding.projection == "released":
            own_query = _urope_query_matrices(encoding, grid, cameras.num_views, d, head).expand(B, -1, -1, -1)
    V, N = M.shape[1:3]
    view_of = torch.arange(N) // (N // V)
    own = M[:, view_of, torch.arange(N)]  # (B, N, d, d): every camera token in its own view's frame
    cam = torch.arange(N) if camera_tokens is None else camera_token_positions(camera_tokens, L)
    taken = set(cam.tolist())
    identity = torch.tensor([p for p in range(L) if p not in taken], dtype=torch.long)
    eye = torch.eye(d, dtype=torch.float64)
    M_q = eye.repeat(B, L, 1, 1)
    M_q[:, cam] = own if own_query is None else own_query
    q_t = (M_q.transpose(-1, -2)[:, None] @ q[..., None]).squeeze(-1)
    M_k = eye.repeat(B, L, L, 1, 1)  # (B, L queries, L keys, d, d): key matrices in each query's frame
    M_k[:, cam[:, None], cam[None, :]] = M[:, view_of]
    M_k[:, identity[:, None], cam[None, :]] = own[:, None]
    k_t = (M_k.transpose(-1, -2)[:, None] @ k[:, :, None, :, :, None]).squeeze(-1)  # (B, H, Lq, Lk, d)
    values = _rotates_values(get_encoding(encoding))
    v_t = (M_k.transpose(-1, -2)[:, None] @ v[:, :, None, :, :, None]).squeeze(-1) if values else v[:, :, None]
    logits = (q_t[:, :, :, None, :] * k_t).sum(-1) * (scale if scale is not None else 1.0 / math.sqrt(d))
    out = (_softmax(logits, attn_mask)[..., None] * v_t).sum(-2)
    return (M_q[:, None] @ out[..., None]).squeeze(-1) if values else out
