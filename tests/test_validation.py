"""Bad input gets a clear error, or the documented clamped behaviour — never a silent NaN."""

from __future__ import annotations

import pytest
import torch

import hrope
from helpers import (
    encoding_inputs,
    encoding_params,
    random_cameras,
    random_planes,
    random_qkv,
    random_rotation,
    random_se3,
)


def cams_with(K=None, E=None, image_size=(32, 48)):
    base = random_cameras(B=1, V=2, image_size=image_size, seed=0)
    return hrope.Cameras(base.K if K is None else K, base.world_to_cam if E is None else E, image_size)


def test_rotation_tolerance_is_the_documented_boundary():
    """Poses off SO(3) by less than rotation_atol (1e-3 on |R^T R - I| and |det R - 1|) are
    accepted, float32 poses too; a scaled rotation with |det R - 1| = 1.2e-3 is rejected unless
    rotation_atol allows it, or validation is off."""
    base = random_cameras(B=2, V=3, seed=1)
    E = base.world_to_cam.clone()
    E[1, 2, :3, :3] *= 1 + 2e-4  # |R^T R - I| = 4e-4, |det R - 1| = 6e-4
    accepted = hrope.Cameras(base.K, E, base.image_size)
    assert (accepted.batch_size, accepted.num_views) == (2, 3) and torch.equal(accepted.R, E[..., :3, :3])
    hrope.Cameras(base.K.float(), base.world_to_cam.float(), base.image_size)
    E[1, 2, :3, :3] *= (1 + 4e-4) / (1 + 2e-4)  # |det R - 1| = 1.2e-3
    with pytest.raises(hrope.CameraError, match=r"world_to_cam\[b=1, v=2\] is not a rotation"):
        hrope.Cameras(base.K, E, base.image_size)
    hrope.Cameras(base.K, E, base.image_size, rotation_atol=2e-3)
    hrope.Cameras(base.K, E, base.image_size, validate=False)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_camera_names_the_view(bad):
    E = random_cameras(B=1, V=2, seed=0).world_to_cam.clone()
    E[0, 1, 0, 3] = bad
    with pytest.raises(hrope.CameraError, match=r"world_to_cam\[b=0, v=1\].*non-finite"):
        cams_with(E=E)
    K = random_cameras(B=1, V=2, seed=0).K.clone()
    K[0, 0, 0, 2] = bad
    with pytest.raises(hrope.CameraError, match=r"K\[b=0, v=0\].*non-finite"):
        cams_with(K=K)


def test_reflection_is_rejected():
    E = random_cameras(B=1, V=2, seed=0).world_to_cam.clone()
    E[0, 1, :3, 0] *= -1
    with pytest.raises(hrope.CameraError, match=r"\[b=0, v=1\].*reflection"):
        cams_with(E=E)


def test_non_rotation_is_rejected():
    E = random_cameras(B=1, V=2, seed=0).world_to_cam.clone()
    E[0, 0, :3, :3] *= 1.1
    with pytest.raises(hrope.CameraError, match="not a rotation"):
        cams_with(E=E)


@pytest.mark.parametrize("focal", [0.0, -5.0])
def test_zero_or_negative_focal_is_rejected(focal):
    K = random_cameras(B=1, V=2, seed=0).K.clone()
    K[0, 1, 1, 1] = focal
    with pytest.raises(hrope.CameraError, match=r"\[b=0, v=1\].*positive focal"):
        cams_with(K=K)


def test_skew_and_malformed_intrinsics_are_rejected():
    K = random_cameras(B=1, V=2, seed=0).K.clone()
    K[0, 0, 0, 1] = 0.5
    with pytest.raises(hrope.CameraError, match="skew"):
        cams_with(K=K)
    K = random_cameras(B=1, V=2, seed=0).K.clone()
    K[0, 0, 2, 2] = 2.0
    with pytest.raises(hrope.CameraError, match="form"):
        cams_with(K=K)


