"""URoPE's head-group layout and CaPE as EscherNet computes it, against vectors of the released math.

URoPE: ``shared/testdata/urope_port_vectors.npz`` (next to the repository; the public port's math,
``_exact`` in float64 and ``_port`` with its float32 geometry). CaPE: ``tests/data/cape_eschernet_vectors.npz``
(EscherNet's 6-DoF ``cape_embed`` in float64). Both hold out and the gradients of sum(out * weight).
"""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest
import torch

import hrope
import hrope.reference
from hrope.encodings import EncodingError
from hrope.testing import random_cameras, random_qkv, random_se3

ROOT = Path(__file__).resolve().parents[1]
UROPE_VECTORS = ROOT.parent / "shared" / "testdata" / "urope_port_vectors.npz"
CAPE_VECTORS = ROOT / "tests" / "data" / "cape_eschernet_vectors.npz"
UROPE_CASES = [
    "two_views_heads8_d64",
    "three_views_heads16_d32_nonsquare",
    "leaveout2_heads10_d48",
    "group1_custom_range",
    "behind_and_clamped",
]
CAPE_CASES = ["random_poses_d16", "batch2_d40", "four_views_d8"]
# max|got - want| / max|want| over out, dq, dk, dv. float64 against `_exact`: measured <= 5.5e-14
# (fast path and reference); bound 1e-11. float32 against `_port`: measured <= 9.7e-6 (positions up
# to 96 patches rounded in float32); bound 3e-5. CaPE float64: measured <= 2.7e-15; bound 1e-12.
FLOAT64_BOUND, FLOAT32_BOUND, CAPE_BOUND = 1e-11, 3e-5, 1e-12


def _relative_errors(got: list[torch.Tensor], want: list[np.ndarray]) -> list[float]:
    return [float(np.abs(g.detach().double().numpy() - w).max() / np.abs(w).max()) for g, w in zip(got, want)]


def _run(attention, encoding, case: dict, cameras: hrope.Cameras, grid: tuple[int, int], dtype: torch.dtype) -> list:
    qkv = [torch.tensor(case[x]).to(dtype).requires_grad_() for x in "qkv"]
    out = attention(*qkv, encoding=encoding, cameras=cameras, grid=grid)
    return [out, *torch.autograd.grad((out * torch.tensor(case["weight"]).to(dtype)).sum(), qkv)]


def _urope_case(name: str) -> tuple[dict, dict]:
    if not UROPE_VECTORS.exists():
        pytest.skip(f"{UROPE_VECTORS.name} is not next to the repository (shared/testdata)")
    with np.load(UROPE_VECTORS) as data:
        case = {key.split("/")[1]: data[key] for key in data.files if key.startswith(name + "/")}
    return case, ast.literal_eval(str(case["meta"]))


def _urope_setup(name: str, dtype: torch.dtype) -> tuple[dict, hrope.Cameras, tuple[int, int], object]:
    case, meta = _urope_case(name)
    grid = (meta["grid_h"], meta["grid_w"])
    cameras = hrope.Cameras(torch.tensor(case["K_patch"]).to(dtype), torch.tensor(case["world_to_cam"]).to(dtype), grid)
    encoding = hrope.get_encoding(
        "urope",
        layout="head_groups",
        projection="released",
        group_size=meta.get("group_size", 4),
        min_depth=meta.get("min_depth", 2.0),
        max_depth=meta.get("max_depth", 20.0),
        leaveout_heads=meta.get("leaveout_head", 0),
    )
    return case, cameras, grid, encoding


@pytest.mark.parametrize("name", UROPE_CASES)
@pytest.mark.parametrize("which", ["fast", "fold", "reference"])
def test_urope_head_groups_match_the_released_math_in_float64(name, which):
    case, cameras, grid, encoding = _urope_setup(name, torch.float64)
    attention = hrope.reference.multiview_attention if which == "reference" else hrope.multiview_attention
    if which == "fold":
        encoding.execution = "fold"
    got = _run(attention, encoding, case, cameras, grid, torch.float64)
    want = [case[f"{x}_exact"] for x in ("out", "dq", "dk", "dv")]
    assert max(_relative_errors(got, want)) < FLOAT64_BOUND


@pytest.mark.parametrize("name", UROPE_CASES)
def test_urope_head_groups_match_the_released_module_in_float32(name):
    case, cameras, grid, encoding = _urope_setup(name, torch.float32)
    got = _run(hrope.multiview_attention, encoding, case, cameras, grid, torch.float32)
    want = [case[f"{x}_port"] for x in ("out", "dq", "dk", "dv")]
    assert max(_relative_errors(got, want)) < FLOAT32_BOUND


def test_urope_interleaved_default_is_not_the_released_layout():
    case, cameras, grid, _ = _urope_setup("two_views_heads8_d64", torch.float64)
    got = _run(hrope.multiview_attention, hrope.get_encoding("urope"), case, cameras, grid, torch.float64)
    assert max(_relative_errors(got, [case["out_exact"]])) > 1e-3


