"""The dense reference (`hrope.reference`): its own geometry checked from first principles (RoPE
rotations, tangent frames, plane homographies, the ablations' block formulas), its independence
from the fast path's helpers, and the fast path on its edges (the documented `hrope` plane clamps,
SDPA's keyword options is_causal, dropout_p, enable_gqa)."""

from __future__ import annotations

import math

import pytest
import torch

import hrope
import hrope.reference
from helpers import encoding_inputs, random_cameras, random_planes, random_qkv
from hrope.encodings import PRoPE
from hrope.encodings.homography import HRoPE
from hrope.reference import token_matrices

GRID = (2, 2)
P = GRID[0] * GRID[1]


def fast_and_reference(encoding, q, k, v, cameras, planes=None, **kw):
    fast = hrope.multiview_attention(q, k, v, encoding=encoding, cameras=cameras, grid=GRID, planes=planes, **kw)
    ref = hrope.reference.multiview_attention(
        q, k, v, encoding=encoding, cameras=cameras, grid=GRID, planes=planes, **kw
    )
    return fast, ref


def planes_with_view1(cameras, m_view1):
    """Random ordinary planes for view 0; view 1's P tokens get ``m_view1(t) (B, P, 3)`` from its t."""
    m = random_planes(1, 2 * P, seed=7).m(cameras, GRID).clone()
    t = cameras.t[:, 1:2].expand(-1, P, -1)
    m[:, P:] = m_view1(t)
    return hrope.Planes.from_m(m)


def through_world_origin(offset):
    """Planes with s = 1 - m·t = ``offset`` (0: the plane contains the world origin)."""
    return lambda t: (1.0 - offset) * t / (t * t).sum(-1, keepdim=True)


def very_close(t):
    """|m| = 1e3 (a plane 1e-3 units away), orthogonal to t so that s = 1 - m·t = 1."""
    direction = torch.linalg.cross(t, torch.tensor([0.3, -0.5, 1.0], dtype=t.dtype).expand_as(t))
    return 1e3 * direction / direction.norm(dim=-1, keepdim=True)


CLAMPED = {
    "origin-exact": through_world_origin(0.0),
    "origin-near": through_world_origin(0.01),
    "origin-near-negative": through_world_origin(-0.02),
    "huge-m": very_close,
}
ENCODINGS = {
    "hrope": lambda: HRoPE(gauge="world"),
    "hrope-lift4": lambda: HRoPE(lift4=True, gauge="world"),
    "hrope-custom-bounds": lambda: HRoPE(min_world_offset_ratio=0.2, max_inverse_distance=10.0, gauge="world"),
}


@pytest.mark.parametrize("encoding", ENCODINGS.values(), ids=ENCODINGS.keys())
@pytest.mark.parametrize("m_view1", CLAMPED.values(), ids=CLAMPED.keys())
def test_reference_applies_the_documented_hrope_plane_clamps(encoding, m_view1):
    cameras = random_cameras(B=1, V=2, seed=11)
    planes = planes_with_view1(cameras, m_view1)
    q, k, v = random_qkv(1, 2, 2 * P, 36, seed=11)
    fast, ref = fast_and_reference(encoding(), q, k, v, cameras, planes)
    assert ref.dtype == torch.float64 and torch.isfinite(ref).all()
    torch.testing.assert_close(fast, ref, rtol=1e-9, atol=1e-9)


def test_clamp_cases_really_are_clamped():
    """Each plane set above is out of the documented bounds, so the clamps change it."""
    cameras = random_cameras(B=1, V=2, seed=11)
    enc = HRoPE()
    t = cameras.t.repeat_interleave(P, dim=1)
    for m_view1 in CLAMPED.values():
        m = planes_with_view1(cameras, m_view1).m(cameras, GRID)
        assert (enc.clamp_planes(m, t)[:, P:] - m[:, P:]).abs().max() > 1e-3


