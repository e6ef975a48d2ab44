"""The library API under bad input: every mistake is an ``hrope.InputError`` subclass naming the
argument, checked once when cameras, planes and transforms are built, never a NaN output; applying
a prepared transform reads no tensor value (no device sync), and the value checks step aside while
``torch.compile`` traces."""

from __future__ import annotations

from unittest import mock

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import hrope
from hrope import CameraError, Cameras, EncodingError, PlaneError, Planes
from hrope.cameras import FOCAL_RANGE, MAX_PRINCIPAL_OFFSET, MAX_TRANSLATION
from hrope.testing import encoding_inputs, random_cameras, random_planes

B, V, GRID, HEAD_DIM = 1, 2, (2, 2), 48
N = V * GRID[0] * GRID[1]
SIZE = (32, 32)


def cameras(dtype=torch.float32, focal=None, centre=None, translation=None) -> Cameras:
    """Random cameras, with the focal lengths, principal point and translation optionally set (in
    image sizes and scene units)."""
    base = random_cameras(B, V, SIZE, dtype=dtype)
    K, E = base.K.clone(), base.world_to_cam.clone()
    if focal is not None:  # fy a factor 2 inside the range: non-square pixels
        K[..., 0, 0], K[..., 1, 1] = focal * SIZE[1], focal * SIZE[0] * 2 ** (-1 if focal > 1 else 1)
    if centre is not None:
        K[..., 0, 2], K[..., 1, 2] = centre * SIZE[1], -centre * SIZE[0]
    if translation is not None:
        E[..., :3, 3] = translation * torch.tensor([1.0, -0.6, 0.0], dtype=dtype)
    return Cameras(K, E, SIZE)


def attend(name: str, cams: Cameras, q: torch.Tensor, **inputs) -> torch.Tensor:
    inputs = inputs or encoding_inputs(name, cams, GRID, dtype=cams.K.dtype)
    return hrope.multiview_attention(q, q, q, encoding=name, cameras=cams, grid=GRID, **inputs)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"focal": FOCAL_RANGE[0] / 2},
            r"K\[b=0, v=0\] has focal lengths fx / W = 5e-05, .*outside \[0\.0001, 1e\+06\]",
        ),
        ({"focal": FOCAL_RANGE[1] * 4}, r"K\[b=0, v=0\] has focal lengths fx / W = 4e\+06"),
        ({"centre": MAX_PRINCIPAL_OFFSET * 2}, r"K\[b=0, v=0\] has its principal point 2e\+04 image sizes off"),
        ({"translation": MAX_TRANSLATION * 2}, r"world_to_cam\[b=0, v=0\] has a translation of 2e\+10, beyond 1e\+10"),
    ],
)
def test_cameras_beyond_the_finite_range_are_one_line_camera_errors(values, message):
    with pytest.raises(CameraError, match=message) as error:
        cameras(**values)
    assert "\n" not in str(error.value)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_every_encoding_is_finite_at_the_corners_of_the_accepted_range(dtype):
    """Focal lengths, principal points and translations at their bounds together (the combination
    that comes closest to overflowing; 1e-5 image sizes with the other two at 1e6 and 1e10 gave NaN
    in hrope-full): finite outputs and gradients for every encoding."""
    low, high = FOCAL_RANGE
    q = torch.randn(B, 2, N, HEAD_DIM, dtype=dtype, requires_grad=True)
    for focal in (low, high):
        for centre in (MAX_PRINCIPAL_OFFSET, -MAX_PRINCIPAL_OFFSET):
            cams = cameras(dtype, focal, centre, MAX_TRANSLATION)
            for name in hrope.ENCODINGS:
                out = attend(name, cams, q)
                (grad,) = torch.autograd.grad(out.sum(), q)
                assert torch.isfinite(out).all() and torch.isfinite(grad).all(), (name, focal, centre)


