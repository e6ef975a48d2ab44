"""Every relative encoding: official PRoPE vectors, fast path vs float64 reference, reductions,
world-frame invariance and the precompute-then-apply API."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import hrope
import hrope.reference
from helpers import RELATIVE, encoding_inputs, random_cameras, random_planes, random_qkv, random_se3
from hrope.reference import dense_attention, token_matrices

# Outputs of the official PRoPE module (prope and its Ks=None GTA mode) on fixed inputs, shipped with
# the tests so that a plain clone can run them.
VECTORS = Path(__file__).resolve().parent / "data" / "prope_official_vectors.json"


def both(name, q, k, v, cameras, grid, planes=None, params=None, **kw):
    fast = hrope.multiview_attention(
        q, k, v, encoding=name, cameras=cameras, grid=grid, planes=planes, params=params, **kw
    )
    ref = hrope.reference.multiview_attention(
        q, k, v, encoding=name, cameras=cameras, grid=grid, planes=planes, params=params, **kw
    )
    return fast, ref


# --------------------------------------------------------------------------- official PRoPE vectors
def load_cases():
    return json.loads(VECTORS.read_text())["cases"]


@pytest.mark.parametrize("case", load_cases(), ids=lambda c: f"{c['encoding']}-{c['grid']}-{c['image_size']}")
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_reproduces_official_prope_module(case, dtype):
    T = lambda x: torch.tensor(x, dtype=dtype)  # noqa: E731
    cameras = hrope.Cameras(T(case["K"]), T(case["world_to_cam"]), tuple(case["image_size"]))
    out = hrope.multiview_attention(
        T(case["q"]), T(case["k"]), T(case["v"]), encoding=case["encoding"], cameras=cameras, grid=tuple(case["grid"])
    )
    expected = torch.tensor(case["out"], dtype=torch.float64)
    # float64: measured worst 3.6e-15 (round-off; 1e-10 is far below any convention error, which is
    # O(1)); float32: measured worst 4.8e-7 of max |expected| (prope, grid 2x4), 10x margin
    tol = 1e-10 if dtype == torch.float64 else 5e-6 * expected.abs().max()
    assert out.dtype == dtype
    assert (out.double() - expected).abs().max() <= tol


def test_stored_vectors_match_the_documented_official_algorithm():
    """tests/data/make_prope_vectors.py (an independent float64 implementation of the official
    module's algorithm, see tests/data/README.md) recomputes every stored output from its stored
    inputs to float64 round-off (measured worst 7.9e-16 of max |stored|; bound 1e-13)."""
    spec = importlib.util.spec_from_file_location("make_prope_vectors", VECTORS.parent / "make_prope_vectors.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    rows = script.check(VECTORS)
    assert len(rows) == len(load_cases()) and all(r["relative"] <= 1e-13 for r in rows), rows


def test_official_vectors_cover_non_square_grids_and_batches():
    cases = load_cases()
    assert any(c["grid"][0] != c["grid"][1] for c in cases)
    assert any(len(c["K"]) > 1 for c in cases)
    assert {c["encoding"] for c in cases} == {"prope", "gta"}


# --------------------------------------------------------------------------- fast == reference
@pytest.mark.parametrize("name", RELATIVE)
@pytest.mark.parametrize("head_dim", [32, 48, 64, 96])
@pytest.mark.parametrize("views,grid", [(1, (2, 3)), (2, (3, 2)), (3, (2, 2)), (4, (1, 3))])
def test_fast_path_matches_float64_reference(name, head_dim, views, grid):
    cameras = random_cameras(B=2, V=views, image_size=(24, 40), seed=head_dim + views)
    N = views * grid[0] * grid[1]
    q, k, v = random_qkv(2, 3, N, head_dim, seed=views)
    fast, ref = both(name, q, k, v, cameras, grid, **encoding_inputs(name, cameras, grid, seed=head_dim))
    assert fast.shape == q.shape
    torch.testing.assert_close(fast, ref, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("name", ["prope", "hrope", "hrope-lift", "cape"])
@pytest.mark.parametrize("head_dim", [2, 10, 34, 36])
def test_any_even_head_dim_works_with_identity_remainder(name, head_dim):
    cameras = random_cameras(B=1, V=2, seed=head_dim)
    grid = (2, 2)
    q, k, v = random_qkv(1, 2, 8, head_dim)
    fast, ref = both(name, q, k, v, cameras, grid, **encoding_inputs(name, cameras, grid))
    torch.testing.assert_close(fast, ref, rtol=1e-9, atol=1e-9)


def test_head_layout_splits():
    from hrope.encodings import HeadLayout

    layout = HeadLayout(64, block=3)
    assert (layout.geo_dim, layout.num_blocks, layout.tiled_dim, layout.rope_dim) == (32, 10, 30, 32)
    layout = HeadLayout(48, block=4)
    assert (layout.geo_dim, layout.num_blocks, layout.rope_dim, layout.num_freqs) == (24, 6, 24, 6)
    assert HeadLayout(64, block=4, rope=False).num_blocks == 16


def test_attention_mask_and_scale_pass_through_to_sdpa():
    cameras = random_cameras(B=1, V=2, seed=3)
    grid = (2, 2)
    q, k, v = random_qkv(1, 2, 8, 32)
    mask = torch.rand(8, 8, generator=torch.Generator().manual_seed(0)) > 0.3
    mask.fill_diagonal_(True)
    fast, ref = both("prope", q, k, v, cameras, grid, attn_mask=mask, scale=0.3)
    torch.testing.assert_close(fast, ref, rtol=1e-9, atol=1e-9)
    unmasked = hrope.multiview_attention(q, k, v, encoding="prope", cameras=cameras, grid=grid, scale=0.3)
    assert not torch.allclose(fast, unmasked)


# --------------------------------------------------------------------------- reductions
@pytest.mark.parametrize("name", ["prope", "gta", "hrope", "hrope-lift"])
def test_single_view_reduces_to_rope2d(name):
    """One view: every token shares D's geometric block (a shared plane for the HRoPE forms)."""
    cameras = random_cameras(B=2, V=1, seed=5)
    grid = (3, 4)
    q, k, v = random_qkv(2, 4, 12, 64)
    normal = torch.tensor([0.2, -0.3, -1.0], dtype=torch.float64).expand(2, 12, 3)
    planes = hrope.Planes.from_m(normal / 2.5)
    out = hrope.multiview_attention(q, k, v, encoding=name, cameras=cameras, grid=grid, planes=planes)
    rope = hrope.multiview_attention(q, k, v, encoding="rope2d", cameras=cameras, grid=grid)
    torch.testing.assert_close(out, rope, rtol=1e-10, atol=1e-10)


def test_none_is_plain_sdpa_and_rope2d_differs():
    cameras = random_cameras(B=1, V=2, seed=1)
    q, k, v = random_qkv(1, 2, 8, 16)
    out = hrope.multiview_attention(q, k, v, encoding="none", cameras=cameras, grid=(2, 2))
    torch.testing.assert_close(out, torch.nn.functional.scaled_dot_product_attention(q, k, v))
    rope = hrope.multiview_attention(q, k, v, encoding="rope2d", cameras=cameras, grid=(2, 2))
    assert (rope - out).abs().max() > 1e-3


def test_cape_leaves_values_untransformed():
    """CaPE changes only the attention weights: outputs stay in the convex hull of the values."""
    cameras = random_cameras(B=1, V=2, seed=2)
    q, k, v = random_qkv(1, 1, 8, 16)
    v = torch.ones_like(v)
    out = hrope.multiview_attention(q, k, v, encoding="cape", cameras=cameras, grid=(2, 2))
    torch.testing.assert_close(out, v)
    prope = hrope.multiview_attention(q, k, v, encoding="prope", cameras=cameras, grid=(2, 2))
    assert (prope - v).abs().max() > 1e-3


# --------------------------------------------------------------------------- world-frame invariance
@settings(max_examples=12, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    views=st.integers(1, 3),
    head_dim=st.sampled_from([16, 32, 48]),
    name=st.sampled_from(RELATIVE),
)
def test_world_frame_invariance(seed, views, head_dim, name):
    grid = (2, 3)
    cameras = random_cameras(B=2, V=views, seed=seed)
    G = random_se3(2, generator=torch.Generator().manual_seed(seed + 7), translation_scale=3.0)
    moved = cameras.transform_world(G)
    q, k, v = random_qkv(2, 2, views * 6, head_dim, seed=seed)
    kwargs = encoding_inputs(name, cameras, grid, seed=seed)
    a = hrope.multiview_attention(q, k, v, encoding=name, cameras=cameras, grid=grid, **kwargs)
    b = hrope.multiview_attention(q, k, v, encoding=name, cameras=moved, grid=grid, **kwargs)
    torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-8)


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 10_000), views=st.integers(2, 3), lift4=st.booleans())
def test_hrope_invariant_when_tokens_share_one_world_plane(seed, views, lift4):
    """Eq. 5 in the world gauge depends on the world frame in general, but not for tokens on one world plane."""
    grid = (2, 2)
    g = torch.Generator().manual_seed(seed)
    cameras = random_cameras(B=1, V=views, seed=seed)
    n_w = torch.nn.functional.normalize(torch.randn(3, generator=g, dtype=torch.float64), dim=0)
    planes = world_plane_as_token_planes(cameras, grid, n_w, d_w=5.0 + torch.rand(1, generator=g).item())
    G = random_se3(1, generator=g, translation_scale=0.5)
    q, k, v = random_qkv(1, 2, views * 4, 48, seed=seed)
    enc = hrope.get_encoding("hrope", lift4=lift4, gauge="world")
    a = hrope.multiview_attention(q, k, v, encoding=enc, cameras=cameras, grid=grid, planes=planes)
    b = hrope.multiview_attention(q, k, v, encoding=enc, cameras=cameras.transform_world(G), grid=grid, planes=planes)
    torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-8)