def test_fast_path_clamps_s_to_the_exact_bound():
    cameras = random_cameras(B=1, V=2, seed=11)
    t = cameras.t.repeat_interleave(P, dim=1)
    m = through_world_origin(0.01)(t)
    s = 1.0 - (HRoPE().clamp_planes(m, t) * t).sum(-1)
    torch.testing.assert_close(s, torch.full_like(s, 0.05), rtol=0, atol=1e-13)  # measured <= 1.8e-16


# ------------------------------------------------------------------------------------ SDPA options
@pytest.mark.parametrize("name", ["prope", "hrope", "urope"])
def test_is_causal_matches_fast_path_and_explicit_tril_mask(name):
    cameras = random_cameras(B=1, V=2, seed=3)
    planes = random_planes(1, 2 * P, seed=3) if name == "hrope" else None
    q, k, v = random_qkv(1, 2, 2 * P, 24, seed=3)
    fast, ref = fast_and_reference(name, q, k, v, cameras, planes, is_causal=True)
    torch.testing.assert_close(fast, ref, rtol=1e-9, atol=1e-9)
    tril = torch.ones(2 * P, 2 * P, dtype=torch.bool).tril()
    explicit = hrope.reference.multiview_attention(
        q, k, v, encoding=name, cameras=cameras, grid=GRID, planes=planes, attn_mask=tril
    )
    torch.testing.assert_close(ref, explicit, rtol=0, atol=0)
    unmasked = hrope.reference.multiview_attention(q, k, v, encoding=name, cameras=cameras, grid=GRID, planes=planes)
    assert not torch.allclose(ref, unmasked)


@pytest.mark.parametrize("name", ["prope", "urope"])
def test_dropout_must_be_zero(name):
    cameras = random_cameras(B=1, V=2, seed=4)
    q, k, v = random_qkv(1, 1, 2 * P, 24, seed=4)
    kwargs = {"encoding": name, "cameras": cameras, "grid": GRID}
    with pytest.raises(ValueError, match="dropout_p must be 0.0.*cannot reproduce random dropout"):
        hrope.reference.multiview_attention(q, k, v, dropout_p=0.1, **kwargs)


@pytest.mark.parametrize("name", ["prope", "urope"])
def test_is_causal_with_attn_mask_is_an_error(name):
    cameras = random_cameras(B=1, V=2, seed=5)
    q, k, v = random_qkv(1, 1, 2 * P, 24, seed=5)
    mask = torch.ones(2 * P, 2 * P, dtype=torch.bool)
    with pytest.raises(ValueError, match="either attn_mask or is_causal"):
        hrope.reference.multiview_attention(
            q, k, v, encoding=name, cameras=cameras, grid=GRID, attn_mask=mask, is_causal=True
        )


@pytest.mark.parametrize("name", ["prope", "urope"])
def test_enable_gqa_repeats_key_value_heads(name):
    cameras = random_cameras(B=1, V=2, seed=6)
    q, k, v = random_qkv(1, 4, 2 * P, 24, seed=6)
    k, v = k[:, :2], v[:, :2]
    kwargs = {"encoding": name, "cameras": cameras, "grid": GRID}
    grouped = hrope.reference.multiview_attention(q, k, v, enable_gqa=True, **kwargs)
    repeated = hrope.reference.multiview_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), **kwargs)
    torch.testing.assert_close(grouped, repeated, rtol=0, atol=0)
    # the fast path with grouped heads (transforms act per token, the same on every head)
    fast = hrope.multiview_attention(q, k, v, enable_gqa=True, **kwargs)
    torch.testing.assert_close(fast, grouped, rtol=1e-9, atol=1e-9)
    with pytest.raises(hrope.EncodingError, match="share one shape"):
        hrope.multiview_attention(q, k, v, **kwargs)  # fewer k/v heads need enable_gqa=True
    with pytest.raises(hrope.EncodingError, match="share one shape"):
        hrope.multiview_attention(q[:, :3], k, v, enable_gqa=True, **kwargs)  # 3 is not a multiple of 2
    # equal head counts: a no-op
    q, k, v = random_qkv(1, 2, 2 * P, 24, seed=6)
    fast, ref = fast_and_reference(name, q, k, v, cameras, enable_gqa=True)
    torch.testing.assert_close(fast, ref, rtol=1e-9, atol=1e-9)