def test_camera_shape_errors():
    base = random_cameras(B=1, V=2, seed=0)
    with pytest.raises(hrope.CameraError, match=r"K must have shape \(B, V, 3, 3\)"):
        hrope.Cameras(base.K[0], base.world_to_cam, (32, 48))
    with pytest.raises(hrope.CameraError, match="world_to_cam must have shape"):
        hrope.Cameras(base.K, base.world_to_cam[..., :3, :], (32, 48))
    with pytest.raises(hrope.CameraError, match=r"\(B, V\)"):
        hrope.Cameras(base.K, base.world_to_cam[:, :1], (32, 48))
    with pytest.raises(hrope.CameraError, match="image_size"):
        hrope.Cameras(base.K, base.world_to_cam, (0, 48))
    bottom = base.world_to_cam.clone()
    bottom[0, 0, 3, 0] = 1.0
    with pytest.raises(hrope.CameraError, match="bottom row"):
        hrope.Cameras(base.K, bottom, (32, 48))


def test_tensor_shape_errors_name_the_argument_and_its_dims():
    """The messages docs/errors.md quotes, word for word (hrope.shapes.check_shapes writes them)."""
    base = random_cameras(B=1, V=2, seed=0)
    cases = [
        (
            lambda: hrope.Cameras(base.K, base.world_to_cam[..., :3, :], (32, 48)),
            hrope.CameraError,
            "world_to_cam must have shape (B, V, 4, 4), got (1, 2, 3, 4)",
        ),
        (
            lambda: hrope.Cameras(base.K, base.world_to_cam[:, :1], (32, 48)),
            hrope.CameraError,
            "K has (B, V) = (1, 2) but world_to_cam has (1, 1)",
        ),
        (
            lambda: hrope.Planes(torch.ones(1, 8, 3), torch.ones(1, 7)),
            hrope.PlaneError,
            "normal has (B, N) = (1, 8) but depth has (1, 7)",
        ),
        (
            lambda: hrope.Planes.from_depth(torch.ones(1, 2, 30, 48), base, 2),
            hrope.PlaneError,
            "depth must have shape (1, 2, 32, 48) (the cameras' B, V and image size), got (1, 2, 30, 48)",
        ),
    ]
    for call, error, expected in cases:
        with pytest.raises(error) as info:
            call()
        assert str(info.value) == expected


def test_qkv_shape_errors():
    cameras = random_cameras(B=1, V=2, seed=0)
    q, k, v = random_qkv(1, 2, 8, 16)
    attend = lambda q, k, v, **kw: hrope.multiview_attention(  # noqa: E731
        q,
        k,
        v,
        encoding=kw.pop("encoding", "prope"),
        cameras=kw.pop("cameras", cameras),
        grid=kw.pop("grid", (2, 2)),
        **kw,
    )
    with pytest.raises(hrope.EncodingError, match="one shape"):
        attend(q, k[:, :, :6], v)
    with pytest.raises(hrope.EncodingError, match="N = 8 tokens"):
        attend(q, k, v, grid=(2, 3))
    with pytest.raises(hrope.EncodingError, match="batch"):
        attend(q, k, v, cameras=random_cameras(B=2, V=2))
    with pytest.raises(hrope.EncodingError, match="one shape"):
        attend(q[0], k[0], v[0])
    with pytest.raises(hrope.EncodingError, match="unknown encoding 'prope2'"):
        attend(q, k, v, encoding="prope2")
    with pytest.raises(hrope.EncodingError, match="hrope.Cameras"):
        attend(q, k, v, cameras=cameras.K)