def test_hrope_depends_on_world_frame_for_different_planes():
    """In the world gauge, differing planes make Eq. 5 depend on the world frame (DESIGN.md §4.3)."""
    world = hrope.get_encoding("hrope", gauge="world")
    cameras = random_cameras(B=1, V=2, seed=11)
    grid = (2, 2)
    planes = random_planes(1, 8, seed=11)
    G = random_se3(1, generator=torch.Generator().manual_seed(3), translation_scale=0.5)
    q, k, v = random_qkv(1, 2, 8, 48)
    a = hrope.multiview_attention(q, k, v, encoding=world, cameras=cameras, grid=grid, planes=planes)
    b = hrope.multiview_attention(q, k, v, encoding=world, cameras=cameras.transform_world(G), grid=grid, planes=planes)
    assert (a - b).abs().max() > 1e-4


def world_plane_as_token_planes(cameras, grid, n_w, d_w):
    """Every token gets the world plane {n_w · X = d_w} in its own camera frame: m_c = n_c / d_c."""
    n_c = cameras.R @ n_w  # (B, V, 3)
    d_c = d_w + (n_c * cameras.t).sum(-1)
    m = (n_c / d_c[..., None]).repeat_interleave(grid[0] * grid[1], dim=1)
    return hrope.Planes.from_m(m)


