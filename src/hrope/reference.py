"""Dense float64 references of the encodings (tests only; never used by the fast path).

For each token the full ``head_dim x head_dim`` matrix D_t is built from the formulas of
DESIGN.md §3–4 (no closed-form inverses; the only clamps are the documented input clamps that the
fast path applies too, see :func:`multiview_attention`), then attention is computed explicitly:

    a_ij = softmax_j((D_i^T q_i)·(D_j^-1 k_j) * scale),   o_i = D_i Σ_j a_ij D_j^-1 v_j.

This costs O(N d^2) memory and O(N^2) time: use it on small inputs.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .cameras import Cameras
from .encodings import Encoding, EncodingError, HeadLayout, get_encoding, rope_angles, tangent_frames
from .encodings.query_frame import MIN_DEPTH, POSITION_MARGIN
from .encodings.rayrope import COORDINATE_PERIODS, RAY_OFFSETS
from .geometry import lift, normalize_intrinsics
from .planes import Planes

__all__ = ["multiview_attention", "token_matrices", "dense_attention", "query_frame_matrices",
           "query_frame_attention"]


def _rope_matrix(layout: HeadLayout, grid, num_views: int, base: float) -> Tensor:
    """``(N, d, d)`` with 2x2 rotations R(θ) on the split pairs (f, f + F) of the RoPE channels."""
    d, F_ = layout.head_dim, layout.num_freqs
    angles = rope_angles(grid, F_, base=base).repeat(num_views, 1, 1)  # (N, 2, F)
    D = torch.eye(d, dtype=torch.float64).repeat(angles.shape[0], 1, 1)
    for axis in range(2):
        for f in range(F_):
            a = layout.geo_dim + axis * 2 * F_ + f
            b = a + F_
            c, s = angles[:, axis, f].cos(), angles[:, axis, f].sin()
            D[:, a, a], D[:, a, b], D[:, b, a], D[:, b, b] = c, -s, s, c
    return D


def _tile(blocks: Tensor, layout: HeadLayout, D: Tensor) -> Tensor:
    """Write per-token ``blocks (B, N, b, b)`` on the geometric diagonal of ``D (B, N, d, d)``."""
    b = layout.block
    for i in range(layout.num_blocks):
        D[..., i * b : (i + 1) * b, i * b : (i + 1) * b] = blocks
    return D


def _per_token(x: Tensor, grid) -> Tensor:
    """Per-view ``(B, V, ...)`` -> per-token ``(B, N, ...)``."""
    return x.repeat_interleave(grid[0] * grid[1], dim=1)


def _geometric_blocks(encoding: Encoding, cameras: Cameras, grid, planes, params) -> Tensor | None:
    """The geometric block of every token, ``(B, N, b, b)``, straight from the definitions."""
    name = encoding.name
    K = _per_token(normalize_intrinsics(cameras.K, cameras.image_size), grid)
    E = _per_token(cameras.world_to_cam, grid)
    if name in ("none", "rope2d"):
        return None
    if name in ("prope",):
        return lift(K) @ E
    if name in ("gta", "cape"):
        if getattr(encoding, "translation_scale", None) is not None:
            E = E.clone()
            E[..., :3, 3] = E[..., :3, 3] * encoding.translation_scale.double()
        return E
    if name == "hrope":
        # the documented plane clamps (docs/encodings.md), taken from the encoding itself: they
        # are input preprocessing, not part of the Eq. 5 matrix this reference rebuilds
        m = encoding.clamp_planes(planes.m(cameras, grid, torch.float64), E[..., :3, 3])
        n_w, kappa = Planes.from_m(m).world_normal_and_kappa(cameras, grid)
        R, t = E[..., :3, :3], E[..., :3, 3]
        H = K @ (R + kappa[..., None, None] * t[..., :, None] * n_w[..., None, :])
        H = H / torch.linalg.det(H).abs().pow(1.0 / 3.0)[..., None, None]
        return lift(H) if encoding.lift4 else H
    if name == "hrope-lift":
        lam = lift(K)
        lam[..., 3, :3] = -planes.m(cameras, grid, torch.float64)
        return lam @ E
    G = _patch_transform(name, cameras, grid, planes, params, K)
    return lift(K) @ G @ E


def _patch_transform(name: str, cameras, grid, planes, params, K) -> Tensor:
    """G_u of the ablations, ``(B, N, 4, 4)``."""
    B, N = cameras.batch_size, cameras.num_views * grid[0] * grid[1]
    G = torch.eye(4, dtype=torch.float64).repeat(B, N, 1, 1)
    uv = torch.stack(_patch_uv(grid), -1).repeat(cameras.num_views, 1).expand(B, -1, -1)
    if name in ("hrope-depth", "hrope-pf"):
        if name == "hrope-depth":
            z = params["depth"].double()
        else:
            normal, z = planes.normal_and_depth(cameras, grid, torch.float64)
        pix = torch.cat([uv, torch.ones_like(uv[..., :1])], -1)
        ray = torch.linalg.solve(K, pix[..., None]).squeeze(-1)
        p = z[..., None] * ray
        if name == "hrope-depth":
            G[..., :3, 3] = -p
        else:
            frame = tangent_frames(normal)
            G[..., :3, :3] = frame.transpose(-1, -2)
            G[..., :3, 3] = -(frame.transpose(-1, -2) @ p[..., None]).squeeze(-1)
        return G
    if name == "hrope-so3":
        G[..., :3, :3] = params["rotation"].double()
        return G
    if name in ("hrope-se3", "hrope-full"):
        return params["transform"].double()
    raise KeyError(f"no reference for encoding {name!r}")


def _patch_uv(grid):
    """Patch-centre normalised coordinates (u, v) of one view, each ``(P,)``."""
    gh, gw = grid
    v, u = torch.meshgrid((torch.arange(gh, dtype=torch.float64) + 0.5) / gh - 0.5,
                          (torch.arange(gw, dtype=torch.float64) + 0.5) / gw - 0.5, indexing="ij")
    return u.reshape(-1), v.reshape(-1)


def token_matrices(encoding: str | Encoding, cameras: Cameras, grid, head_dim: int,
                   planes=None, params: dict | None = None) -> tuple[Tensor, HeadLayout]:
    """Every token's full transform D_t ``(B, N, head_dim, head_dim)`` in float64, and its layout.

    Relative encodings only (for query-frame encodings the key transform depends on the query).
    """
    encoding = get_encoding(encoding)
    cameras = cameras.to(dtype=torch.float64)
    probe = encoding.prepare(cameras, tuple(grid), head_dim, planes=planes, **(params or {}))
    layout = probe.layout
    B, N = cameras.batch_size, cameras.num_views * grid[0] * grid[1]
    if layout.rope:
        D = _rope_matrix(layout, grid, cameras.num_views, encoding.rope_base).repeat(B, 1, 1, 1)
    else:
        D = torch.eye(head_dim, dtype=torch.float64).repeat(B, N, 1, 1)
    blocks = _geometric_blocks(encoding, cameras, tuple(grid), planes, params or {})
    if blocks is not None:
        D = _tile(blocks, layout, D)
    return D, layout


def _sdpa_options(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None, dropout_p: float,
                  is_causal: bool, enable_gqa: bool) -> tuple[Tensor, Tensor, Tensor | None]:
    """SDPA's keyword options for the dense references: k and v with their heads repeated
    (``enable_gqa``) and the mask to apply (``is_causal`` -> the lower-triangular boolean mask)."""
    if dropout_p != 0.0:
        raise ValueError(f"dropout_p must be 0.0 for the dense reference, got {dropout_p}: "
                         "a deterministic reference cannot reproduce random dropout")
    if is_causal:
        if attn_mask is not None:
            raise EncodingError("pass either attn_mask or is_causal, not both")
        attn_mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
    if enable_gqa and k.shape[1] != q.shape[1]:
        if q.shape[1] % k.shape[1]:
            raise EncodingError(f"enable_gqa: {q.shape[1]} query heads are not a multiple of "
                                f"{k.shape[1]} key/value heads")
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


def dense_attention(q: Tensor, k: Tensor, v: Tensor, D_q: Tensor, D_k: Tensor, *,
                    transform_values: bool = True, attn_mask: Tensor | None = None, dropout_p: float = 0.0,
                    is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False) -> Tensor:
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


def multiview_attention(q: Tensor, k: Tensor, v: Tensor, *, encoding: str | Encoding, cameras: Cameras,
                        grid, planes=None, params: dict | None = None, attn_mask: Tensor | None = None,
                        dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
                        enable_gqa: bool = False) -> Tensor:
    """Dense float64 reference of :func:`hrope.multiview_attention`: same arguments and output.

    q, k, v ``(B, heads, N, head_dim)``; returns float64 ``(B, heads, N, head_dim)`` computed on the
    CPU from every token's full ``head_dim x head_dim`` matrix. SDPA's options: ``attn_mask``
    (boolean, True = attend, or additive), ``is_causal`` (lower-triangular over all N tokens; not
    with ``attn_mask``), ``scale``, ``enable_gqa``, and ``dropout_p`` only as 0.0 (ValueError
    otherwise: a deterministic reference cannot reproduce dropout). The fast path's documented input
    clamps are included (``hrope``'s plane clamps via the encoding's own ``clamp_planes``: they
    preprocess the input, the Eq. 5 matrix is rebuilt here independently), so float64 fast-path
    outputs equal this to about 1e-9.
    """
    encoding = get_encoding(encoding)
    sdpa = {"attn_mask": attn_mask, "dropout_p": dropout_p, "is_causal": is_causal, "scale": scale,
            "enable_gqa": enable_gqa}
    if encoding.query_frame:
        return query_frame_attention(q, k, v, encoding=encoding, cameras=cameras, grid=grid, params=params, **sdpa)
    D, _ = token_matrices(encoding, cameras, grid, q.shape[-1], planes, params)
    transform_values = encoding.name != "cape"
    return dense_attention(q, k, v, D, D, transform_values=transform_values, **sdpa)


# ----------------------------------------------------------------------------- query-frame encodings
# Independent float64 construction of rayrope / urope / worldrope (docs/encodings_query_frame.md):
# world points through explicit matrix inverses, explicit 2x2 expected-rotation blocks, one
# head_dim x head_dim matrix per (query view, key token), explicit softmax over all N keys.

def _uv_grid(grid, offset) -> Tensor:
    """Normalised image coordinates ``(P, 2)`` of ``(ix + ox, iy + oy)``, x fastest."""
    gh, gw = grid
    iy, ix = torch.meshgrid(torch.arange(gh, dtype=torch.float64), torch.arange(gw, dtype=torch.float64),
                            indexing="ij")
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


def _project(K: Tensor, X: Tensor, grid) -> tuple[Tensor, Tensor]:
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


def _blocks_to_matrix(blocks: Tensor, head_dim: int) -> Tensor:
    """Pair blocks ``(..., n, 2, 2)`` on channels (p, p + head_dim/2) -> ``(..., d, d)`` (identity after n)."""
    half = head_dim // 2
    M = torch.eye(head_dim, dtype=torch.float64).expand(*blocks.shape[:-3], head_dim, head_dim).clone()
    for p in range(blocks.shape[-3]):
        idx = [p, p + half]
        for r in range(2):
            for c in range(2):
                M[..., idx[r], idx[c]] = blocks[..., p, r, c]
    return M


def _urope_blocks(encoding, cams, grid, head_dim, view, params) -> Tensor:
    freqs = _image_rope_freqs(head_dim, encoding.rope_base)
    blocks = []
    uv = _uv_grid(grid, (0.5, 0.5))
    for key_view in range(cams["V"]):
        pos = []
        for anchor in encoding.anchors:
            depth = torch.full((cams["B"], grid[0] * grid[1]), anchor, dtype=torch.float64)
            world = _world_points(cams["K_inv"][:, key_view], cams["C2W"][:, key_view], uv, depth)
            pos.append(_project(cams["K"][:, view], _in_camera(cams["E"][:, view], world), grid)[0])
        pos = torch.stack(pos, -2)  # (B, P, A, 2)
        per_pair = []
        for axis in range(2):
            for f, w in enumerate(freqs):
                per_pair.append(_rotation_block(w * pos[:, :, f % len(encoding.anchors), axis]))
        blocks.append(torch.stack(per_pair, -3))
    return torch.cat(blocks, 1)


def _worldrope_blocks(encoding, cams, grid, head_dim, view, params) -> Tensor:
    freqs = _image_rope_freqs(head_dim, encoding.rope_base)
    P = grid[0] * grid[1]
    weights = (encoding.near_weight, 1.0 - encoding.near_weight)
    blocks = []
    for key_view in range(cams["V"]):
        rows = slice(key_view * P, (key_view + 1) * P)
        depth, split = params["depth"][:, rows].double(), params["depth_split"][:, rows].double()
        sigma = params["depth_sigma"][:, rows].double()
        uv = _uv_grid(grid, (0.5, 0.5))
        pix = torch.cat([uv, torch.ones_like(uv[:, :1])], -1)
        ray = (cams["K_inv"][:, key_view, None] @ pix[..., None]).squeeze(-1)  # (B, P, 3)
        R_qk = cams["E"][:, view, :3, :3] @ cams["C2W"][:, key_view, :3, :3]
        total = 0.0
        for m, sign in enumerate((-1.0, 1.0)):
            z = (depth + sign * split / 2).clamp_min(MIN_DEPTH)
            world = _world_points(cams["K_inv"][:, key_view], cams["C2W"][:, key_view], uv, z)
            mean = _in_camera(cams["E"][:, view], world)
            cov = sigma[..., m, None, None] ** 2 * ray[..., :, None] * ray[..., None, :]
            if encoding.footprint:
                fx, fy = cams["K"][:, key_view, 0, 0, None], cams["K"][:, key_view, 1, 1, None]
                cov = cov + torch.diag_embed(torch.stack(
                    [(z / (grid[1] * fx)) ** 2 / 12, (z / (grid[0] * fy)) ** 2 / 12, torch.zeros_like(z)], -1))
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
        blocks.append(total)
    return torch.cat(blocks, 1)


def _rayrope_blocks(encoding, cams, grid, head_dim, view, params) -> Tensor:
    num_freqs = head_dim // 24
    P = grid[0] * grid[1]
    blocks = []
    for key_view in range(cams["V"]):
        rows = slice(key_view * P, (key_view + 1) * P)
        mu, s = params["log_depth"][:, rows].double(), params["log_depth_halfwidth"][:, rows].double()
        centre = _in_camera(cams["E"][:, view], cams["C2W"][:, key_view, None, :3, 3])  # (B, 1, 3)
        coords = []  # per endpoint: (B, P, 12)
        for log_d in (mu - s, mu + s):
            depth = log_d.clamp(math.log(MIN_DEPTH), encoding.max_log_depth).exp()
            dirs, depths = [], []
            for offset in RAY_OFFSETS:
                uv = _uv_grid(grid, offset)
                world = _world_points(cams["K_inv"][:, key_view], cams["C2W"][:, key_view], uv, depth)
                X = _in_camera(cams["E"][:, view], world)
                y = (cams["K"][:, view, None] @ X[..., None]).squeeze(-1)
                dirs.append(y[..., :2] / y.norm(dim=-1, keepdim=True).clamp_min(1e-6))
                depths.append(X[..., 2].clamp(-encoding.max_depth_coordinate, encoding.max_depth_coordinate))
            coords.append(torch.cat([centre.expand(-1, P, -1)] + dirs + [torch.stack(depths, -1)], -1))
        per_pair = []
        for f in range(num_freqs):
            for c, period in enumerate(COORDINATE_PERIODS):
                w = 2 * math.pi / period * encoding.freq_base**f
                lo, hi = w * coords[0][..., c], w * coords[1][..., c]
                delta = hi - lo
                small = delta.abs() < 1e-6
                safe = torch.where(small, torch.ones_like(delta), delta)
                mid = (lo + hi) / 2
                e_cos = torch.where(small, mid.cos(), (hi.sin() - lo.sin()) / safe)
                e_sin = torch.where(small, mid.sin(), (lo.cos() - hi.cos()) / safe)
                per_pair.append(torch.stack([torch.stack([e_cos, -e_sin], -1), torch.stack([e_sin, e_cos], -1)], -2))
        blocks.append(torch.stack(per_pair, -3))
    return torch.cat(blocks, 1)


_QUERY_FRAME_BLOCKS = {"urope": _urope_blocks, "worldrope": _worldrope_blocks, "rayrope": _rayrope_blocks}


def query_frame_matrices(encoding: str | Encoding, cameras: Cameras, grid, head_dim: int,
                         params: dict | None = None) -> Tensor:
    """Key matrices ``(B, Vq, N, d, d)`` of a query-frame encoding: token j's expected rotation in
    query view c's frame (2x2 blocks E[R(θ)] on the split pairs). Query token i uses entry
    ``[:, view(i), i]``."""
    encoding = get_encoding(encoding)
    cameras = cameras.to(dtype=torch.float64)
    E = cameras.world_to_cam
    K = normalize_intrinsics(cameras.K, cameras.image_size)
    cams = {"B": cameras.batch_size, "V": cameras.num_views, "E": E, "K": K,
            "K_inv": torch.linalg.inv(K), "C2W": torch.linalg.inv(E)}
    build = _QUERY_FRAME_BLOCKS[encoding.name]
    return torch.stack([_blocks_to_matrix(build(encoding, cams, tuple(grid), head_dim, view, params or {}), head_dim)
                        for view in range(cameras.num_views)], 1)


def query_frame_attention(q: Tensor, k: Tensor, v: Tensor, *, encoding: str | Encoding, cameras: Cameras,
                          grid, params: dict | None = None, attn_mask: Tensor | None = None,
                          dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
                          enable_gqa: bool = False) -> Tensor:
    """Dense reference of a query-frame encoding: with M_j^(c) from :func:`query_frame_matrices`,

        a_ij = softmax_j((M_i^T q_i)·(M_j^(c)T k_j) * scale),   o_i = M_i Σ_j a_ij M_j^(c)T v_j,

    c the view of query i and M_i = M_i^(c) (the transpose, not the inverse, on the key side).
    q, k, v ``(B, heads, N, head_dim)``; returns float64 ``(B, heads, N, head_dim)``. SDPA's
    options as in :func:`multiview_attention` (``is_causal`` is causal over the whole sequence).
    """
    k, v, attn_mask = _sdpa_options(q, k, v, attn_mask, dropout_p, is_causal, enable_gqa)
    q, k, v = q.double(), k.double(), v.double()
    B, H, N, d = q.shape
    M = query_frame_matrices(encoding, cameras, grid, d, params)  # (B, V, N, d, d)
    V = M.shape[1]
    P = N // V
    view_of = torch.arange(N) // P
    M_q = M[:, view_of, torch.arange(N)]  # (B, N, d, d)
    q_t = (M_q.transpose(-1, -2)[:, None] @ q[..., None]).squeeze(-1)
    M_k = M[:, view_of]  # (B, N queries, N keys, d, d): key matrices in each query's frame
    k_t = (M_k.transpose(-1, -2)[:, None] @ k[:, :, None, :, :, None]).squeeze(-1)  # (B, H, Nq, Nk, d)
    v_t = (M_k.transpose(-1, -2)[:, None] @ v[:, :, None, :, :, None]).squeeze(-1)
    logits = (q_t[:, :, :, None, :] * k_t).sum(-1) * (scale if scale is not None else 1.0 / math.sqrt(d))
    out = (_softmax(logits, attn_mask)[..., None] * v_t).sum(-2)
    return (M_q[:, None] @ out[..., None]).squeeze(-1)
