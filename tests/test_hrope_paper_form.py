"""``hrope``'s options for the paper's form (docs/encodings.md "hrope — the paper's Eq. 5"): the
gauge (the world translated to the mean camera centre, or the given world) and the pose (the
camera's, or a per-patch pose E_u = [[ΔR, Δt], [0, 1]] E_c)."""

from __future__ import annotations

import itertools

import pytest
import torch
from _lvsm_helpers import SMALL_MODEL, synthetic_batch
from hypothesis import given, settings
from hypothesis import strategies as st

import hrope
import hrope.reference
from helpers import random_cameras, random_planes, random_qkv, random_rotation, random_se3
from hrope.encodings import HRoPE
from hrope.geometry import invert_se3, make_se3
from hrope.nvs.data import collate_scenes, normalize_scene
from hrope.nvs.data.synthetic import make_scene
from hrope.nvs.model import LVSM, ModelConfig
from hrope.nvs.sources import axis_angle_to_matrix

GRID = (2, 3)
P = GRID[0] * GRID[1]
OPTIONS = list(itertools.product(["centroid", "world"], ["camera", "per-patch"], [False, True]))


def origin_first(cameras: hrope.Cameras) -> hrope.Cameras:
    """The cameras re-expressed with the first one exactly at the world origin (R = I, t = 0), as
    the toolkit's scene normalisation does."""
    moved = cameras.transform_world(invert_se3(cameras.world_to_cam[:, 0])).world_to_cam.clone()
    moved[:, 0] = torch.eye(4, dtype=moved.dtype)
    return hrope.Cameras(cameras.K, moved, cameras.image_size)


def normalised_model_cameras() -> hrope.Cameras:
    """What the model's encoding sees: a normalised synthetic scene (first context camera = world,
    unit baseline), 2 context + 2 targets folded into (2 targets, 3 views)."""
    scene = normalize_scene(make_scene(0, 0, "room", num_views=4, image_size=(32, 48)), [0, 1])
    return LVSM.fold_cameras(collate_scenes([scene], 2).cameras.to(dtype=torch.float64), 2)


def patch_pose(B, N, seed, angle=0.3, shift=0.2) -> dict:
    """Random per-patch offsets: rotations of about ``angle`` rad and translations of about ``shift``."""
    g = torch.Generator().manual_seed(seed)
    axis = angle * torch.randn(B, N, 3, generator=g, dtype=torch.float64)
    return {
        "patch_rotation": axis_angle_to_matrix(axis),
        "patch_translation": shift * torch.randn(B, N, 3, generator=g, dtype=torch.float64),
    }


def identity_pose(B, N) -> dict:
    return {
        "patch_rotation": torch.eye(3, dtype=torch.float64).expand(B, N, 3, 3),
        "patch_translation": torch.zeros(B, N, 3, dtype=torch.float64),
    }


def attend(enc, cameras, planes, params=None, seed=0):
    B, N = cameras.batch_size, cameras.num_views * P
    q, k, v = random_qkv(B, 2, N, 48, seed=seed)
    return hrope.multiview_attention(q, k, v, encoding=enc, cameras=cameras, grid=GRID, planes=planes, params=params)


def with_one_plane_moved(planes: hrope.Planes, cameras, token: int) -> hrope.Planes:
    m = planes.m(cameras, GRID).clone()
    m[:, token] = m[:, token] * 1.5 + torch.tensor([0.2, -0.1, 0.0], dtype=m.dtype)
    return hrope.Planes.from_m(m)


# --------------------------------------------------------------------------- inert views
@pytest.mark.parametrize("source", ["random", "model"])
@pytest.mark.parametrize("lift4", [False, True])
def test_every_view_responds_to_its_planes_in_the_centroid_gauge(source, lift4):
    """With the first camera at the world origin, moving one token's plane changes the output for
    every view in the centroid gauge; in the world gauge the first view is inert (H = K̂R there)."""
    cameras = origin_first(random_cameras(B=2, V=3, seed=4)) if source == "random" else normalised_model_cameras()
    torch.testing.assert_close(
        cameras.world_to_cam[:, 0], torch.eye(4, dtype=torch.float64).expand(2, 4, 4), rtol=0, atol=1e-12
    )
    planes = random_planes(cameras.batch_size, cameras.num_views * P, seed=4)
    for gauge in ("centroid", "world"):
        enc = HRoPE(lift4=lift4, gauge=gauge)
        base = attend(enc, cameras, planes)
        for view in range(cameras.num_views):
            moved = attend(enc, cameras, with_one_plane_moved(planes, cameras, view * P + 1))
            change = (moved - base).abs().max()
            if gauge == "world" and view == 0:  # only round-off of the scene normalisation's t ~ 1e-16
                assert change < 1e-12, change
            else:
                assert change > 1e-3, (gauge, view, change)