# --------------------------------------------------------------------------- precompute-then-apply
def test_cross_attention_with_two_prepared_transforms():
    """Queries from view 0 attend to keys of views 1-2 via two transforms (PRoPE's split API)."""
    cameras = random_cameras(B=1, V=3, seed=4)
    grid, head_dim = (2, 2), 32
    enc = hrope.get_encoding("hrope-lift")
    planes = random_planes(1, 12, seed=4)
    m = planes.m(cameras, grid)
    q_cams, kv_cams = cameras.select_views([0]), cameras.select_views([1, 2])
    q_planes, kv_planes = hrope.Planes.from_m(m[:, :4]), hrope.Planes.from_m(m[:, 4:])
    tq = enc.prepare(q_cams, grid, head_dim, planes=q_planes)
    tk = enc.prepare(kv_cams, grid, head_dim, planes=kv_planes)
    q, _, _ = random_qkv(1, 2, 4, head_dim, seed=1)
    _, k, v = random_qkv(1, 2, 8, head_dim, seed=2)
    out = tq.apply_o(torch.nn.functional.scaled_dot_product_attention(tq.apply_q(q), tk.apply_k(k), tk.apply_v(v)))
    D_q, _ = token_matrices("hrope-lift", q_cams, grid, head_dim, q_planes)
    D_k, _ = token_matrices("hrope-lift", kv_cams, grid, head_dim, kv_planes)
    torch.testing.assert_close(out, dense_attention(q, k, v, D_q, D_k), rtol=1e-9, atol=1e-9)


