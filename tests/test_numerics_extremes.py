"""Numerics at the extremes: the clamp policy (docs/encodings.md, "Clamp policy") keeps every
registered encoding finite, with finite gradients, for extreme cameras and token inputs; at and
beyond the bounds the fast path still equals the float64 reference; low-precision cameras validate."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import hrope
import hrope.reference
from helpers import encoding_params, random_cameras, random_planes, random_qkv
from hrope.encodings import HRoPE
from hrope.geometry import patch_rays
from hrope.planes import MAX_DEPTH, MAX_INVERSE_DISTANCE, MIN_DEPTH, clamp_plane_vectors

GRID = (2, 2)
V, HEADS, HEAD_DIM = 2, 2, 48
N = V * GRID[0] * GRID[1]

# every registered encoding, and hrope with per-patch poses (its only per-token params)
ENCODINGS = {**{name: name for name in hrope.ENCODINGS}, "hrope-per-patch": "hrope-per-patch"}


def encoding(name: str) -> hrope.Encoding:
    return HRoPE(pose="per-patch") if name == "hrope-per-patch" else hrope.get_encoding(name)


def cameras_at(extreme: str, dtype=torch.float32) -> hrope.Cameras:
    """Random cameras pushed to one documented extreme."""
    base = random_cameras(B=1, V=V, seed=21)
    K, E = base.K.clone(), base.world_to_cam.clone()
    H, W = base.image_size
    if extreme == "tiny-focal":  # focal lengths 1e-3 x the image size: ~180 degree field of view
        K[..., :2, :2] *= 1e-3
    elif extreme == "huge-focal":  # 1e4 x the image size
        K[..., :2, :2] *= 1e4
    elif extreme == "off-centre":  # principal points 10 image sizes outside the image
        K[..., 0, 2] += 10 * W
        K[..., 1, 2] -= 10 * H
    elif extreme == "far":  # camera translations 1e3 scene units
        E[..., :3, 3] *= 1e3
    return hrope.Cameras(K.to(dtype), E.to(dtype), base.image_size)


def rays(cameras: hrope.Cameras) -> torch.Tensor:
    """Unit patch-centre rays ``(1, N, 3)``."""
    r = patch_rays(cameras.normalized_K(), GRID).flatten(1, 2)
    return r / r.norm(dim=-1, keepdim=True)


def plane_leaves(extreme: str, cameras: hrope.Cameras) -> tuple[torch.Tensor, ...]:
    """The leaf tensors of the planes at ``extreme``: (normal, depth) for ``Planes(normal, depth)`` or
    (m,) for ``Planes.from_m``; every plane crosses its patch-centre ray in front of the camera."""
    planes = random_planes(1, N, seed=21, dtype=torch.float32)
    normal, depth = planes.normal, planes.depth
    if extreme == "near":
        depth = torch.full_like(depth, 1e-6)
    elif extreme == "far":
        depth = torch.full_like(depth, 1e30)
    elif extreme == "grazing":  # normals 0.006 degrees from perpendicular to the ray, very near
        r = rays(cameras)
        side = torch.linalg.cross(r, torch.tensor([0.0, 1.0, 0.0]).expand_as(r))
        normal = side / side.norm(dim=-1, keepdim=True) - 1e-4 * r
        depth = torch.full_like(depth, 1e-6)
    elif extreme == "huge-m":  # |m| = 1e30: planes 1e-30 scene units away, facing the camera
        return (1e30 * rays(cameras),)
    return normal, depth


def param_leaves(name: str, extreme: str) -> dict[str, torch.Tensor]:
    """The encoding's per-token params with every length at ``extreme`` ("near" or "far"; others
    keep the random valid values)."""
    params = encoding_params(name if name != "hrope-per-patch" else "hrope", 1, N, seed=21, dtype=torch.float32)
    if name == "hrope-per-patch":
        params = {
            "patch_rotation": torch.eye(3).expand(1, N, 3, 3).clone(),
            "patch_translation": 0.3 * torch.randn(1, N, 3, generator=torch.Generator().manual_seed(21)),
        }
    tiny, huge = extreme == "near", extreme == "far"
    lengths = {
        "depth": 1e-6 if tiny else 1e30,
        "log_depth": -50.0 if tiny else 1e30,
        "log_depth_halfwidth": 0.0 if tiny else 1e30,
        "depth_split": 0.0 if tiny else 1e30,
        "depth_sigma": 0.0 if tiny else 1e30,
    }
    for key in params:
        if (tiny or huge) and key in lengths:
            params[key] = torch.full_like(params[key], lengths[key])
        elif huge and key == "transform":  # translations 1e3 scene units
            params[key][..., :3, 3] = 1e3
        elif huge and key == "patch_translation":
            params[key] = torch.full_like(params[key], 1e3)
    return params


CASES = [
    ("near", "normal"),
    ("far", "normal"),
    ("grazing", "normal"),
    ("huge-m", "normal"),
    ("normal", "tiny-focal"),
    ("normal", "huge-focal"),
    ("normal", "off-centre"),
    ("far", "far"),
    ("near", "far"),
    ("grazing", "far"),
]
PLANE_ONLY = ("grazing", "huge-m")


def extreme_cases():
    """(encoding, token extreme, camera extreme): token extremes only for encodings with those inputs."""
    for name in ENCODINGS:
        enc = encoding(name)
        for tokens, camera in CASES:
            if tokens == "normal" or (enc.needs_planes if tokens in PLANE_ONLY else enc.takes_token_inputs()):
                yield pytest.param(name, tokens, camera, id=f"{name}-{tokens}-tokens-{camera}-cameras")


@pytest.mark.parametrize("name,tokens,camera", list(extreme_cases()))
def test_every_encoding_is_finite_with_finite_gradients_at_the_extremes(name, tokens, camera):
    """float32: outputs and the gradients of their sum of squares w.r.t. q, k, v and every token
    input (plane normals and depths or m, per-token params) are finite."""
    enc = encoding(name)
    cameras = cameras_at(camera)
    leaves = []
    planes = None
    if enc.needs_planes:
        plane_inputs = [x.clone().requires_grad_() for x in plane_leaves(tokens, cameras)]
        planes = hrope.Planes(*plane_inputs) if len(plane_inputs) == 2 else hrope.Planes.from_m(*plane_inputs)
        leaves += plane_inputs
    params = {key: x.clone().requires_grad_() for key, x in param_leaves(name, tokens).items()}
    leaves += params.values()
    q, k, v = (x.float().requires_grad_() for x in random_qkv(1, HEADS, N, HEAD_DIM, seed=21))
    out = hrope.multiview_attention(q, k, v, encoding=enc, cameras=cameras, grid=GRID, planes=planes, params=params)
    assert torch.isfinite(out).all()
    out.square().sum().backward()  # squared outputs, as an MSE loss sees them
    for x in (q, k, v, *leaves):
        assert x.grad is not None and torch.isfinite(x.grad).all()


# ----------------------------------------------------------------------------- the clamp boundary
def fronto_planes(cameras, z: float) -> hrope.Planes:
    """Planes perpendicular to each patch-centre ray, crossing it at z-depth ``z`` (m·r̂ = 1/z)."""
    r = patch_rays(cameras.normalized_K(), GRID).flatten(1, 2)
    return hrope.Planes.from_m(r / ((r * r).sum(-1, keepdim=True) * z))


def planes_with_norm(cameras, norm: float) -> hrope.Planes:
    """Random camera-facing planes rescaled to ``|m| = norm``."""
    m = random_planes(1, N, seed=22).m(cameras, GRID)
    return hrope.Planes.from_m(norm * m / m.norm(dim=-1, keepdim=True))


def full(value: float, *trailing: int) -> torch.Tensor:
    return torch.full((1, N, *trailing), value, dtype=torch.float64)


def boundary_inputs(kind: str, value: float, cameras) -> tuple[hrope.Planes | None, dict | None]:
    """(planes, params) with one clamped quantity set to ``value``."""
    if kind == "|m|":
        return planes_with_norm(cameras, value), None
    if kind == "Planes depth":
        return hrope.Planes(random_planes(1, N, seed=22).normal, full(value)), None
    if kind == "ray crossing":
        return fronto_planes(cameras, value), None
    if kind == "depth":
        return None, {"depth": full(value)}
    return None, {"depth": full(value), "depth_split": full(0.0), "depth_sigma": full(value, 2)}  # worldrope


# z-depths at the depth bounds and a factor 100 beyond them
DEPTHS = (MIN_DEPTH, MIN_DEPTH / 100, MAX_DEPTH, MAX_DEPTH * 100)
BOUNDARY = [
    *[("hrope-lift", "|m|", n) for n in (MAX_INVERSE_DISTANCE, 1e3, 1e30)],
    *[("hrope", "|m|", n) for n in (MAX_INVERSE_DISTANCE, 1e3)],
    ("hrope-lift", "Planes depth", MIN_DEPTH / 10),
    *[("hrope-pf", "ray crossing", z) for z in DEPTHS],
    *[("hrope-depth", "depth", z) for z in DEPTHS],
    *[("worldrope", "depth and sigma", z) for z in DEPTHS],
]


@pytest.mark.parametrize("name,kind,value", BOUNDARY, ids=[f"{n}-{k}={v:g}" for n, k, v in BOUNDARY])
def test_fast_path_equals_the_reference_at_and_beyond_the_clamp_bounds(name, kind, value):
    cameras = random_cameras(B=1, V=V, seed=22)
    planes, params = boundary_inputs(kind, value, cameras)
    q, k, v = random_qkv(1, HEADS, N, HEAD_DIM, seed=22)
    kwargs = dict(encoding=name, cameras=cameras, grid=GRID, planes=planes, params=params)
    fast, ref = hrope.multiview_attention(q, k, v, **kwargs), hrope.reference.multiview_attention(q, k, v, **kwargs)
    assert torch.isfinite(ref).all()
    torch.testing.assert_close(fast, ref, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize(
    "name,beyond,bound",
    [
        ("hrope-lift", lambda c: planes_with_norm(c, 1e6), lambda c: planes_with_norm(c, MAX_INVERSE_DISTANCE)),
        ("hrope-pf", lambda c: fronto_planes(c, 1e-5), lambda c: fronto_planes(c, MIN_DEPTH)),
        ("hrope-pf", lambda c: fronto_planes(c, 1e5), lambda c: fronto_planes(c, MAX_DEPTH)),
    ],
    ids=["hrope-lift-near-plane", "hrope-pf-near-point", "hrope-pf-far-point"],
)
def test_planes_beyond_a_bound_act_as_the_bound(name, beyond, bound):
    """A plane nearer than MIN_DEPTH (or crossing its ray beyond MAX_DEPTH) gives the output of the
    same plane at the bound, which differs from an ordinary plane's."""
    cameras = random_cameras(B=1, V=V, seed=23)
    q, k, v = random_qkv(1, HEADS, N, HEAD_DIM, seed=23)

    def attend(planes):
        return hrope.multiview_attention(q, k, v, encoding=name, cameras=cameras, grid=GRID, planes=planes)

    out = attend(beyond(cameras))
    torch.testing.assert_close(out, attend(bound(cameras)), rtol=1e-12, atol=1e-12)
    assert (out - attend(planes_with_norm(cameras, 1.0))).abs().max() > 1e-3


