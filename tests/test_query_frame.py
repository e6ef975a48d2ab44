"""Query-frame encodings (rayrope, urope, worldrope): fast path vs dense reference and properties."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import hrope
import hrope.reference
from helpers import encoding_params
from hrope.encodings import EncodingError
from hrope.encodings.query_frame import MIN_DEPTH, POSITION_MARGIN, project_to_patches
from hrope.encodings.rayrope import COORDINATE_PERIODS
from hrope.geometry import make_se3

NAMES = ("rayrope", "urope", "worldrope")
IMAGE_SIZE = (24, 32)


# ----------------------------------------------------------------------------------- fixtures
def random_rotations(gen: torch.Generator, *shape: int) -> torch.Tensor:
    """Uniform-ish proper rotations ``(*shape, 3, 3)`` (QR of a Gaussian matrix, det fixed to +1)."""
    Q, R = torch.linalg.qr(torch.randn(*shape, 3, 3, generator=gen, dtype=torch.float64))
    Q = Q * torch.sign(torch.diagonal(R, dim1=-2, dim2=-1))[..., None, :]
    Q[..., :, 0] = Q[..., :, 0] * torch.linalg.det(Q)[..., None]
    return Q


def random_cameras(B: int, V: int, seed: int = 0, dtype=torch.float64) -> hrope.Cameras:
    """Cameras about 3 units from the origin looking roughly at it (random tilt), jittered K."""
    gen = torch.Generator().manual_seed(seed)
    H, W = IMAGE_SIZE
    centre = torch.randn(B, V, 3, generator=gen, dtype=torch.float64)
    centre = 3 * centre / centre.norm(dim=-1, keepdim=True)
    forward = -centre / 3 + 0.2 * torch.randn(B, V, 3, generator=gen, dtype=torch.float64)
    forward = forward / forward.norm(dim=-1, keepdim=True)
    right = torch.cross(forward, torch.randn(B, V, 3, generator=gen, dtype=torch.float64), dim=-1)
    right = right / right.norm(dim=-1, keepdim=True)
    down = torch.cross(forward, right, dim=-1)
    R = torch.stack([right, down, forward], -2)  # world-to-camera rows
    t = -(R @ centre[..., None]).squeeze(-1)
    K = torch.zeros(B, V, 3, 3, dtype=torch.float64)
    K[..., 0, 0] = W * (0.7 + 0.6 * torch.rand(B, V, generator=gen, dtype=torch.float64))
    K[..., 1, 1] = H * (0.7 + 0.6 * torch.rand(B, V, generator=gen, dtype=torch.float64))
    K[..., 0, 2] = W / 2 + 2 * torch.randn(B, V, generator=gen, dtype=torch.float64)
    K[..., 1, 2] = H / 2 + 2 * torch.randn(B, V, generator=gen, dtype=torch.float64)
    K[..., 2, 2] = 1
    return hrope.Cameras(K.to(dtype), make_se3(R, t).to(dtype), IMAGE_SIZE)


def random_qkv(B: int, H: int, N: int, d: int, seed: int = 0, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed + 2)
    return tuple(torch.randn(B, H, N, d, generator=gen, dtype=torch.float64).to(dtype) for _ in range(3))


def run(name, q, k, v, cameras, grid, params, **options):
    sdpa_kwargs = options.pop("sdpa_kwargs", {})
    encoding = hrope.get_encoding(name, **options)
    return hrope.multiview_attention(
        q, k, v, encoding=encoding, cameras=cameras, grid=grid, params=params, **sdpa_kwargs
    )


def same_camera_everywhere(cameras: hrope.Cameras) -> hrope.Cameras:
    V = cameras.num_views
    return hrope.Cameras(
        cameras.K[:, :1].expand(-1, V, -1, -1).clone(),
        cameras.world_to_cam[:, :1].expand(-1, V, -1, -1).clone(),
        cameras.image_size,
    )


# ----------------------------------------------------------------------------------- fast == reference
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("head_dim", [48, 50])
def test_fast_matches_reference(name, head_dim):
    B, V, H, grid = 2, 3, 2, (2, 3)  # non-square grid; 50 leaves identity pairs in every layout
    N = V * grid[0] * grid[1]
    cameras = random_cameras(B, V, seed=1)
    params = encoding_params(name, B, N)
    q, k, v = random_qkv(B, H, N, head_dim)
    fast = run(name, q, k, v, cameras, grid, params)
    ref = hrope.reference.multiview_attention(q, k, v, encoding=name, cameras=cameras, grid=grid, params=params)
    torch.testing.assert_close(fast, ref, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("name", NAMES)
def test_fast_matches_reference_with_mask_and_scale(name):
    B, V, H, d, grid = 1, 2, 2, 24, (2, 2)
    N = V * 4
    cameras = random_cameras(B, V, seed=3)
    params = encoding_params(name, B, N, seed=3)
    q, k, v = random_qkv(B, H, N, d, seed=3)
    mask = torch.rand(N, N, generator=torch.Generator().manual_seed(3)) > 0.3
    mask |= torch.eye(N, dtype=torch.bool)
    kwargs = {"attn_mask": mask, "scale": 0.3}
    fast = run(name, q, k, v, cameras, grid, params, sdpa_kwargs=kwargs)
    ref = hrope.reference.multiview_attention(
        q, k, v, encoding=name, cameras=cameras, grid=grid, params=params, **kwargs
    )
    torch.testing.assert_close(fast, ref, rtol=1e-9, atol=1e-9)
    causal = run(name, q, k, v, cameras, grid, params, sdpa_kwargs={"is_causal": True})
    ref_causal = hrope.reference.multiview_attention(
        q, k, v, encoding=name, cameras=cameras, grid=grid, params=params, attn_mask=torch.ones(N, N).tril().bool()
    )
    torch.testing.assert_close(causal, ref_causal, rtol=1e-9, atol=1e-9)


@settings(max_examples=6, deadline=None)
@given(
    name=st.sampled_from(NAMES),
    views=st.integers(1, 3),
    grid_h=st.integers(1, 3),
    grid_w=st.integers(1, 3),
    seed=st.integers(0, 10_000),
)
def test_fast_matches_reference_property(name, views, grid_h, grid_w, seed):
    grid = (grid_h, grid_w)
    N = views * grid_h * grid_w
    cameras = random_cameras(1, views, seed=seed)
    params = encoding_params(name, 1, N, seed=seed)
    q, k, v = random_qkv(1, 1, N, 24, seed=seed)
    fast = run(name, q, k, v, cameras, grid, params)
    ref = hrope.reference.multiview_attention(q, k, v, encoding=name, cameras=cameras, grid=grid, params=params)
    torch.testing.assert_close(fast, ref, rtol=1e-9, atol=1e-9)


# ----------------------------------------------------------------------------------- execution
@pytest.mark.parametrize("name", NAMES)
def test_loop_equals_fold(name):
    B, V, H, d, grid = 2, 3, 2, 48, (3, 2)
    N = V * 6
    cameras = random_cameras(B, V, seed=4, dtype=torch.float32)
    params = encoding_params(name, B, N, seed=4, dtype=torch.float32)
    q, k, v = random_qkv(B, H, N, d, seed=4, dtype=torch.float32)
    bool_mask = torch.rand(N, N, generator=torch.Generator().manual_seed(4)) > 0.2
    bool_mask |= torch.eye(N, dtype=torch.bool)
    float_mask = torch.randn(B, 1, N, N, generator=torch.Generator().manual_seed(5))
    for kwargs in ({}, {"attn_mask": bool_mask}, {"attn_mask": float_mask}, {"is_causal": True}):
        loop = run(name, q, k, v, cameras, grid, params, execution="loop", sdpa_kwargs=dict(kwargs))
        fold = run(name, q, k, v, cameras, grid, params, execution="fold", sdpa_kwargs=dict(kwargs))
        torch.testing.assert_close(loop, fold, rtol=1e-6, atol=1e-6)  # measured 0 (bit-identical); a few f32 ulps


def saved_bytes_and_grads(name, q, k, v, cameras, grid, params, **options):
    """Output, gradients of (q, k, v, *params) and bytes of distinct tensors saved for backward."""
    leaves = [x.detach().requires_grad_() for x in (q, k, v, *params.values())]
    saved = {}

    def pack(t):
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = run(name, *leaves[:3], cameras, grid, dict(zip(params, leaves[3:])), **options)
    out.square().sum().backward()
    return out.detach(), [x.grad for x in leaves], sum(saved.values())


@pytest.mark.parametrize("name", NAMES)
def test_recompute_gives_same_gradients_with_less_saved_memory(name):
    B, V, H, d, grid = 1, 4, 2, 48, (2, 3)
    N = V * 6
    cameras = random_cameras(B, V, seed=19)
    params = encoding_params(name, B, N, seed=19)
    q, k, v = random_qkv(B, H, N, d, seed=19)
    out, grads, saved = saved_bytes_and_grads(name, q, k, v, cameras, grid, params)
    out_r, grads_r, saved_r = saved_bytes_and_grads(name, q, k, v, cameras, grid, params, recompute=True)
    torch.testing.assert_close(out_r, out, rtol=1e-12, atol=1e-12)
    for a, b in zip(grads_r, grads):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    rotated_kv = 2 * V * k.numel() * k.element_size()  # the V rotated copies of K and V
    assert saved_r <= saved - rotated_kv


@pytest.mark.parametrize("name", NAMES)
def test_precompute_then_apply_per_query_view(name):
    """Manual per-view SDPA with apply_q / apply_kv / apply_o equals attention(); cross-attention
    of one view onto the other views' keys equals masked self-attention."""
    B, V, H, d, grid = 1, 3, 2, 24, (2, 2)
    P, N = 4, 12
    cameras = random_cameras(B, V, seed=6)
    params = encoding_params(name, B, N, seed=6)
    q, k, v = random_qkv(B, H, N, d, seed=6)
    prepared = hrope.get_encoding(name).prepare(cameras, grid, d, **params)
    outs = []
    for c in range(V):
        k_c, v_c = prepared.apply_kv(k, v, c)
        o_c = F.scaled_dot_product_attention(prepared.apply_q(q[:, :, c * P : (c + 1) * P], c), k_c, v_c)
        outs.append(prepared.apply_o(o_c, c))
    torch.testing.assert_close(torch.cat(outs, 2), prepared.attention(q, k, v), rtol=1e-10, atol=1e-10)

    target = 2  # cross-attention: view 2's queries onto the keys of views 0 and 1
    k_t, v_t = prepared.apply_kv(k, v, target)
    rows = slice(target * P, (target + 1) * P)
    cross = prepared.apply_o(
        F.scaled_dot_product_attention(
            prepared.apply_q(q[:, :, rows], target), k_t[:, :, : target * P], v_t[:, :, : target * P]
        ),
        target,
    )
    mask = torch.zeros(N, N, dtype=torch.bool)
    mask[:, : target * P] = True
    masked = prepared.attention(q, k, v, attn_mask=mask)[:, :, rows]
    torch.testing.assert_close(cross, masked, rtol=1e-10, atol=1e-10)