def test_register_tokens_sliced_around_the_transforms():
    cameras = random_cameras(B=1, V=2, seed=6)
    grid = (2, 2)
    transform = hrope.get_encoding("prope").prepare(cameras, grid, 32)
    q, k, v = random_qkv(1, 2, 8 + 2, 32)  # 2 register tokens appended
    enc_q = torch.cat([transform.apply_q(q[:, :, :8]), q[:, :, 8:]], dim=2)
    enc_k = torch.cat([transform.apply_k(k[:, :, :8]), k[:, :, 8:]], dim=2)
    enc_v = torch.cat([transform.apply_v(v[:, :, :8]), v[:, :, 8:]], dim=2)
    out = torch.nn.functional.scaled_dot_product_attention(enc_q, enc_k, enc_v)
    out = torch.cat([transform.apply_o(out[:, :, :8]), out[:, :, 8:]], dim=2)
    D, _ = token_matrices("prope", cameras, grid, 32)
    eye = torch.eye(32, dtype=torch.float64).expand(1, 2, 32, 32)
    D = torch.cat([D, eye], dim=1)
    torch.testing.assert_close(out, dense_attention(q, k, v, D, D), rtol=1e-9, atol=1e-9)
    with pytest.raises(hrope.EncodingError, match="expected"):
        transform.apply_q(q)


@pytest.mark.parametrize("name", ["prope", "hrope", "hrope-full", "cape"])
def test_apply_functions_are_the_dense_token_matrices(name):
    """apply_q, apply_k, apply_v and apply_o multiply every token by D^T, D^-1, D^-1 and D of
    hrope.reference.token_matrices (v and o untouched for CaPE), also on a second use that reads
    the cached tables; one prepared transform serves two layers' inputs."""
    cameras = random_cameras(B=1, V=2, seed=8)
    grid, head_dim = (2, 2), 32
    inputs = encoding_inputs(name, cameras, grid, seed=8)
    transform = hrope.get_encoding(name).prepare(cameras, grid, head_dim, planes=inputs["planes"], **inputs["params"])
    D, _ = token_matrices(name, cameras, grid, head_dim, inputs["planes"], inputs["params"])
    D_inv = torch.linalg.inv(D)
    x = random_qkv(1, 2, 8, head_dim, seed=8)[0]

    def per_token(M):
        return (M[:, None] @ x[..., None]).squeeze(-1)

    values = name != "cape"
    expected = {
        "apply_q": per_token(D.transpose(-1, -2)),
        "apply_k": per_token(D_inv),
        "apply_v": per_token(D_inv) if values else x,
        "apply_o": per_token(D) if values else x,
    }
    assert (expected["apply_q"] - expected["apply_k"]).abs().max() > 1e-3  # D^T != D^-1: the check can fail
    for _use in range(2):  # the second use reads the tables cached by the first
        for apply, want in expected.items():
            torch.testing.assert_close(getattr(transform, apply)(x), want, rtol=1e-9, atol=1e-9)
    for layer in (1, 2):  # two layers' q, k, v through one transform
        q, k, v = random_qkv(1, 2, 8, head_dim, seed=layer)
        torch.testing.assert_close(
            transform.attention(q, k, v), dense_attention(q, k, v, D, D, transform_values=values), rtol=1e-9, atol=1e-9
        )


def test_gta_learnable_translation_scale_trains_and_matches_reference():
    enc = hrope.get_encoding("gta", learnable_translation_scale=True)
    assert enc.translation_scale.item() == pytest.approx(0.01)
    cameras = random_cameras(B=1, V=2, seed=9)
    grid = (2, 2)
    q, k, v = random_qkv(1, 2, 8, 32)
    out = hrope.multiview_attention(q, k, v, encoding=enc, cameras=cameras, grid=grid)
    ref = hrope.reference.multiview_attention(q, k, v, encoding=enc, cameras=cameras, grid=grid)
    torch.testing.assert_close(out, ref.to(out.dtype), rtol=1e-9, atol=1e-9)
    out.square().sum().backward()
    assert enc.translation_scale.grad is not None and enc.translation_scale.grad.abs() > 0
    plain = hrope.multiview_attention(q, k, v, encoding="gta", cameras=cameras, grid=grid)
    assert (plain - out).abs().max() > 1e-4