def test_devices_dtypes_and_types_are_named():
    cams = cameras()
    q = torch.randn(B, 2, N, HEAD_DIM)
    planes = random_planes(B, N, dtype=torch.float32)
    with pytest.raises(CameraError, match=r"K is on cpu but world_to_cam is on meta; put them on one device"):
        Cameras(cams.K, cams.world_to_cam.to("meta"), SIZE)
    on_meta = cams.to("meta")
    with pytest.raises(PlaneError, match=r"planes are on cpu but the cameras are on meta"):
        hrope.get_encoding("hrope").prepare(on_meta, GRID, HEAD_DIM, planes=planes)
    with pytest.raises(EncodingError, match=r"planes must be hrope\.Planes .*, got Tensor"):
        hrope.get_encoding("hrope").prepare(cams, GRID, HEAD_DIM, planes=torch.zeros(B, N, 3))
    with pytest.raises(PlaneError, match=r"m must be a floating-point tensor, got torch\.int64"):
        Planes.from_m(torch.ones(B, N, 3, dtype=torch.int64))
    with pytest.raises(PlaneError, match=r"depth must be a floating-point tensor, got torch\.int64"):
        Planes(torch.ones(B, N, 3), torch.ones(B, N, dtype=torch.int64))
    with pytest.raises(PlaneError, match=r"normal is on cpu but depth is on meta"):
        Planes(torch.ones(B, N, 3), torch.ones(B, N, device="meta"))
    with pytest.raises(EncodingError, match=r"depth must be a floating-point tensor, got torch\.int64"):
        attend("hrope-depth", cams, q, params={"depth": torch.ones(B, N, dtype=torch.int64)})
    with pytest.raises(EncodingError, match=r"q, k, v must share one dtype and device; got torch\.float64 on cpu"):
        hrope.multiview_attention(q.double(), q, q, encoding="prope", cameras=cams, grid=GRID)
    # mixed floating dtypes of K, world_to_cam and planes are accepted: each is cast for the geometry
    mixed = Cameras(cams.K.double(), cams.world_to_cam.half().float(), SIZE)
    same = Cameras(cams.K, cams.world_to_cam.half().float(), SIZE)
    torch.testing.assert_close(attend("hrope", mixed, q, planes=planes), attend("hrope", same, q, planes=planes))


def test_non_finite_planes_and_per_token_parameters_are_named_never_a_nan_output():
    cams = cameras()
    q = torch.randn(B, 2, N, HEAD_DIM)
    nan = torch.full((B, N), float("nan"))
    with pytest.raises(PlaneError, match=r"normal and depth must be finite"):
        Planes(torch.ones(B, N, 3), nan)
    with pytest.raises(PlaneError, match=r"m must be finite"):
        Planes.from_m(torch.full((B, N, 3), float("inf")))
    for name in hrope.ENCODINGS:
        params = encoding_inputs(name, cams, GRID, dtype=torch.float32)["params"]
        for key, value in params.items():
            bad = value.clone()
            bad[(0,) * bad.ndim] = float("nan")
            with pytest.raises(EncodingError, match=rf"^{key} must be finite in torch\.float32"):
                attend(name, cams, q, planes=random_planes(B, N, dtype=torch.float32), params={**params, key: bad})


class DeviceSyncs(TorchDispatchMode):
    """Counts the ops that read a tensor value back to the host (``bool(t)``, ``t.item()``,
    ``float(t)``: a device sync on a GPU)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func is torch.ops.aten._local_scalar_dense.default or func is torch.ops.aten.is_nonzero.default
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("name", list(hrope.ENCODINGS))
def test_checks_read_values_once_at_prepare_and_never_per_attention_call(name):
    cams = cameras()
    q = torch.randn(B, 2, N, HEAD_DIM)
    inputs = encoding_inputs(name, cams, GRID, dtype=torch.float32)
    prepared = hrope.get_encoding(name).prepare(cams, GRID, HEAD_DIM, planes=inputs["planes"], **inputs["params"])
    with DeviceSyncs() as syncs:
        prepared.attention(q, q, q)
        prepared.attention(q, q, q)
    assert syncs.count == 0
    with mock.patch("torch.compiler.is_compiling", return_value=True), DeviceSyncs() as syncs:
        Cameras(cams.K, cams.world_to_cam, SIZE)
        planes = random_planes(B, N, dtype=torch.float32) if inputs["planes"] is not None else None
        hrope.get_encoding(name).prepare(cams, GRID, HEAD_DIM, planes=planes, **inputs["params"])
    assert syncs.count == 0  # while torch.compile traces: no value check, no graph break


def test_shape_checks_still_run_while_compiling():
    cams = cameras()
    with mock.patch("torch.compiler.is_compiling", return_value=True):
        Cameras(cams.K, cams.world_to_cam * float("nan"), SIZE)  # the value check steps aside
        with pytest.raises(CameraError, match=r"world_to_cam must have shape \(B, V, 4, 4\)"):
            Cameras(cams.K, cams.world_to_cam[..., :3, :], SIZE)
        with pytest.raises(PlaneError, match=r"m must have shape \(B, N, 3\)"):
            Planes.from_m(torch.zeros(B, N))


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:Dynamo detected a call to a `functools.lru_cache`")  # the cached tables
def test_cameras_and_prepare_compile_without_graph_breaks():
    cams = cameras()
    q = torch.randn(B, 2, N, HEAD_DIM)
    depth = encoding_inputs("hrope-depth", cams, GRID, dtype=torch.float32)["params"]["depth"]

    def layer(K, world_to_cam, q, depth):
        built = Cameras(K, world_to_cam, SIZE)
        return hrope.multiview_attention(
            q, q, q, encoding="hrope-depth", cameras=built, grid=GRID, params={"depth": depth}
        )

    compiled = torch.compile(layer, fullgraph=True, backend="eager")
    torch.testing.assert_close(
        compiled(cams.K, cams.world_to_cam, q, depth), layer(cams.K, cams.world_to_cam, q, depth)
    )