def test_only_a_view_at_the_centroid_is_inert():
    """The centroid gauge's t of a view is R (c̄ - C): zero only when its centre is the mean centre,
    e.g. the middle one of three equally spaced cameras on a line."""
    E = torch.eye(4, dtype=torch.float64).repeat(1, 3, 1, 1)
    E[0, :, 0, 3] = torch.tensor([1.0, 0.0, -1.0])  # centres at x = -1, 0, 1
    cameras = hrope.Cameras(random_cameras(B=1, V=3, seed=0).K, E, (32, 48))
    _, t = HRoPE().poses(cameras, GRID)
    torch.testing.assert_close(t[0, :, 0].norm(dim=-1), torch.tensor([1.0, 0.0, 1.0], dtype=torch.float64))
    planes = random_planes(1, 3 * P, seed=1)
    base = attend(HRoPE(), cameras, planes)
    assert (attend(HRoPE(), cameras, with_one_plane_moved(planes, cameras, P + 2)) - base).abs().max() == 0


# --------------------------------------------------------------------------- world-frame invariance
@settings(max_examples=20, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    views=st.integers(2, 4),
    pose=st.sampled_from(["camera", "per-patch"]),
    lift4=st.booleans(),
)
def test_centroid_gauge_is_world_frame_invariant(seed, views, pose, lift4):
    """Random rigid world changes, arbitrary different planes per token, per-patch offsets too."""
    cameras = random_cameras(B=2, V=views, seed=seed)
    G = random_se3(2, generator=torch.Generator().manual_seed(seed + 1), translation_scale=3.0)
    planes = random_planes(2, views * P, seed=seed)
    params = patch_pose(2, views * P, seed) if pose == "per-patch" else None
    enc = HRoPE(lift4=lift4, pose=pose)
    a = attend(enc, cameras, planes, params, seed)
    b = attend(enc, cameras.transform_world(G), planes, params, seed)
    torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-8)


def test_eq5_is_invariant_to_world_rotations_in_any_gauge_but_not_to_translations_in_the_world_gauge():
    """H -> H Q under a world rotation Q, so H_i H_j^-1 is unchanged; a world translation changes
    d_w of every plane, so the world gauge depends on it."""
    cameras = random_cameras(B=1, V=3, seed=2)
    planes = random_planes(1, 3 * P, seed=2)
    rotation = torch.eye(4, dtype=torch.float64)
    rotation[:3, :3] = random_rotation(generator=torch.Generator().manual_seed(0))
    translation = torch.eye(4, dtype=torch.float64)
    translation[:3, 3] = torch.tensor([0.5, -1.0, 2.0])
    enc = HRoPE(gauge="world")
    a = attend(enc, cameras, planes)
    torch.testing.assert_close(attend(enc, cameras.transform_world(rotation), planes), a, rtol=1e-9, atol=1e-9)
    H, _ = enc.homographies(cameras, GRID, planes)
    H_rotated, _ = enc.homographies(cameras.transform_world(rotation), GRID, planes)
    torch.testing.assert_close(H_rotated, H @ rotation[:3, :3], rtol=1e-10, atol=1e-10)
    assert (attend(enc, cameras.transform_world(translation), planes) - a).abs().max() > 1e-4


# --------------------------------------------------------------------------- fast path == reference
@pytest.mark.parametrize("gauge,pose,lift4", OPTIONS)
@pytest.mark.parametrize("seed", [0, 1])
def test_fast_path_matches_reference_for_every_option(gauge, pose, lift4, seed):
    cameras = random_cameras(B=2, V=3, seed=seed)
    if seed:
        cameras = origin_first(cameras)
    planes = random_planes(2, 3 * P, seed=seed)
    params = patch_pose(2, 3 * P, seed) if pose == "per-patch" else None
    enc = HRoPE(lift4=lift4, gauge=gauge, pose=pose)
    q, k, v = random_qkv(2, 2, 3 * P, 40, seed=seed)
    kw = dict(encoding=enc, cameras=cameras, grid=GRID, planes=planes, params=params)
    fast = hrope.multiview_attention(q, k, v, **kw)
    ref = hrope.reference.multiview_attention(q, k, v, **kw)
    torch.testing.assert_close(fast, ref, rtol=1e-9, atol=1e-9)