def test_reference_returns_float64_for_float32_inputs():
    cameras = random_cameras(B=1, V=2, seed=8, dtype=torch.float32)
    q, k, v = random_qkv(1, 2, 2 * P, 24, seed=8, dtype=torch.float32)
    planes = random_planes(1, 2 * P, seed=8, dtype=torch.float32)
    fast, ref = fast_and_reference("hrope", q, k, v, cameras, planes)
    assert fast.dtype == torch.float32 and ref.dtype == torch.float64
    assert (fast.double() - ref).abs().max() <= 2e-4 * ref.abs().max()


def test_fast_path_rejects_causal_with_mask_like_the_reference():
    cameras = random_cameras(B=1, V=2, image_size=(16, 16), seed=3)
    q, k, v = random_qkv(1, 2, 2 * 4, 16, seed=3)
    mask = torch.ones(8, 8, dtype=torch.bool)
    for encoding in ("prope", "urope"):
        with pytest.raises(hrope.EncodingError, match="not both"):
            hrope.multiview_attention(
                q, k, v, encoding=encoding, cameras=cameras, grid=(2, 2), attn_mask=mask, is_causal=True
            )


# ------------------------------------------------------------------ the reference's own geometry
def normalized_K(cameras):
    """K̂ = [[fx/W, 0, cx/W - 1/2], [0, fy/H, cy/H - 1/2], [0, 0, 1]] ``(B, V, 3, 3)``, entry by entry."""
    (H, W), K = cameras.image_size, cameras.K
    out = torch.zeros_like(K)
    out[..., 0, 0], out[..., 0, 2] = K[..., 0, 0] / W, K[..., 0, 2] / W - 0.5
    out[..., 1, 1], out[..., 1, 2] = K[..., 1, 1] / H, K[..., 1, 2] / H - 0.5
    out[..., 2, 2] = 1.0
    return out


def centre_ray(K_hat, ix, iy, grid):
    """r̂ = K̂^-1 (u, v, 1) of patch (ix, iy), solved by hand for a zero-skew K̂ ``(B, 3, 3)`` -> ``(B, 3)``."""
    u, v = (ix + 0.5) / grid[1] - 0.5, (iy + 0.5) / grid[0] - 0.5
    x = (u - K_hat[:, 0, 2]) / K_hat[:, 0, 0]
    y = (v - K_hat[:, 1, 2]) / K_hat[:, 1, 1]
    return torch.stack([x, y, torch.ones_like(x)], -1)


def rotation(theta):
    return torch.tensor([[math.cos(theta), -math.sin(theta)], [math.sin(theta), math.cos(theta)]], dtype=torch.float64)


@pytest.mark.parametrize("base", [100.0, 10.0])
def test_rope_part_of_one_token_is_the_hand_written_rotation(base):
    """head_dim 16: F = 2, geometric part 0..7, x pairs (8, 10) and (9, 11), y pairs (12, 14) and
    (13, 15), angles ix * w_f and iy * w_f with w = (1, base^-1/2), on a 2x3 grid."""
    cameras = random_cameras(B=1, V=2, seed=1)
    grid = (2, 3)
    D, layout = token_matrices(hrope.get_encoding("rope2d", rope_base=base), cameras, grid, 16)
    assert (layout.geo_dim, layout.num_freqs, layout.num_blocks) == (8, 2, 0)
    ix, iy = 2, 1
    token = 6 + 3 * iy + ix  # view 1
    expected = torch.eye(16, dtype=torch.float64)
    for (a, b), theta in [((8, 10), ix), ((9, 11), ix * base**-0.5), ((12, 14), iy), ((13, 15), iy * base**-0.5)]:
        expected[[[a], [b]], [a, b]] = rotation(theta)
    torch.testing.assert_close(D[0, token], expected, rtol=0, atol=1e-13)  # measured 0 (cos, sin of the same angles)