def test_encoding_parameter_errors():
    cameras = random_cameras(B=1, V=2, seed=0)
    q, k, v = random_qkv(1, 2, 8, 16)
    attend = lambda name, **kw: hrope.multiview_attention(  # noqa: E731
        q, k, v, encoding=name, cameras=cameras, grid=(2, 2), **kw
    )
    with pytest.raises(hrope.EncodingError, match="needs planes"):
        attend("hrope")
    with pytest.raises(hrope.EncodingError, match=r"needs params \['depth'\]"):
        attend("hrope-depth")
    with pytest.raises(hrope.EncodingError, match="unknown params"):
        attend("prope", params={"depth": torch.ones(1, 8)})
    with pytest.raises(hrope.PlaneError, match=r"\(B, N\) = \(1, 6\)"):
        attend("hrope-lift", planes=random_planes(1, 6))
    with pytest.raises(hrope.EncodingError, match="rotation must have shape"):
        attend("hrope-so3", params={"rotation": random_rotation(1, 7)})
    with pytest.raises(hrope.EncodingError, match="proper rotations"):
        attend("hrope-so3", params={"rotation": -random_rotation(1, 8)})
    with pytest.raises(hrope.EncodingError, match="singular"):
        attend("hrope-full", params={"transform": torch.zeros(1, 8, 4, 4, dtype=torch.float64)})
    bad = encoding_params("hrope-depth", 1, 8)
    bad["depth"][0, 3] = float("nan")
    with pytest.raises(hrope.EncodingError, match="finite"):
        attend("hrope-depth", params=bad)
    with pytest.raises(hrope.EncodingError, match="bottom row"):
        G = encoding_params("hrope-se3", 1, 8)["transform"].clone()
        G[..., 3, 0] = 1
        attend("hrope-se3", params={"transform": G})


def test_plane_errors_and_documented_normalisation():
    with pytest.raises(hrope.PlaneError, match="positive"):
        hrope.Planes(torch.randn(1, 4, 3), torch.zeros(1, 4))
    with pytest.raises(hrope.PlaneError, match="finite"):
        hrope.Planes(torch.full((1, 4, 3), float("nan")), torch.ones(1, 4))
    with pytest.raises(hrope.PlaneError, match="zero length"):
        hrope.Planes(torch.zeros(1, 4, 3), torch.ones(1, 4))
    with pytest.raises(hrope.PlaneError, match="shape"):
        hrope.Planes(torch.randn(1, 4, 2), torch.ones(1, 4))
    with pytest.raises(hrope.PlaneError, match="finite"):
        hrope.Planes.from_m(torch.full((1, 4, 3), float("inf")))
    # non-unit normals are rescaled: the same plane as the unit normal
    cameras = random_cameras(B=1, V=1, seed=0)
    n = torch.tensor([[[0.1, 0.2, -1.0]]], dtype=torch.float64).repeat(1, 4, 1)
    a = hrope.Planes(n, torch.full((1, 4), 2.0, dtype=torch.float64)).m(cameras, (2, 2))
    b = hrope.Planes(5 * n, torch.full((1, 4), 2.0, dtype=torch.float64)).m(cameras, (2, 2))
    torch.testing.assert_close(a, b)


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_hrope_depth_rejects_non_positive_and_non_finite_depths(bad):
    cameras = random_cameras(B=1, V=2, seed=0)
    params = encoding_params("hrope-depth", 1, 8)
    params["depth"][0, 5] = bad
    match = "depth must be positive" if bad == bad and abs(bad) != float("inf") else "depth must be finite"
    with pytest.raises(hrope.EncodingError, match=match):
        hrope.get_encoding("hrope-depth").prepare(cameras, (2, 2), 16, **params)


# --------------------------------------------------------------------------- prepared transforms
def prepared(name, B=1, head_dim=48):
    cameras = random_cameras(B=B, V=2, seed=0)
    inputs = encoding_inputs(name, cameras, (2, 2))
    return hrope.get_encoding(name).prepare(cameras, (2, 2), head_dim, planes=inputs["planes"], **inputs["params"])


@pytest.mark.parametrize("name", list(hrope.ENCODINGS))
def test_prepared_transform_rejects_another_batch_token_count_or_device(name):
    """A transform prepared for batch 1 is never broadcast over batch 3: a one-line error names the
    prepared and the given shapes; so for another token count or head_dim, and another device."""
    transform = prepared(name)
    q, k, v = random_qkv(3, 2, 8, 48)
    with pytest.raises(hrope.EncodingError, match=r"expected \(1, heads, 8, 48\) .*got \(3, 2, 8, 48\)") as info:
        transform.attention(q, k, v)
    assert "\n" not in str(info.value)
    apply = transform.apply_q
    with pytest.raises(hrope.EncodingError, match=r"expected \(1, heads, 8, 48\) .*got \(1, 2, 6, 48\)"):
        apply(q[:1, :, :6])
    with pytest.raises(hrope.EncodingError, match=r"expected \(1, heads, 8, 48\) .*got \(1, 2, 8, 32\)"):
        apply(q[:1, ..., :32])
    with pytest.raises(hrope.EncodingError, match="prepared on cpu, applied to a tensor on meta"):
        apply(torch.empty(1, 2, 8, 48, device="meta"))
    with pytest.raises(hrope.EncodingError, match="floating-point"):
        apply(torch.ones(1, 2, 8, 48, dtype=torch.int64))


