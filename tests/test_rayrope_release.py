"""rayrope as released: the official numerics against the released code's vectors, and the released
modes (known depth, depth coordinates, values not rotated, cross-attention) against the reference."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import hrope
import hrope.reference
from hrope.encodings import EncodingError
from hrope.encodings import sample_ray_depths
from hrope.nvs.sources.specs import parameter_specs
from hrope.testing import random_cameras, random_qkv, random_se3

VECTORS = Path(__file__).resolve().parent / "data" / "rayrope_official_vectors.npz"
VECTOR_GRID = (4, 6)
VECTOR_IMAGE = (64, 96)
GRADIENTS = {"dq": "q", "dk": "k", "dv": "v", "dmu": "log_depth", "ds": "log_depth_halfwidth"}
# Worst max|got - want| / max|want| over out and the five gradients, per case (fast path and
# reference both): head_dim 48 measured <= 7.8e-7; head_dim 144 measured <= 8.6e-5 (case 5); bounds about
# 4x those (the errors are the vectors' float32 storage, not round-off that varies). The floor at 144
# is the vectors' float32 storage of poses computed in float64: re-rounding the poses alone to
# float32 moves our float64 result by 1-4e-5 (0.26-3e-7 at head_dim 48).
TOLERANCE = {48: 3e-6, 144: 3e-4}


def load_case(case: int) -> dict[str, torch.Tensor]:
    with np.load(VECTORS) as data:
        return {
            key.split("/")[1]: torch.tensor(data[key], dtype=torch.float64)
            for key in data.files
            if key.startswith(f"case{case}/")
        }


def vector_inputs(case: dict[str, torch.Tensor]) -> tuple[hrope.Cameras, dict[str, torch.Tensor]]:
    """Cameras (stored rotations projected back onto SO(3)) and the leaf tensors q, k, v, μ, s."""
    E = case["world_to_cam"].clone()
    U, _, Vh = torch.linalg.svd(E[..., :3, :3])
    E[..., :3, :3] = U @ Vh
    leaves = {name: case[name].clone().requires_grad_() for name in ("q", "k", "v", "log_depth", "log_depth_halfwidth")}
    return hrope.Cameras(case["K"], E, VECTOR_IMAGE), leaves


def worst_errors(case: dict[str, torch.Tensor], numerics: str, attention) -> dict[str, float]:
    cameras, x = vector_inputs(case)
    encoding = hrope.get_encoding("rayrope", numerics=numerics)
    params = {"log_depth": x["log_depth"], "log_depth_halfwidth": x["log_depth_halfwidth"]}
    out = attention(x["q"], x["k"], x["v"], encoding=encoding, cameras=cameras, grid=VECTOR_GRID, params=params)
    (out * case["weight"]).sum().backward()
    got = {"out": out.detach(), **{g: x[leaf].grad for g, leaf in GRADIENTS.items()}}
    return {name: ((got[name] - case[name]).abs().max() / case[name].abs().max()).item() for name in got}


@pytest.mark.parametrize("case", range(7))
def test_official_numerics_reproduce_the_released_code(case):
    data = load_case(case)
    errors = worst_errors(data, "official", hrope.multiview_attention)
    assert max(errors.values()) < TOLERANCE[data["q"].shape[-1]], errors


@pytest.mark.parametrize("case", [0, 1, 2, 6])  # head_dim 48 (the dense reference takes seconds at 144)
def test_reference_official_numerics_reproduce_the_released_code(case):
    data = load_case(case)
    errors = worst_errors(data, "official", hrope.reference.multiview_attention)
    assert max(errors.values()) < TOLERANCE[48], errors


@pytest.mark.parametrize("case", [0, 1, 6])
def test_exact_numerics_are_not_the_released_ones(case):
    """The vectors tell the numerics apart: the exact expectation misses them (d/ds at zero width,
    the spread shortcut, the mirrored depth behind a camera)."""
    errors = worst_errors(load_case(case), "exact", hrope.multiview_attention)
    assert max(errors.values()) > 1e-2, errors


# ----------------------------------------------------------------------------------- options vs reference
B, V, GRID, HEAD_DIM = 1, 3, (2, 3), 48
N = V * GRID[0] * GRID[1]


def geometry(seed: int = 0, views: int = V, grid: tuple[int, int] = GRID):
    cameras = random_cameras(B, views, (16, 24), seed=seed)
    g = torch.Generator().manual_seed(seed + 7)
    n = views * grid[0] * grid[1]
    params = {
        "log_depth": 0.3 + 1.2 * torch.rand(B, n, generator=g, dtype=torch.float64),
        "log_depth_halfwidth": torch.where(
            torch.rand(B, n, generator=g) < 0.3, 0.0, 0.6 * torch.rand(B, n, generator=g, dtype=torch.float64)
        ),
    }
    known = 0.5 + 4.0 * torch.rand(B, n, 3, generator=g, dtype=torch.float64)
    known[:, : n // 3] = 0.0  # the first view's depths are missing
    return cameras, params, known


def grads_of(fn, leaves: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    leaves = {k: v.clone().requires_grad_() for k, v in leaves.items()}
    out = fn(**leaves)
    weight = torch.linspace(-1, 1, out.numel(), dtype=torch.float64).reshape(out.shape)
    (out * weight).sum().backward()
    return [out.detach()] + [leaves[k].grad for k in sorted(leaves)]


OPTION_SETS = [
    {"numerics": "official"},
    {"numerics": "exact", "depth_coordinate": "inverse"},
    {"numerics": "official", "depth_coordinate": "inverse"},
    {"numerics": "exact", "depth_coordinate": "asinh"},
    {"numerics": "official", "depth_coordinate": "asinh"},
    {"numerics": "exact", "rotate_values": False},
    {"numerics": "official", "rotate_values": False, "execution": "fold"},
    {"numerics": "exact", "depth": "known"},
    {"numerics": "official", "depth": "known"},
    {"numerics": "exact", "depth": "known+halfwidth", "execution": "fold"},
    {"numerics": "official", "depth": "known+halfwidth"},
]


def check_fast_path_matches_reference(options: dict, head_dim: int) -> None:
    """Forward and the gradients w.r.t. q, k, v, μ and s of the fast path and the reference."""
    cameras, params, known = geometry(seed=1)
    encoding = hrope.get_encoding("rayrope", **options)
    fixed = {"known_depth": known} if "depth" in options else {}
    q, k, v = random_qkv(B, 2, N, head_dim, seed=3)

    def attend(module):
        def run(q, k, v, **p):
            return module.multiview_attention(
                q, k, v, encoding=encoding, cameras=cameras, grid=GRID, params={**p, **fixed}
            )

        return run

    leaves = {"q": q, "k": k, "v": v, **params}
    fast, slow = grads_of(attend(hrope), leaves), grads_of(attend(hrope.reference), leaves)
    for got, want in zip(fast, slow, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("options", OPTION_SETS, ids=lambda o: "-".join(str(v) for v in o.values()))
def test_options_fast_path_matches_reference(options):
    check_fast_path_matches_reference(options, HEAD_DIM)


def test_official_fast_path_matches_reference_at_three_frequencies():
    check_fast_path_matches_reference({"numerics": "official"}, 72)


def test_rotate_values_off_leaves_values_and_output_alone():
    """rotate_values=False rotates k exactly as the default does and leaves v and the output alone."""
    cameras, params, _ = geometry(seed=2)
    q, k, v = random_qkv(B, 2, N, HEAD_DIM, seed=4)
    off = hrope.get_encoding("rayrope", rotate_values=False).prepare(cameras, GRID, HEAD_DIM, **params)
    on = hrope.get_encoding("rayrope").prepare(cameras, GRID, HEAD_DIM, **params)
    assert not off.transform_values and on.transform_values
    for c in range(V):
        rows = slice(c * 6, (c + 1) * 6)
        k_off, v_off = off.apply_kv(k, v, c)
        k_on, v_on = on.apply_kv(k, v, c)
        assert torch.equal(k_off, k_on) and torch.equal(v_off, v) and not torch.allclose(v_on, v)
        assert torch.equal(off.apply_o(q[:, :, rows], c), q[:, :, rows])
        assert not torch.allclose(on.apply_o(q[:, :, rows], c), q[:, :, rows])


@pytest.mark.parametrize("numerics", ["exact", "official"])
def test_rotate_values_off_with_identity_tokens_matches_reference(numerics):
    """Camera tokens mixed with identity tokens (registers): an identity query sees the camera
    values unrotated too."""
    cameras, params, _ = geometry(seed=16)
    encoding = hrope.get_encoding("rayrope", numerics=numerics, rotate_values=False)
    camera_tokens = torch.ones(N + 3, dtype=torch.bool)
    camera_tokens[[0, 7, N + 2]] = False
    q, k, v = random_qkv(B, 2, N + 3, HEAD_DIM, seed=17)
    args = {"encoding": encoding, "cameras": cameras, "grid": GRID, "params": params, "camera_tokens": camera_tokens}
    got = hrope.multiview_attention(q, k, v, **args)
    torch.testing.assert_close(got, hrope.reference.multiview_attention(q, k, v, **args), rtol=1e-10, atol=1e-11)


# ----------------------------------------------------------------------------------- known depth
def test_known_depth_is_a_deterministic_predicted_depth():
    """A ray with a known depth d encodes as a predicted depth μ = log d with zero width, whatever
    its μ and s; a missing one (<= 0) keeps its predicted interval."""
    cameras, params, known = geometry(seed=5)
    known[:, :, 1:] = known[:, :, :1]  # one depth per token, so μ = log d is the same segment
    q, k, v = random_qkv(B, 2, N, HEAD_DIM, seed=6)
    has = known[..., 0] > 0
    equivalent = {
        "log_depth": torch.where(has, known[..., 0].log(), params["log_depth"]),
        "log_depth_halfwidth": torch.where(has, 0.0, params["log_depth_halfwidth"]),
    }
    for numerics in ("exact", "official"):

        def run(depth: str, p: dict, numerics: str = numerics) -> torch.Tensor:
            encoding = hrope.get_encoding("rayrope", numerics=numerics, depth=depth)
            return hrope.multiview_attention(q, k, v, encoding=encoding, cameras=cameras, grid=GRID, params=p)

        with_known = {**params, "known_depth": known}
        torch.testing.assert_close(run("known", with_known), run("predicted", equivalent), rtol=1e-12, atol=1e-12)
        halfwidth = {**equivalent, "log_depth_halfwidth": params["log_depth_halfwidth"]}
        torch.testing.assert_close(
            run("known+halfwidth", with_known), run("predicted", halfwidth), rtol=1e-12, atol=1e-12
        )


def test_known_depth_is_data_not_a_learned_head():
    specs = parameter_specs(hrope.get_encoding("rayrope", depth="known"))
    assert [spec.name for spec in specs] == ["log_depth", "log_depth_halfwidth"]
    assert hrope.get_encoding("rayrope", depth="known").data_param_names == ("known_depth",)
    assert hrope.get_encoding("rayrope").param_names == ("log_depth", "log_depth_halfwidth")


def test_sample_ray_depths_reads_the_pixel_nearest_each_corner():
    H, W, grid = 4, 6, (2, 3)  # 2x2-pixel patches
    depth_map = torch.arange(H * W, dtype=torch.float64).reshape(1, 1, H, W) + 1
    got = sample_ray_depths(depth_map, grid)  # (1, 6, 3)

    # corner x = 2 ix + 2 ox: pixel round(x - 0.5) ties to even, clamped; same for y
    def pixel(c, size):
        return min(max(round(c - 0.5), 0), size - 1)  # Python's round ties to even too

    for iy in range(2):
        for ix in range(3):
            for r, (ox, oy) in enumerate(((0, 0), (1, 0), (0, 1))):
                want = depth_map[0, 0, pixel(2 * (iy + oy), H), pixel(2 * (ix + ox), W)]
                assert got[0, iy * 3 + ix, r] == want
    with pytest.raises(EncodingError, match="whole number"):
        sample_ray_depths(depth_map, (3, 3))


# ----------------------------------------------------------------------------------- cross-attention
@pytest.mark.parametrize("execution", ["loop", "fold"])
@pytest.mark.parametrize("numerics", ["exact", "official"])
def test_cross_attention_matches_reference(execution, numerics):
    query_cameras, query_params, _ = geometry(seed=8, views=2, grid=(2, 2))
    key_cameras, key_params, known = geometry(seed=9, views=3, grid=(2, 3))
    encoding = hrope.get_encoding("rayrope", numerics=numerics, depth="known", execution=execution)
    query_params = {**query_params, "known_depth": torch.zeros(B, 8, 3, dtype=torch.float64)}
    key_params = {**key_params, "known_depth": known}
    q = random_qkv(B, 2, 8, HEAD_DIM, seed=10)[0]
    _, k, v = random_qkv(B, 2, 18, HEAD_DIM, seed=11)
    mask = torch.rand(8, 18, generator=torch.Generator().manual_seed(0)) > 0.2
    mask[:, 0] = True
    t = encoding.prepare_cross(
        query_cameras, key_cameras, (2, 2), HEAD_DIM, query_params=query_params, key_params=key_params, key_grid=(2, 3)
    )
    got = hrope.cross_attention(q, k, v, query=t, key=t, attn_mask=mask)
    want = hrope.reference.query_frame_cross_attention(
        q,
        k,
        v,
        encoding=encoding,
        query_cameras=query_cameras,
        key_cameras=key_cameras,
        grid=(2, 2),
        key_grid=(2, 3),
        query_params=query_params,
        key_params=key_params,
        attn_mask=mask,
    )
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-11)


def test_cross_attention_over_the_same_set_is_self_attention():
    cameras, params, _ = geometry(seed=12)
    encoding = hrope.get_encoding("rayrope", numerics="official")
    q, k, v = random_qkv(B, 2, N, HEAD_DIM, seed=13)
    t = encoding.prepare_cross(cameras, cameras, GRID, HEAD_DIM, query_params=params, key_params=params)
    self_attention = encoding.prepare(cameras, GRID, HEAD_DIM, **params).attention(q, k, v)
    torch.testing.assert_close(hrope.cross_attention(q, k, v, query=t, key=t), self_attention, rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------------------------- numerics' properties
def test_official_shortcut_gradient_at_zero_width():
    """At zero width the released shortcut reads the μ - s end, so d/ds = -d/dμ; the exact expectation
    is even in s, so d/ds = 0."""
    cameras, params, _ = geometry(seed=14)
    q, k, v = random_qkv(B, 2, N, HEAD_DIM, seed=15)
    for numerics in ("exact", "official"):
        mu = params["log_depth"].clone().requires_grad_()
        s = torch.zeros_like(mu, requires_grad=True)
        encoding = hrope.get_encoding("rayrope", numerics=numerics)
        out = hrope.multiview_attention(
            q, k, v, encoding=encoding, cameras=cameras, grid=GRID, params={"log_depth": mu, "log_depth_halfwidth": s}
        )
        out.square().sum().backward()
        assert mu.grad.abs().max() > 1e-3
        want = -mu.grad if numerics == "official" else torch.zeros_like(mu)
        torch.testing.assert_close(s.grad, want, rtol=1e-12, atol=1e-12)


def test_clear_errors():
    with pytest.raises(EncodingError, match="numerics must be one of"):
        hrope.get_encoding("rayrope", numerics="released")
    with pytest.raises(EncodingError, match="depth_coordinate must be one of"):
        hrope.get_encoding("rayrope", depth_coordinate="disparity")
    cameras, params, _ = geometry()
    with pytest.raises(EncodingError, match="known_depth"):
        hrope.get_encoding("rayrope", depth="known").prepare(cameras, GRID, HEAD_DIM, **params)
    other = random_cameras(2, V, (16, 24))
    encoding = hrope.get_encoding("rayrope")
    with pytest.raises(EncodingError, match="must agree"):
        encoding.prepare_cross(cameras, other, GRID, HEAD_DIM, query_params=params, key_params=params)
    t = encoding.prepare_cross(cameras, cameras, GRID, HEAD_DIM, query_params=params, key_params=params)
    q = torch.zeros(B, 1, N, HEAD_DIM, dtype=torch.float64)
    with pytest.raises(EncodingError, match="same one as query= and key="):
        hrope.cross_attention(q, q, q, query=t, key=None)
    assert math.isfinite(hrope.cross_attention(q, q, q, query=t, key=t).sum().item())


@settings(max_examples=8, deadline=None)
@given(
    numerics=st.sampled_from(["exact", "official"]),
    depth=st.sampled_from(["predicted", "known", "known+halfwidth"]),
    depth_coordinate=st.sampled_from(["depth", "inverse", "asinh"]),
    rotate_values=st.booleans(),
    seed=st.integers(0, 1000),
)
def test_every_option_set_is_world_frame_invariant(numerics, depth, depth_coordinate, rotate_values, seed):
    """Only relative poses enter: moving the world frame leaves self- and cross-attention unchanged."""
    options = {"numerics": numerics, "depth": depth, "depth_coordinate": depth_coordinate}
    encoding = hrope.get_encoding("rayrope", rotate_values=rotate_values, **options)
    cameras, params, known = geometry(seed=seed)
    if depth != "predicted":
        params = {**params, "known_depth": known}
    q, k, v = random_qkv(B, 2, N, HEAD_DIM, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    G = random_se3(B, generator=gen, dtype=torch.float64)
    results = []
    for frame in (cameras, cameras.transform_world(G)):
        t = encoding.prepare_cross(frame, frame, GRID, HEAD_DIM, query_params=params, key_params=params)
        self_attention = encoding.prepare(frame, GRID, HEAD_DIM, **params).attention(q, k, v)
        results.append((hrope.cross_attention(q, k, v, query=t, key=t), self_attention))
    for got, want in zip(results[1], results[0], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)