@pytest.mark.parametrize(
    "name,param,beyond,bound,inside",
    [
        ("hrope-depth", "depth", 1e-5, MIN_DEPTH, 2 * MIN_DEPTH),
        ("hrope-depth", "depth", 1e5, MAX_DEPTH, MAX_DEPTH / 2),
        ("worldrope", "depth", 1e5, MAX_DEPTH, MAX_DEPTH / 2),
        ("worldrope", "depth_sigma", -1e5, MAX_DEPTH, MAX_DEPTH / 2),
    ],
)
def test_depths_beyond_a_bound_act_as_the_bound(name, param, beyond, bound, inside):
    """Exactly the bound's output (worldrope with split 0, so its near and far depths are the depth)."""
    cameras = random_cameras(B=1, V=V, seed=24)
    q, k, v = random_qkv(1, HEADS, N, HEAD_DIM, seed=24)
    params = encoding_params(name, 1, N, seed=24)
    if "depth_split" in params:
        params["depth_split"] = torch.zeros_like(params["depth_split"])

    def attend(value):
        return hrope.multiview_attention(
            q,
            k,
            v,
            encoding=name,
            cameras=cameras,
            grid=GRID,
            params={**params, param: torch.full_like(params[param], value)},
        )

    torch.testing.assert_close(attend(beyond), attend(bound), rtol=0, atol=0)
    assert (attend(bound) - attend(inside)).abs().max() > 1e-6  # the output still depends on the value there