# ----------------------------------------------------------------------------------- invariance
@pytest.mark.parametrize("name", NAMES)
def test_world_frame_invariance(name):
    B, V, H, d, grid = 2, 3, 2, 48, (2, 3)
    N = V * 6
    cameras = random_cameras(B, V, seed=7)
    params = encoding_params(name, B, N, seed=7)
    q, k, v = random_qkv(B, H, N, d, seed=7)
    gen = torch.Generator().manual_seed(8)
    G = make_se3(random_rotations(gen, B), 5 * torch.randn(B, 3, generator=gen, dtype=torch.float64))
    before = run(name, q, k, v, cameras, grid, params)
    after = run(name, q, k, v, cameras.transform_world(G), grid, params)
    torch.testing.assert_close(before, after, rtol=1e-9, atol=1e-9)


# ----------------------------------------------------------------------------------- reductions
def explicit_rope_attention(q, k, v, angles, amplitude=None):
    """Plain RoPE attention from per-token angles ``(N, n)`` on the split pairs (p, p + d/2).

    Pair p of token t gets z = amplitude * exp(i angle); q, k, v <- conj(z) x, o <- z o.
    """
    d = q.shape[-1]
    n = angles.shape[-1]
    amplitude = torch.ones_like(angles) if amplitude is None else amplitude
    re = F.pad(amplitude * angles.cos(), (0, d // 2 - n), value=1.0)
    im = F.pad(amplitude * angles.sin(), (0, d // 2 - n), value=0.0)

    def multiply(x, sign):
        a, b = x[..., : d // 2], x[..., d // 2 :]
        return torch.cat([re * a - sign * im * b, re * b + sign * im * a], -1)

    out = F.scaled_dot_product_attention(multiply(q, -1), multiply(k, -1), multiply(v, -1))
    return multiply(out, 1)


def patch_index_angles(grid, views, head_dim, base=100.0):
    """2D RoPE on integer patch indices: pair f <- w_f ix, pair F + f <- w_f iy, w_f = base^(-f/F)."""
    num = head_dim // 4
    freqs = base ** (-torch.arange(num, dtype=torch.float64) / num)
    iy, ix = torch.meshgrid(torch.arange(grid[0]), torch.arange(grid[1]), indexing="ij")
    angles = torch.cat([ix.reshape(-1, 1) * freqs, iy.reshape(-1, 1) * freqs], -1)
    return angles.repeat(views, 1), freqs


@pytest.mark.parametrize(
    "name,options", [("urope", {}), ("worldrope", {"footprint": False}), ("worldrope", {"footprint": True})]
)
def test_same_camera_reduces_to_patch_index_rope(name, options):
    """All views share one camera: urope and worldrope are 2D RoPE on integer patch indices
    (base 100, layout of image_position_rope_freqs); worldrope's footprint adds the constant per-pair
    factor exp(-w_f^2 / 24) on each side (variance 1/12 patch^2)."""
    V, H, d, grid = 3, 2, 40, (2, 3)
    N = V * 6
    cameras = same_camera_everywhere(random_cameras(1, V, seed=9))
    params = encoding_params(name, 1, N, seed=9)
    q, k, v = random_qkv(1, H, N, d, seed=9)
    angles, freqs = patch_index_angles(grid, V, d)
    amplitude = None
    if options.get("footprint"):
        amplitude = torch.exp(-(torch.cat([freqs, freqs]) ** 2) / 24).expand_as(angles)
    expected = explicit_rope_attention(q, k, v, angles, amplitude)
    torch.testing.assert_close(run(name, q, k, v, cameras, grid, params, **options), expected, rtol=1e-9, atol=1e-9)


def test_rayrope_same_camera_reduces_to_rope_on_corner_directions():
    """All views share one camera and all tokens one depth (zero width): rayrope is RoPE on the
    unit image directions (u, v) / sqrt(1 + u^2 + v^2) of each patch's three corner rays (the
    centre and depth coordinates are the same for every token)."""
    V, H, d, grid = 2, 2, 48, (3, 2)
    N = V * 6
    cameras = same_camera_everywhere(random_cameras(1, V, seed=10))
    q, k, v = random_qkv(1, H, N, d, seed=10)
    params = {
        "log_depth": torch.full((1, N), 0.7, dtype=torch.float64),
        "log_depth_halfwidth": torch.zeros(1, N, dtype=torch.float64),
    }
    freqs = hrope.get_encoding("rayrope").frequencies(d, dtype=torch.float64)  # (F, 12)
    periods = torch.tensor(COORDINATE_PERIODS, dtype=torch.float64)
    torch.testing.assert_close(freqs[0], 2 * math.pi / periods)
    torch.testing.assert_close(freqs[1], 3 * 2 * math.pi / periods)
    gh, gw = grid
    iy, ix = torch.meshgrid(torch.arange(gh, dtype=torch.float64), torch.arange(gw, dtype=torch.float64), indexing="ij")
    directions = []
    for ox, oy in ((0, 0), (1, 0), (0, 1)):
        u, w = (ix.reshape(-1) + ox) / gw - 0.5, (iy.reshape(-1) + oy) / gh - 0.5
        norm = torch.sqrt(1 + u**2 + w**2)
        directions += [u / norm, w / norm]
    depth = torch.full((gh * gw, 3), math.exp(0.7), dtype=torch.float64)
    coords = torch.cat([torch.zeros(gh * gw, 3, dtype=torch.float64), torch.stack(directions, -1), depth], -1)
    angles = (coords[:, None, :] * freqs).flatten(1).repeat(V, 1)
    expected = explicit_rope_attention(q, k, v, angles)
    torch.testing.assert_close(run("rayrope", q, k, v, cameras, grid, params), expected, rtol=1e-9, atol=1e-9)


# ----------------------------------------------------------------------------------- uncertainty
def coefficient_moduli(name, cameras, grid, head_dim, params, **options):
    """|z| ``(B, Vq, N, head_dim/2)`` of every key in every query frame."""
    prepared = hrope.get_encoding(name, **options).prepare(cameras, grid, head_dim, **params)
    return torch.stack([torch.hypot(*prepared.coefficients(c)) for c in range(cameras.num_views)], 1)


def test_zero_uncertainty_is_deterministic():
    B, V, d, grid = 1, 3, 48, (2, 3)
    N = V * 6
    cameras = random_cameras(B, V, seed=11)
    ray = encoding_params("rayrope", B, N, seed=11)
    ray["log_depth_halfwidth"] = torch.zeros(B, N, dtype=torch.float64)
    ones = torch.ones(B, V, N, d // 2, dtype=torch.float64)
    torch.testing.assert_close(coefficient_moduli("rayrope", cameras, grid, d, ray), ones)
    world = encoding_params("worldrope", B, N, seed=11)
    world.update(
        depth_split=torch.zeros(B, N, dtype=torch.float64), depth_sigma=torch.zeros(B, N, 2, dtype=torch.float64)
    )
    torch.testing.assert_close(coefficient_moduli("worldrope", cameras, grid, d, world, footprint=False), ones)

    # worldrope with one depth for every token and no spread is urope with that single anchor
    q, k, v = random_qkv(B, 2, N, d, seed=11)
    world["depth"] = torch.full((B, N), 3.5, dtype=torch.float64)
    expected = run("urope", q, k, v, cameras, grid, {}, anchors=(3.5,))
    torch.testing.assert_close(
        run("worldrope", q, k, v, cameras, grid, world, footprint=False), expected, rtol=1e-9, atol=1e-9
    )
    # rayrope is continuous in the width at 0 (the sinc limit)
    q, k, v = random_qkv(B, 2, N, d, seed=12)
    tiny = dict(ray, log_depth_halfwidth=torch.full((B, N), 1e-7, dtype=torch.float64))
    # measured 5.3e-14 (second order in the width); 20x margin. An error of first order would be ~1e-7
    torch.testing.assert_close(
        run("rayrope", q, k, v, cameras, grid, tiny),
        run("rayrope", q, k, v, cameras, grid, ray),
        rtol=1e-12,
        atol=1e-12,
    )


def test_worldrope_uncertainty_attenuates_high_frequencies_monotonically():
    B, V, d, grid = 1, 3, 48, (2, 3)
    N = V * 6
    cameras = random_cameras(B, V, seed=13)
    params = encoding_params("worldrope", B, N, seed=13)
    params["depth_split"] = torch.zeros(B, N, dtype=torch.float64)  # one component: a pure Gaussian
    moduli = []
    for scale in (0.0, 0.05, 0.2, 0.5, 1.0, 3.0):
        scaled = dict(params, depth_sigma=scale * torch.ones(B, N, 2, dtype=torch.float64))
        moduli.append(coefficient_moduli("worldrope", cameras, grid, d, scaled, footprint=False))
    moduli = torch.stack(moduli)  # (scales, B, Vq, N, pairs)
    assert (moduli[1:] <= moduli[:-1] + 1e-12).all()
    assert (moduli[-1] < moduli[0] - 1e-3).any()
    # higher frequency (smaller pair index within an axis) is damped at least as much
    num = d // 4
    for axis in range(2):
        block = moduli[..., axis * num : (axis + 1) * num]
        assert (block[..., :-1] <= block[..., 1:] + 1e-12).all()


def test_rayrope_width_attenuates_depth_channels_like_sinc():
    """Own-view depth coordinate = own z-depth, so its coefficient modulus is exactly
    |sinc(w (d_hi - d_lo) / 2)|: decreasing in the width inside the main lobe, lower at higher w."""
    B, V, d, grid = 1, 2, 72, (2, 2)
    N = V * 4
    cameras = random_cameras(B, V, seed=14)
    log_depth = torch.zeros(B, N, dtype=torch.float64)  # depth 1, well below the clip at 10
    freqs = hrope.get_encoding("rayrope").frequencies(d, dtype=torch.float64)  # (3, 12)
    moduli = []
    for s in (0.0, 0.1, 0.3, 0.6, 0.9):
        params = {"log_depth": log_depth, "log_depth_halfwidth": torch.full((B, N), s, dtype=torch.float64)}
        prepared = hrope.get_encoding("rayrope").prepare(cameras, grid, d, **params)
        modulus = torch.hypot(*prepared.coefficients())[..., : freqs.numel()].reshape(B, N, 3, 12)
        depth_channels = modulus[..., 9:]  # (B, N, F, 3 rays)
        spread = freqs[:, 9:] * (math.exp(s) - math.exp(-s))
        torch.testing.assert_close(depth_channels, torch.sinc(spread / (2 * math.pi)).abs().expand_as(depth_channels))
        assert (spread <= 2 * math.pi).all()  # main lobe
        moduli.append(depth_channels)
    moduli = torch.stack(moduli)
    assert (moduli[1:] <= moduli[:-1] + 1e-12).all()
    assert (moduli[:, :, :, 1:] <= moduli[:, :, :, :-1] + 1e-12).all()
    assert (moduli[-1, :, :, -1] < 0.95).all()  # the highest depth frequency is clearly damped


# ----------------------------------------------------------------------------------- degenerate geometry
def test_projection_behind_camera_is_mirrored_and_clamped():
    K = torch.tensor([[0.9, 0.0, 0.02], [0.0, 1.1, -0.01], [0.0, 0.0, 1.0]], dtype=torch.float64)
    grid = (4, 6)
    X = torch.tensor([[0.3, -0.2, 2.0], [0.3, -0.2, -2.0], [0.3, 0.1, 0.0], [1e6, -1e6, 1.0]], dtype=torch.float64)
    pos, _ = project_to_patches(X, K, grid)
    torch.testing.assert_close(pos[0], pos[1])  # behind the camera: mirrored through the image plane
    low = -POSITION_MARGIN * torch.tensor([6.0, 4.0], dtype=torch.float64)
    high = (1 + POSITION_MARGIN) * torch.tensor([6.0, 4.0], dtype=torch.float64)
    torch.testing.assert_close(pos[3], torch.stack([high[0], low[1]]))  # extreme positions clamped
    expected_x = 6 * (0.9 * 0.3 / MIN_DEPTH + 0.02 + 0.5)
    assert pos[2, 0] == pytest.approx(min(expected_x, float(high[0])))  # on the camera plane: |Z| floored


def test_rayrope_keeps_the_sign_of_depth_behind_the_query_camera():
    """View 1 shares view 0's centre but faces backwards: its ray points at depth d have query
    depth -d in view 0, and the depth channels rotate by w * (-d) (not mirrored to +d)."""
    base = random_cameras(1, 2, seed=20)
    E = base.world_to_cam.clone()
    flip = torch.diag(torch.tensor([-1.0, 1.0, -1.0, 1.0], dtype=torch.float64))
    E[:, 1] = flip @ E[:, 0]
    cameras = hrope.Cameras(base.K, E, base.image_size)
    d, grid = 24, (2, 2)
    log_depth = torch.linspace(-1.0, 2.0, 8, dtype=torch.float64)[None]
    prepared = hrope.get_encoding("rayrope").prepare(
        cameras, grid, d, log_depth=log_depth, log_depth_halfwidth=torch.zeros(1, 8, dtype=torch.float64)
    )
    re, im = (t[0, 4:, :12] for t in prepared.coefficients(0))  # view 1's keys in view 0's frame, F = 1
    depth = log_depth[0, 4:].exp()
    w = 2 * math.pi / COORDINATE_PERIODS[-1]
    for channel in (9, 10, 11):
        torch.testing.assert_close(re[:, channel], torch.cos(-w * depth))
        torch.testing.assert_close(im[:, channel], torch.sin(-w * depth))


def degenerate_cameras() -> hrope.Cameras:
    """View 1 coincides with view 0, view 2 looks away (view 0's points behind it), view 3 is
    zoomed 10^4 x and view 4 zoomed out 10^-3 x."""
    base = random_cameras(1, 5, seed=15)
    K, E = base.K.clone(), base.world_to_cam.clone()
    K[:, 1], E[:, 1] = K[:, 0], E[:, 0]
    flip = torch.diag(torch.tensor([-1.0, 1.0, -1.0], dtype=torch.float64))
    E[:, 2, :3, :3] = flip @ E[:, 0, :3, :3]
    E[:, 2, :3, 3] = (flip @ E[:, 0, :3, 3, None]).squeeze(-1)
    K[:, 3, :2, :2] *= 1e4
    K[:, 4, :2, :2] *= 1e-3
    return hrope.Cameras(K, E, base.image_size)


@pytest.mark.parametrize("name", NAMES)
def test_degenerate_geometry_gives_finite_outputs_and_gradients(name):
    cameras = degenerate_cameras().to(dtype=torch.float32)
    V, H, d, grid = 5, 2, 48, (2, 2)
    N = V * 4
    params = encoding_params(name, 1, N, seed=15, dtype=torch.float32)
    if name == "rayrope":  # extreme depths, including below MIN_DEPTH and beyond the cap
        params["log_depth"][0, :4] = torch.tensor([-50.0, 50.0, -4.6, 3.0])
    if name == "worldrope":  # near component in front of the camera plane, huge sigma
        params["depth_split"][0, :2] = 100.0
        params["depth_sigma"][0, :2] = 1e3
    q, k, v = (x.requires_grad_() for x in random_qkv(1, H, N, d, seed=15, dtype=torch.float32))
    for p in params.values():
        p.requires_grad_()
    out = run(name, q, k, v, cameras, grid, params)
    assert torch.isfinite(out).all()
    out.square().sum().backward()
    for x in (q, k, v, *params.values()):
        assert torch.isfinite(x.grad).all()
    # coincident cameras: view 1's keys in view 0's frame are encoded as in their own frame
    prepared = hrope.get_encoding(name).prepare(cameras, grid, d, **params)
    own = [t[:, 4:8] for t in prepared.coefficients(1)]
    seen_from_0 = [t[:, 4:8] for t in prepared.coefficients(0)]
    torch.testing.assert_close(seen_from_0, own, rtol=1e-6, atol=1e-6)  # measured 0 (bit-identical); a few f32 ulps


# ----------------------------------------------------------------------------------- dtypes and gradients
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_with_and_without_autocast(name, dtype):
    B, V, H, d, grid = 1, 2, 2, 48, (2, 3)
    N = V * 6
    cameras = random_cameras(B, V, seed=16, dtype=torch.float32)
    params = encoding_params(name, B, N, seed=16, dtype=torch.float32)
    q, k, v = random_qkv(B, H, N, d, seed=16, dtype=torch.float32)
    # rtol = atol = tol; measured worst max |low - float32| / (1 + |float32|) over the three encodings
    # (on other inputs: up to 2.5x that); bounds about 5 measured, clear of the half dtype's few ulp
    plain_tol, autocast_tol = {
        torch.bfloat16: (
            0.05,  # measured worst 0.0069 (bf16, worldrope)
            0.15,
        ),  # measured worst 0.030 (bf16 autocast, rayrope: four bf16 ulp)
        torch.float16: (
            0.01,  # measured worst 0.00091 (fp16, worldrope)
            0.03,
        ),  # measured worst 0.0064 (fp16 autocast, rayrope)
    }[dtype]
    expected = run(name, q, k, v, cameras, grid, params)
    low = run(name, q.to(dtype), k.to(dtype), v.to(dtype), cameras, grid, params)
    assert low.dtype == dtype
    torch.testing.assert_close(low.float(), expected, rtol=plain_tol, atol=plain_tol)
    with torch.autocast("cpu", dtype=dtype):
        auto = run(name, q, k, v, cameras, grid, params, execution="fold")
        auto_low = run(name, q.to(dtype), k.to(dtype), v.to(dtype), cameras, grid, params)
    assert torch.isfinite(auto).all() and torch.isfinite(auto_low).all()
    torch.testing.assert_close(auto.float(), expected, rtol=autocast_tol, atol=autocast_tol)
    torch.testing.assert_close(auto_low.float(), expected, rtol=autocast_tol, atol=autocast_tol)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("execution", ["loop", "fold"])
def test_gradcheck_float64(name, execution):
    B, V, H, d, grid = 1, 2, 1, 24, (1, 2)
    N = V * 2
    cameras = random_cameras(B, V, seed=17)
    params = encoding_params(name, B, N, seed=17)
    q, k, v = random_qkv(B, H, N, d, seed=17)
    names = list(params)
    inputs = [x.requires_grad_() for x in (q, k, v, *params.values())]

    def f(q, k, v, *values):
        return run(name, q, k, v, cameras, grid, dict(zip(names, values)), execution=execution)

    assert torch.autograd.gradcheck(f, inputs, fast_mode=True)


# ----------------------------------------------------------------------------------- errors
def test_clear_errors():
    cameras = random_cameras(1, 2, seed=18)
    grid, N = (2, 2), 8
    with pytest.raises(EncodingError, match="needs params"):
        hrope.get_encoding("rayrope").prepare(cameras, grid, 48)
    with pytest.raises(EncodingError, match="must have shape"):
        hrope.get_encoding("worldrope").prepare(
            cameras, grid, 48, depth=torch.ones(1, N + 1), depth_split=torch.ones(1, N), depth_sigma=torch.ones(1, N, 2)
        )
    with pytest.raises(EncodingError, match="unknown params"):
        hrope.get_encoding("urope").prepare(cameras, grid, 48, depth=torch.ones(1, N))
    with pytest.raises(EncodingError, match="head_dim >= 24"):
        hrope.get_encoding("rayrope").prepare(cameras, grid, 16, **encoding_params("rayrope", 1, N))
    with pytest.raises(EncodingError, match="even head_dim"):
        hrope.get_encoding("urope").prepare(cameras, grid, 47)
    with pytest.raises(EncodingError, match="execution"):
        hrope.get_encoding("urope", execution="batched")
    with pytest.raises(EncodingError, match="recompute"):
        hrope.get_encoding("urope", execution="fold", recompute=True)
    with pytest.raises(EncodingError, match="anchors"):
        hrope.get_encoding("urope", anchors=(0.0, 2.0))
    prepared = hrope.get_encoding("urope").prepare(cameras, grid, 48)
    q = torch.randn(1, 2, N, 48, dtype=torch.float64)
    with pytest.raises(EncodingError, match="either attn_mask or is_causal"):
        prepared.attention(q, q, q, attn_mask=torch.ones(N, N, dtype=torch.bool), is_causal=True)
    with pytest.raises(EncodingError, match="query_view"):
        prepared.apply_kv(q, q, 2)