def test_reference_centroid_gauge_is_the_world_gauge_with_the_origin_at_the_mean_centre():
    """The reference's own centroid: its blocks equal its literal world-frame Eq. 5 on the cameras
    re-expressed with the world origin at the mean camera centre."""
    cameras = random_cameras(B=2, V=3, seed=8)
    planes = random_planes(2, 3 * P, seed=8)
    world_from_gauge = torch.eye(4, dtype=torch.float64).repeat(2, 1, 1)
    world_from_gauge[:, :3, 3] = cameras.centers().mean(1)
    D, _ = hrope.reference.token_matrices(HRoPE(), cameras, GRID, 24, planes)
    D_world, _ = hrope.reference.token_matrices(
        HRoPE(gauge="world"), cameras.transform_world(world_from_gauge), GRID, 24, planes
    )
    torch.testing.assert_close(D, D_world, rtol=0, atol=1e-12)
    assert (D - hrope.reference.token_matrices(HRoPE(gauge="world"), cameras, GRID, 24, planes)[0]).abs().max() > 1e-3


@pytest.mark.parametrize("gauge,pose,lift4", OPTIONS)
@pytest.mark.parametrize("offset", [0.01, -0.02])
def test_clamps_act_in_the_gauge(gauge, pose, lift4, offset):
    """Planes near the gauge's origin (s = 1 - m·t = ``offset`` with the token's t in the gauge) are
    clamped to |s| = min_world_offset_ratio, sign kept, in the fast path and the reference alike.
    (Exactly through it, s = 0 up to round-off and the sign the clamp keeps is round-off too.)"""
    cameras = random_cameras(B=1, V=2, seed=11)
    params = patch_pose(1, 2 * P, 3) if pose == "per-patch" else {}
    enc = HRoPE(lift4=lift4, gauge=gauge, pose=pose)
    _, t = enc.poses(cameras, GRID, **params)
    t = t.expand(1, 2, P, 3).reshape(1, 2 * P, 3)
    m = (1.0 - offset) * t / (t * t).sum(-1, keepdim=True)
    s = 1.0 - (enc.clamp_planes(m, t) * t).sum(-1)
    expected = enc.min_world_offset_ratio * (1.0 if offset > 0 else -1.0)
    torch.testing.assert_close(s, torch.full_like(s, expected), rtol=0, atol=1e-13)  # measured <= 2.6e-16
    q, k, v = random_qkv(1, 2, 2 * P, 36, seed=11)
    kw = dict(encoding=enc, cameras=cameras, grid=GRID, planes=hrope.Planes.from_m(m), params=params or None)
    fast, ref = hrope.multiview_attention(q, k, v, **kw), hrope.reference.multiview_attention(q, k, v, **kw)
    assert torch.isfinite(ref).all()
    torch.testing.assert_close(fast, ref, rtol=1e-9, atol=1e-9)


# --------------------------------------------------------------------------- per-patch pose
@pytest.mark.parametrize("gauge", ["centroid", "world"])
@pytest.mark.parametrize("lift4", [False, True])
def test_zero_patch_offsets_are_the_camera_pose_exactly(gauge, lift4):
    cameras = random_cameras(B=2, V=3, seed=5)
    planes = random_planes(2, 3 * P, seed=5)
    camera = attend(HRoPE(lift4=lift4, gauge=gauge), cameras, planes)
    per_patch = HRoPE(lift4=lift4, gauge=gauge, pose="per-patch")
    torch.testing.assert_close(attend(per_patch, cameras, planes, identity_pose(2, 3 * P)), camera, rtol=0, atol=0)
    moved = attend(per_patch, cameras, planes, patch_pose(2, 3 * P, 5))
    assert (moved - camera).abs().max() > 1e-3


@pytest.mark.parametrize("gauge", ["centroid", "world"])
def test_per_patch_pose_is_composed_with_the_camera_pose_in_the_gauge(gauge):
    """One offset ΔE shared by a view's tokens is that camera moved to ΔE E_c [[I, c̄], [0, 1]] (c̄ the
    mean centre of the given cameras; c̄ = 0 in the world gauge), evaluated in the world gauge."""
    cameras = random_cameras(B=2, V=3, seed=6)
    planes = random_planes(2, 3 * P, seed=6)
    delta = random_se3(2, 3, generator=torch.Generator().manual_seed(6), translation_scale=0.3)
    world_from_gauge = torch.eye(4, dtype=torch.float64).repeat(2, 1, 1)
    if gauge == "centroid":
        world_from_gauge[:, :3, 3] = cameras.centers().mean(1)
    moved = hrope.Cameras(cameras.K, delta @ cameras.transform_world(world_from_gauge).world_to_cam, cameras.image_size)
    params = {
        "patch_rotation": delta[..., :3, :3].repeat_interleave(P, 1),
        "patch_translation": delta[..., :3, 3].repeat_interleave(P, 1),
    }
    out = attend(HRoPE(gauge=gauge, pose="per-patch"), cameras, planes, params)
    torch.testing.assert_close(out, attend(HRoPE(gauge="world"), moved, planes), rtol=1e-9, atol=1e-9)