@settings(max_examples=30, deadline=None)
@given(log_norm=st.floats(-30, 30), seed=st.integers(0, 1000))
def test_plane_clamp_keeps_direction_and_bounds_the_norm(log_norm, seed):
    """Any finite |m| (1e-30 to 1e30, float32): |m| <= MAX_INVERSE_DISTANCE afterwards, the direction
    kept, and m unchanged inside the bound."""
    direction = torch.randn(4, 3, generator=torch.Generator().manual_seed(seed))
    direction = direction / direction.norm(dim=-1, keepdim=True)
    m = (10.0**log_norm) * direction
    clamped = clamp_plane_vectors(m)
    norm = clamped.norm(dim=-1)
    assert torch.isfinite(clamped).all() and (norm <= MAX_INVERSE_DISTANCE * (1 + 1e-6)).all()
    if 10.0**log_norm < 0.999 * MAX_INVERSE_DISTANCE:  # clear of the bound's float32 round-off
        assert torch.equal(clamped, m)
    elif 10.0**log_norm > 1.001 * MAX_INVERSE_DISTANCE:
        torch.testing.assert_close(clamped, MAX_INVERSE_DISTANCE * direction, rtol=1e-6, atol=0)  # measured 3.6e-7


# ----------------------------------------------------------------------------- low-precision cameras
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_cameras_validate_and_encode_like_their_float32_values(dtype):
    """bf16 / fp16 poses are rounded off SO(3) by up to ~0.9 eps: Cameras accepts them, keeps the
    dtype, and every encoding gives exactly what float32 cameras with the same values give."""
    base = random_cameras(B=2, V=3, seed=25)
    low = hrope.Cameras(base.K.to(dtype), base.world_to_cam.to(dtype), base.image_size)
    assert low.K.dtype == low.world_to_cam.dtype == dtype
    same = hrope.Cameras(low.K.float(), low.world_to_cam.float(), base.image_size, validate=False)  # off SO(3) in f32
    q, k, v = random_qkv(2, 2, 3 * 4, 48, seed=25, dtype=torch.float32)

    def attend(cams, name, planes):
        return hrope.multiview_attention(q, k, v, encoding=name, cameras=cams, grid=GRID, planes=planes)

    for name in ("prope", "hrope-lift", "urope"):
        planes = random_planes(2, 12, seed=25) if hrope.ENCODINGS[name].needs_planes else None
        torch.testing.assert_close(attend(low, name, planes), attend(same, name, planes), rtol=0, atol=0)
    E = base.world_to_cam.clone()
    E[0, 1, :3, :3] *= 1.1
    with pytest.raises(hrope.CameraError, match=r"world_to_cam\[b=0, v=1\] is not a rotation"):
        hrope.Cameras(base.K.to(dtype), E.to(dtype), base.image_size)
    E = base.world_to_cam.clone()
    E[1, 2, :3, 0] *= -1
    with pytest.raises(hrope.CameraError, match=r"world_to_cam\[b=1, v=2\] has a reflection"):
        hrope.Cameras(base.K.to(dtype), E.to(dtype), base.image_size)
