"""Dtypes (fp32 geometry, cast to q's dtype; bf16/fp16 with and without autocast) and gradients."""

from __future__ import annotations

import pytest
import torch

import hrope
import hrope.reference
from helpers import RELATIVE, encoding_inputs, random_cameras, random_qkv

GRID = (2, 2)


def reference_output(name, cameras, q, k, v, inputs):
    return hrope.reference.multiview_attention(
        q.double(), k.double(), v.double(), encoding=name, cameras=cameras, grid=GRID, **inputs
    )


@pytest.mark.parametrize("name", RELATIVE)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_low_precision_without_autocast(name, dtype):
    cameras = random_cameras(B=1, V=2, seed=0, dtype=torch.float32)
    inputs = encoding_inputs(name, cameras, GRID, dtype=torch.float32)
    q, k, v = (x.to(dtype) for x in random_qkv(1, 2, 8, 32))
    out = hrope.multiview_attention(q, k, v, encoding=name, cameras=cameras, grid=GRID, **inputs)
    assert out.dtype == dtype and torch.isfinite(out).all()
    ref = reference_output(
        name,
        cameras.to(dtype=torch.float64),
        q,
        k,
        v,
        {"planes": inputs["planes"], "params": {p: x.double() for p, x in inputs["params"].items()}},
    )
    tol = {
        torch.bfloat16: 0.2,  # measured worst 0.021 (bf16, hrope-lift); 10x margin, as below
        torch.float16: 0.02,  # measured worst 0.0022 (fp16, hrope-depth)
        torch.float32: 2e-5,  # measured worst 1.4e-6 (f32, hrope-pf)
    }[dtype] * ref.abs().max().item()
    assert (out.double() - ref).abs().max() <= tol


@pytest.mark.parametrize("name", ["prope", "hrope", "hrope-lift", "gta", "cape"])
@pytest.mark.parametrize("input_dtype", [torch.float32, torch.bfloat16])
def test_under_cpu_autocast(name, input_dtype):
    cameras = random_cameras(B=1, V=2, seed=1, dtype=torch.float32)
    inputs = encoding_inputs(name, cameras, GRID, dtype=torch.float32)
    q, k, v = (x.to(input_dtype) for x in random_qkv(1, 2, 8, 32))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = hrope.multiview_attention(q, k, v, encoding=name, cameras=cameras, grid=GRID, **inputs)
    assert torch.isfinite(out).all()
    ref = reference_output(
        name, cameras.to(dtype=torch.float64), q, k, v, {"planes": inputs["planes"], "params": inputs["params"]}
    )
    # measured worst 0.017 (bf16 inputs, hrope; 0.012 with float32 inputs)
    assert (out.double() - ref).abs().max() <= 0.055 * ref.abs().max()


def test_float64_inputs_with_float32_cameras_use_float64_geometry():
    cameras = random_cameras(B=1, V=2, seed=2, dtype=torch.float32)
    q, k, v = random_qkv(1, 2, 8, 32)
    out = hrope.multiview_attention(q, k, v, encoding="prope", cameras=cameras, grid=GRID)
    promoted = hrope.multiview_attention(q, k, v, encoding="prope", cameras=cameras.to(dtype=torch.float64), grid=GRID)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, promoted, rtol=0, atol=0)
    float32_geometry = hrope.get_encoding("prope").prepare(cameras, GRID, 32).attention(q, k, v)
    assert (float32_geometry - out).abs().max() > 1e-9


@pytest.mark.slow
@pytest.mark.parametrize("name", RELATIVE)
def test_gradcheck_through_fast_path(name):
    """float64 gradients w.r.t. q, k, v and every geometric input (plane normals and depths,
    per-token params) match finite differences."""
    cameras = random_cameras(B=1, V=2, seed=3)
    inputs = encoding_inputs(name, cameras, (1, 2), seed=3)
    planes, params = inputs["planes"], inputs["params"]
    q, k, v = (x.requires_grad_() for x in random_qkv(1, 1, 4, 16, seed=3))
    geo = []
    if planes is not None:
        geo += [planes.normal.clone().requires_grad_(), planes.depth.clone().requires_grad_()]
    # rotations must stay on SO(3): differentiate depth, full transforms and rigid translations
    names = [p for p in params if p != "rotation"]
    rigid = name == "hrope-se3"
    geo += [(params[p][..., :3, 3] if rigid else params[p]).clone().requires_grad_() for p in names]

    def f(q, k, v, *geo_args):
        pl = hrope.Planes(geo_args[0], geo_args[1]) if planes is not None else None
        rest = geo_args[2:] if planes is not None else geo_args
        if rigid:
            rest = [torch.cat([params["transform"][..., :3, :3], rest[0][..., None]], -1)]
            rest = [torch.cat([rest[0], params["transform"][..., 3:, :]], -2)]
        prm = dict(params, **dict(zip(names, rest)))
        return hrope.multiview_attention(q, k, v, encoding=name, cameras=cameras, grid=(1, 2), planes=pl, params=prm)

    assert torch.autograd.gradcheck(f, (q, k, v, *geo), eps=1e-6, atol=1e-5)