def test_param_names_are_a_fact_of_the_instance():
    assert HRoPE.param_names == () and HRoPE().param_names == ()
    assert HRoPE(pose="per-patch").param_names == ("patch_rotation", "patch_translation")
    assert hrope.get_encoding("hrope", pose="per-patch").takes_token_inputs()


def test_clear_errors_for_bad_options_and_patch_poses():
    cameras = random_cameras(B=1, V=2, seed=0)
    planes = random_planes(1, 2 * P, seed=0)
    with pytest.raises(hrope.EncodingError, match="gauge must be one of"):
        HRoPE(gauge="first-camera")
    with pytest.raises(hrope.EncodingError, match="pose must be one of"):
        HRoPE(pose="patch")
    enc = HRoPE(pose="per-patch")
    good = identity_pose(1, 2 * P)
    with pytest.raises(hrope.EncodingError, match="needs params"):
        enc.prepare(cameras, GRID, 48, planes=planes)
    with pytest.raises(hrope.EncodingError, match="unknown params"):
        HRoPE().prepare(cameras, GRID, 48, planes=planes, **good)
    bad = {
        "patch_rotation must have shape": {**good, "patch_rotation": good["patch_rotation"][:, :-1]},
        "patch_translation must have shape": {**good, "patch_translation": torch.zeros(1, 2 * P, 4)},
        "patch_translation must be finite": {**good, "patch_translation": torch.full((1, 2 * P, 3), float("nan"))},
        "patch_rotation must hold proper rotations": {**good, "patch_rotation": -good["patch_rotation"]},
    }
    for message, params in bad.items():
        with pytest.raises(hrope.EncodingError, match=message):
            enc.prepare(cameras, GRID, 48, planes=planes, **params)


# --------------------------------------------------------------------------- in the model
def test_lvsm_with_per_patch_pose_starts_as_the_camera_pose_and_trains_the_offsets():
    batch = synthetic_batch(num_scenes=1, num_views=3)
    torch.manual_seed(0)
    per_patch = LVSM(ModelConfig(**SMALL_MODEL, encoding="hrope", encoding_options={"pose": "per-patch"}))
    camera = LVSM(ModelConfig(**SMALL_MODEL, encoding="hrope"))
    shared = {k: v for k, v in per_patch.state_dict().items() if not k.startswith("source.")}
    camera.load_state_dict(shared, strict=False)
    out = per_patch(batch)
    assert set(out.parameters[0]) == {"planes", "patch_rotation", "patch_translation"}
    with torch.no_grad():
        torch.testing.assert_close(camera(batch).images, out.images, rtol=0, atol=1e-6)
    out.images.mean().backward()
    rows = per_patch.source.heads[0].weight.grad.abs().amax(-1).split([s.raw_dim for s in per_patch.source.specs])
    grads = dict(zip([s.name for s in per_patch.source.specs], rows))
    assert grads["patch_rotation"].numel() == 3 and (grads["patch_rotation"] > 0).all()
    assert grads["patch_translation"].numel() == 3 and (grads["patch_translation"] > 0).all()


@pytest.mark.parametrize("pose", ["camera", "per-patch"])
def test_lvsm_with_hrope_is_world_frame_invariant(pose):
    torch.manual_seed(0)
    model = LVSM(ModelConfig(**SMALL_MODEL, encoding="hrope", encoding_options={"pose": pose}))
    for head in model.source.heads:  # non-zero planes and offsets
        torch.nn.init.normal_(head.weight, std=0.05)
    batch, moved = synthetic_batch(num_scenes=1, num_views=3), synthetic_batch(num_scenes=1, num_views=3)
    G = make_se3(axis_angle_to_matrix(torch.tensor([0.3, -0.2, 0.5])), torch.tensor([1.0, -2.0, 0.5]))
    moved.cameras = batch.cameras.transform_world(G)
    with torch.no_grad():
        torch.testing.assert_close(model(moved).images, model(batch).images, atol=2e-5, rtol=0)