def test_tangent_frames_are_right_handed_orthonormal_and_follow_the_camera_x_axis():
    g = torch.Generator().manual_seed(0)
    normal = torch.randn(200, 3, generator=g, dtype=torch.float64)
    normal[:20] = torch.tensor([1.0, 0.0, 0.0]) + 0.05 * normal[:20]  # |n_x| > 0.9: the y axis is used
    normal = normal / normal.norm(dim=-1, keepdim=True)
    F = hrope.reference._tangent_frames(normal)
    eye = torch.eye(3, dtype=torch.float64).expand(200, 3, 3)
    torch.testing.assert_close(F.mT @ F, eye, rtol=0, atol=1e-13)  # measured <= 7.2e-16
    torch.testing.assert_close(torch.linalg.det(F), torch.ones(200, dtype=torch.float64), rtol=0, atol=1e-13)
    torch.testing.assert_close(F[..., 2], normal, rtol=0, atol=0)
    use_y = normal[:, 0].abs() > 0.9
    assert use_y[:20].all() and not use_y.all()
    axis = torch.where(use_y[:, None], torch.tensor([0.0, 1.0, 0.0]), torch.tensor([1.0, 0.0, 0.0])).double()
    projected = axis - (axis * normal).sum(-1, keepdim=True) * normal
    t1 = F[..., 0]
    torch.testing.assert_close(t1, projected / projected.norm(dim=-1, keepdim=True), rtol=0, atol=1e-13)  # measured 0
    assert ((t1 * axis).sum(-1) > 0).all()


def test_plane_vectors_from_normal_and_depth_contain_the_depth_point():
    """m = n / (z n·r̂): parallel to n, and the point z r̂ lies on {X : m·X = 1}."""
    cameras = random_cameras(B=2, V=2, seed=2)
    planes = random_planes(2, 2 * P, seed=2)
    m = hrope.reference._plane_vectors(planes, hrope.reference._tokens(cameras, GRID))
    K_hat = normalized_K(cameras)
    for n in range(2 * P):
        view, ix, iy = n // P, n % GRID[1], (n % P) // GRID[1]
        point = planes.depth[:, n, None] * centre_ray(K_hat[:, view], ix, iy, GRID)
        torch.testing.assert_close((m[:, n] * point).sum(-1), torch.ones(2, dtype=torch.float64), rtol=0, atol=1e-12)
        torch.testing.assert_close(
            torch.linalg.cross(m[:, n], planes.normal[:, n]), torch.zeros(2, 3).double(), rtol=0, atol=1e-12
        )