@pytest.mark.parametrize("name", ["prope", "hrope-lift", "worldrope"])
def test_prepared_transform_computes_in_the_inputs_dtype(name):
    """The compute dtype is q's: one float32-prepared transform serves bf16 and float64 inputs (and
    autocast, which the model uses), each output in its input's dtype."""
    transform = prepared(name)
    q, k, v = random_qkv(1, 2, 8, 48, dtype=torch.float32)
    expected = transform.attention(q, k, v)
    # tol on |out - f32| / (1 + |f32|): measured worst 0.015 (bf16, worldrope: two bf16 ulp), 3.5e-7
    # (float64 against float32, prope: three float32 ulp); 7x and 10x margins
    for dtype, tol in ((torch.bfloat16, 0.1), (torch.float64, 3e-6)):
        out = transform.attention(q.to(dtype), k.to(dtype), v.to(dtype))
        assert out.dtype == dtype
        torch.testing.assert_close(out.float(), expected, rtol=tol, atol=tol)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.isfinite(transform.attention(q, k, v)).all()


def test_query_frame_params_of_the_wrong_shape_fail_at_prepare():
    cameras = random_cameras(B=1, V=2, seed=0)
    cases = [
        ("rayrope", "log_depth", torch.zeros(1, 8, 1), r"log_depth must have shape \(1, 8\), got \(1, 8, 1\)"),
        ("rayrope", "log_depth_halfwidth", 0.5, r"log_depth_halfwidth must be a tensor of shape \(1, 8\), got float"),
        ("worldrope", "depth_sigma", torch.ones(1, 8), r"depth_sigma must have shape \(1, 8, 2\), got \(1, 8\)"),
        ("worldrope", "depth", torch.ones(1, 8, 2), r"depth must have shape \(1, 8\), got \(1, 8, 2\)"),
        ("worldrope", "depth", torch.empty(1, 8, device="meta"), "depth is on meta but the cameras are on cpu"),
    ]
    for name, param, value, match in cases:
        params = {**encoding_params(name, 1, 8), param: value}
        with pytest.raises(hrope.EncodingError, match=match):
            hrope.get_encoding(name).prepare(cameras, (2, 2), 48, **params)


def test_transform_world_rejects_non_finite_and_non_rigid_matrices():
    cameras = random_cameras(B=2, V=2, seed=0)
    G = random_se3(2, generator=torch.Generator().manual_seed(1))
    moved = cameras.transform_world(G)
    torch.testing.assert_close(moved.world_to_cam, cameras.world_to_cam @ G[:, None], rtol=0, atol=0)
    nan, reflection, scaled, sheared = (G.clone() for _ in range(4))
    nan[1, 0, 3] = float("nan")
    reflection[1, :3, 0] *= -1
    scaled[0, :3, :3] *= 1.01
    sheared[0, 3, 0] = 0.5
    cases = {
        r"world_from_new\[b=1\] has a non-finite entry": nan,
        r"world_from_new\[b=1\] has a reflection": reflection,
        r"world_from_new\[b=0\] is not a rotation": scaled,
        r"world_from_new\[b=0\] must have bottom row": sheared,
        r"world_from_new has a reflection": torch.diag(torch.tensor([-1.0, 1.0, 1.0, 1.0])),
        r"world_from_new must have shape \(4, 4\) or \(2, 4, 4\), got \(3, 4, 4\)": random_se3(3),
        r"world_from_new must have shape \(4, 4\) or \(2, 4, 4\), got \(4, 3\)": G[0, :, :3],
    }
    for match, bad in cases.items():
        with pytest.raises(hrope.CameraError, match=match):
            cameras.transform_world(bad)
    cameras.transform_world(scaled, validate=False)  # as the constructor: validate=False skips the data checks
    cameras.transform_world(scaled, rotation_atol=0.05)