@pytest.mark.parametrize("projection", ["clamped", "released"])
def test_urope_head_groups_reference_gradients_and_rigid_invariance(projection):
    """Random cameras: the fast path equals the independent reference (out and gradients), and a
    global rigid motion of every camera changes nothing."""
    cameras = random_cameras(B=1, V=3, image_size=(24, 32), seed=3)
    grid, heads, d = (3, 4), 6, 16
    q, k, v = random_qkv(1, heads, 3 * 12, d, seed=4)
    encoding = hrope.get_encoding(
        "urope",
        layout="head_groups",
        group_size=2,
        leaveout_heads=2,
        min_depth=1.0,
        max_depth=5.0,
        projection=projection,
    )
    case = {"q": q.numpy(), "k": k.numpy(), "v": v.numpy(), "weight": random_qkv(1, heads, 36, d, seed=5)[0].numpy()}
    fast = _run(hrope.multiview_attention, encoding, case, cameras, grid, torch.float64)
    ref = _run(hrope.reference.multiview_attention, encoding, case, cameras, grid, torch.float64)
    assert max(_relative_errors(fast, [r.detach().numpy() for r in ref])) < 1e-12
    motion = random_se3(1, generator=torch.Generator().manual_seed(6))
    moved = hrope.Cameras(cameras.K, cameras.world_to_cam @ torch.linalg.inv(motion)[:, None], cameras.image_size)
    again = _run(hrope.multiview_attention, encoding, case, moved, grid, torch.float64)
    assert max(_relative_errors(again, [f.detach().numpy() for f in fast])) < 1e-12
    plain = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(fast[0][:, 4:].detach(), plain[:, 4:], rtol=1e-12, atol=1e-12)  # left out
    assert (fast[0][:, :4].detach() - plain[:, :4]).abs().max() > 1e-3  # rotated


def test_urope_head_group_options_are_checked():
    with pytest.raises(EncodingError, match="layout"):
        hrope.get_encoding("urope", layout="groups")
    with pytest.raises(EncodingError, match="anchors"):
        hrope.get_encoding("urope", layout="head_groups", anchors=(2.0,))
    with pytest.raises(EncodingError, match="min_depth"):
        hrope.get_encoding("urope", layout="head_groups", min_depth=5.0, max_depth=2.0)
    encoding = hrope.get_encoding("urope", layout="head_groups", group_size=4)
    cameras = random_cameras(B=1, V=2, image_size=(8, 8))
    q = torch.randn(1, 6, 8, 16, dtype=torch.float64)
    with pytest.raises(EncodingError, match="group_size"):
        hrope.multiview_attention(q, q, q, encoding=encoding, cameras=cameras, grid=(2, 2))


def _cape_case(name: str) -> tuple[dict, hrope.Cameras, tuple[int, int]]:
    with np.load(CAPE_VECTORS) as data:
        case = {key.split("/")[1]: data[key] for key in data.files if key.startswith(name + "/")}
    meta = ast.literal_eval(str(case["meta"]))
    E = torch.tensor(case["world_to_cam"])
    K = torch.eye(3, dtype=torch.float64).expand(*E.shape[:2], 3, 3)
    return case, hrope.Cameras(K, E, image_size=(8, 8)), (1, meta["tokens_per_view"])


@pytest.mark.parametrize("name", CAPE_CASES)
@pytest.mark.parametrize("which", ["fast", "reference"])
def test_cape_is_eschernets(name, which):
    case, cameras, grid = _cape_case(name)
    attention = hrope.multiview_attention if which == "fast" else hrope.reference.multiview_attention
    got = _run(attention, hrope.get_encoding("cape"), case, cameras, grid, torch.float64)
    want = [case[x] for x in ("out", "dq", "dk", "dv")]
    assert max(_relative_errors(got, want)) < CAPE_BOUND
    transposed = _run(attention, hrope.get_encoding("cape", form="transposed"), case, cameras, grid, torch.float64)
    assert max(_relative_errors(transposed, want)) > 0.1  # the other form is another encoding


def test_cape_forms_match_the_reference_on_random_cameras():
    """Both forms: the fast path equals the independent reference."""
    cameras = random_cameras(B=1, V=2, seed=1)
    q, k, v = random_qkv(1, 2, 2 * 4, 8, seed=2)
    for form in ("eschernet", "transposed"):
        fast = hrope.multiview_attention(
            q, k, v, encoding=hrope.get_encoding("cape", form=form), cameras=cameras, grid=(2, 2)
        )
        ref = hrope.reference.multiview_attention(
            q, k, v, encoding=hrope.get_encoding("cape", form=form), cameras=cameras, grid=(2, 2)
        )
        torch.testing.assert_close(fast, ref, rtol=1e-12, atol=1e-12)
    with pytest.raises(EncodingError, match="form"):
        hrope.get_encoding("cape", form="row")