@pytest.mark.parametrize("name", ["hrope", "hrope-lift"])
def test_reference_applies_the_grazing_clamp_like_the_fast_path(name):
    """Planes(normal, depth) seen almost edge-on (|cos(n, r̂)| = 0.001, 0.01, 0.02 < 0.05) are clamped
    (not exactly 0: there the sign the clamp keeps is that of round-off)."""
    cameras = random_cameras(B=1, V=2, seed=9)
    planes = random_planes(1, 2 * P, seed=9)
    K_hat, normal = normalized_K(cameras), planes.normal.clone()
    for n, cos in zip(range(P, 2 * P), (0.001, 0.01, -0.02, 0.3)):
        ray = centre_ray(K_hat[:, 1], n % GRID[1], (n % P) // GRID[1], GRID)[0]
        ray = ray / ray.norm()
        side = torch.linalg.cross(ray, torch.tensor([0.2, 1.0, 0.1], dtype=torch.float64))
        normal[0, n] = math.sqrt(1 - cos**2) * side / side.norm() + cos * ray
    planes = hrope.Planes(normal, planes.depth)
    q, k, v = random_qkv(1, 2, 2 * P, 24, seed=9)
    fast, ref = fast_and_reference(name, q, k, v, cameras, planes)
    torch.testing.assert_close(fast, ref, rtol=1e-9, atol=1e-9)
    tokens = hrope.reference._tokens(cameras, GRID)
    unclamped = planes.normal / (planes.depth * (planes.normal * tokens.ray).sum(-1))[..., None]
    changed = (hrope.reference._plane_vectors(planes, tokens) - unclamped).norm(dim=-1) > 1e-3
    assert changed.tolist() == [[False] * P + [True] * 3 + [False]]  # the three grazing planes only


def relative_pose(cameras, i, j):
    """R_ij = R_i R_j^T and t_ij = t_i - R_ij t_j of batch entry 0."""
    R_i, R_j, t_i, t_j = cameras.R[0, i], cameras.R[0, j], cameras.t[0, i], cameras.t[0, j]
    R_ij = R_i @ R_j.T
    return R_ij, t_i - R_ij @ t_j


def test_hrope_lift_relative_block_is_the_plane_homography():
    """Top-left 3x3 of D_i D_j^-1 = K̂_i (R_ij + t_ij m_j^T) K̂_j^-1 (the key's plane, scale 1)."""
    cameras = random_cameras(B=1, V=2, seed=3)
    m = random_planes(1, 2 * P, seed=3).m(cameras, GRID)
    D, layout = token_matrices("hrope-lift", cameras, GRID, 32, hrope.Planes.from_m(m))
    assert (layout.block, layout.num_blocks) == (4, 4)
    K_hat = normalized_K(cameras)[0]
    R_ij, t_ij = relative_pose(cameras, 0, 1)
    for i, j in [(0, P), (3, P + 2), (2, P + 1)]:
        expected = K_hat[0] @ (R_ij + torch.outer(t_ij, m[0, j])) @ torch.linalg.inv(K_hat[1])
        relative = D[0, i] @ torch.linalg.inv(D[0, j])
        for tile in range(layout.num_blocks):
            torch.testing.assert_close(
                relative[4 * tile : 4 * tile + 3, 4 * tile : 4 * tile + 3], expected, rtol=0, atol=1e-12
            )


def test_hrope_block_is_eq5_of_the_world_plane():
    """H̃ = K̂ (R + t n_w^T / d_w) / |det|^(1/3) for a world plane {X : n_w·X = d_w}, whose camera
    frame vector is m = R n_w / (d_w + (R n_w)·t)."""
    cameras = random_cameras(B=1, V=2, seed=4)
    n_w = torch.tensor([0.3, -0.2, 0.9], dtype=torch.float64)
    n_w, d_w = n_w / n_w.norm(), 2.5
    n_c = cameras.R[0] @ n_w  # (V, 3)
    m = n_c / (d_w + (n_c * cameras.t[0]).sum(-1, keepdim=True))
    planes = hrope.Planes.from_m(m.repeat_interleave(P, dim=0)[None])
    D, layout = token_matrices(HRoPE(gauge="world"), cameras, GRID, 24, planes)
    assert (layout.block, layout.num_blocks) == (3, 4)
    K_hat = normalized_K(cameras)[0]
    for view in range(2):
        H = K_hat[view] @ (cameras.R[0, view] + torch.outer(cameras.t[0, view], n_w) / d_w)
        H = H / torch.linalg.det(H).abs() ** (1 / 3)
        torch.testing.assert_close(D[0, view * P + 1, 3:6, 3:6], H, rtol=0, atol=1e-12)


def lift(M):
    out = torch.eye(4, dtype=torch.float64).repeat(*M.shape[:-2], 1, 1)
    out[..., :3, :3] = M
    return out


def patch_transform(name, inputs, cameras, n):
    """G_u of token n (batch entry 0) by the ablation's definition (docs/encodings.md)."""
    params, K_hat = inputs["params"], normalized_K(cameras)[0, n // P]
    ray = centre_ray(K_hat[None], n % GRID[1], (n % P) // GRID[1], GRID)[0]
    G = torch.eye(4, dtype=torch.float64)
    if name == "hrope-depth":
        G[:3, 3] = -params["depth"][0, n] * ray
    elif name == "hrope-so3":
        G = lift(params["rotation"][0, n])
    elif name in ("hrope-se3", "hrope-full"):
        G = params["transform"][0, n]
    else:  # hrope-pf: camera-facing normal, the point where the plane crosses the ray
        m = inputs["planes"].m(cameras, GRID)[0, n]
        F = hrope.reference._tangent_frames(-m / m.norm())
        G[:3, :3], G[:3, 3] = F.T, -F.T @ (ray / (m @ ray))
    return G


@pytest.mark.parametrize("name", ["hrope-depth", "hrope-so3", "hrope-se3", "hrope-pf", "hrope-full"])
def test_ablation_blocks_equal_lift_K_G_E(name):
    """The reference's hand-expanded block formulas against the definition D = lift(K̂) G_u E."""
    cameras = random_cameras(B=1, V=2, seed=5)
    inputs = encoding_inputs(name, cameras, GRID, seed=5)
    D, layout = token_matrices(name, cameras, GRID, 16, **inputs)
    assert (layout.block, layout.num_blocks) == (4, 2)
    for n in range(2 * P):
        expected = (
            lift(normalized_K(cameras)[0, n // P])
            @ patch_transform(name, inputs, cameras, n)
            @ cameras.world_to_cam[0, n // P]
        )
        torch.testing.assert_close(D[0, n, :4, :4], expected, rtol=0, atol=1e-12)
        torch.testing.assert_close(D[0, n, 4:8, 4:8], D[0, n, :4, :4], rtol=0, atol=0)  # tiled


# ------------------------------------------------------------------ independence from the fast path
def test_reference_imports_no_fast_path_helpers():
    """Of hrope, the reference holds only encoding classes, Cameras, get_encoding and EncodingError
    (plus documented constants, which are plain numbers)."""
    allowed = {hrope.Cameras, hrope.EncodingError, hrope.get_encoding, hrope.Encoding, *hrope.ENCODINGS.values()}
    imported = {
        obj
        for obj in vars(hrope.reference).values()
        if str(getattr(obj, "__module__", "")).startswith("hrope") and obj.__module__ != "hrope.reference"
    }
    assert imported <= allowed, imported - allowed


def test_reference_never_calls_the_fast_path(monkeypatch):
    """Every relative encoding's reference runs with prepare, the plane conversions and the hrope
    clamps of the fast path disabled."""

    def disabled(*args, **kwargs):
        raise AssertionError("the reference called the fast path")

    for cls in hrope.ENCODINGS.values():
        monkeypatch.setattr(cls, "prepare", disabled)
    for method in ("clamp_planes", "homographies", "poses"):
        monkeypatch.setattr(HRoPE, method, disabled)
    for method in ("m", "normal_and_depth", "world_normal_and_kappa"):
        monkeypatch.setattr(hrope.Planes, method, disabled)
    cameras = random_cameras(B=1, V=2, seed=6)
    q, k, v = random_qkv(1, 1, 2 * P, 16, seed=6)
    for name, cls in hrope.ENCODINGS.items():
        if not cls.query_frame:
            out = hrope.reference.multiview_attention(
                q, k, v, encoding=name, cameras=cameras, grid=GRID, **encoding_inputs(name, cameras, GRID, seed=6)
            )
            assert torch.isfinite(out).all()


def test_reference_dispatches_on_the_class_not_the_name():
    class Renamed(PRoPE):
        name = "renamed"

    class Unknown(hrope.Encoding):
        name = "prope"

    cameras = random_cameras(B=1, V=2, seed=7)
    torch.testing.assert_close(
        token_matrices(Renamed(), cameras, GRID, 16)[0], token_matrices("prope", cameras, GRID, 16)[0], rtol=0, atol=0
    )
    with pytest.raises(hrope.EncodingError, match="no dense reference for encoding class Unknown"):
        token_matrices(Unknown(), cameras, GRID, 16)
