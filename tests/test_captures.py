"""The ``captures`` data kind: posed captures cut into 3-view scenes (splits, the leak rule, contexts by
viewing direction, crops, geometry sources, config errors, ``hrope train``).

Fixtures are synthetic object orbits written in MonoSDF's layout (``cameras.npz``, ``*_rgb.png``, optional
``mask/`` and priors), so every test runs without the shared real captures; the last ones read them
(``../shared/realdata``, or ``HROPE_REALDATA``) and skip with a reason when absent. SfM is a stub that
records the views it is given and returns the fixture's true depth at a sparse pixel grid, except where
the real pycolmap triangulation is run on a real capture."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from hrope.nvs import cli
from hrope.nvs.build_data import build_dataset
from hrope.nvs.config import ConfigError, resolve
from hrope.nvs.data.real import capture_geometry
from hrope.nvs.data.real.captures import CaptureScenes, capture_folders
from hrope.nvs.data.real.view_splits import axis_angles, nearest_views, optical_axes, split_views
from hrope.nvs.data.scene import SceneError
from hrope.nvs.data.synthetic import make_scene
from test_loaders import save_png
from test_real_captures import REALDATA

NUM_VIEWS = 16
FRAMES = list(range(0, 12 * NUM_VIEWS, 12))  # of the 200-frame orbit: about 22 degrees apart
NATIVE = (40, 56)  # a non-square capture, centre-cropped to a square


def write_capture(folder: Path, seed: int, *, masks: bool = False, priors: bool = False) -> torch.Tensor:
    """A synthetic object orbit written as a MonoSDF capture; returns its true depth ``(V, H, W)``."""
    scene = make_scene(seed, 0, "object", NUM_VIEWS, NATIVE, frames=FRAMES)
    folder.mkdir(parents=True)
    arrays = {}
    for v in range(NUM_VIEWS):
        K = scene.cameras.K[0, v].double().clone()
        K[:2, 2] -= 0.5  # MonoSDF: pixel centres at integers
        P = torch.eye(4, dtype=torch.float64)
        P[:3] = K @ scene.cameras.world_to_cam[0, v].double()[:3]
        arrays[f"world_mat_{v}"] = P.numpy()
        pixels = (scene.images[v].permute(1, 2, 0) * 255).round().to(torch.uint8).numpy()
        save_png(folder / f"{v:06d}_rgb.png", pixels)
        if masks:
            save_png(
                folder / "mask" / f"{v:03d}.png", np.where(np.isfinite(scene.depth[v].numpy()), 255, 0).astype(np.uint8)
            )
        if priors:
            relative = torch.where(torch.isfinite(scene.depth[v]), 0.5 * scene.depth[v] + 0.2, 0.0)
            np.save(folder / f"{v:06d}_depth.npy", relative.numpy().astype(np.float32))
            np.save(folder / f"{v:06d}_normal.npy", ((scene.normals[v] + 1) / 2).clamp(0, 1).numpy().astype(np.float32))
    np.savez(folder / "cameras.npz", **arrays)
    return scene.depth


@pytest.fixture(scope="module")
def captures(tmp_path_factory) -> Path:
    """A folder of two captures (``a`` with masks and priors, ``b`` without)."""
    root = tmp_path_factory.mktemp("captures")
    write_capture(root / "a", 1, masks=True, priors=True)
    write_capture(root / "b", 2)
    return root


class SfmStub:
    """Stands in for :mod:`hrope.nvs.data.real.sfm`: records the views triangulated and gives each
    of them the true depth of its loaded view at every ``stride``-th pixel (computed from the native
    depth by the same crop and resize, nearest)."""

    def __init__(self, depth: dict[str, torch.Tensor], stride: int = 4) -> None:
        self.depth, self.stride, self.calls = depth, stride, []

    def triangulate(self, frames, views, *, cache_dir, name):
        self.calls.append((name, sorted(views)))
        return name, set(views)

    def sparse_depth(self, points, scene, views_of_scene):
        name, triangulated = points
        from hrope.nvs.data.transforms import resize_crop

        native = self.depth[name.split("/")[-1]][list(views_of_scene)]
        depth, _ = resize_crop(native[:, None], torch.eye(3).expand(len(native), 3, 3), scene.image_size, "nearest")
        sparse = torch.full_like(depth[:, 0], math.inf)
        step = self.stride
        sparse[:, ::step, ::step] = depth[:, 0, ::step, ::step]
        seen = torch.tensor([v in triangulated for v in views_of_scene])[:, None, None]
        return torch.where(seen, sparse, math.inf)


@pytest.fixture
def sfm_stub(captures, monkeypatch) -> SfmStub:
    depth = {
        name: make_scene(seed, 0, "object", NUM_VIEWS, NATIVE, frames=FRAMES).depth
        for name, seed in (("a", 1), ("b", 2))
    }
    stub = SfmStub(depth)
    monkeypatch.setattr(capture_geometry, "triangulate", stub.triangulate)
    monkeypatch.setattr(capture_geometry, "sparse_depth", stub.sparse_depth)
    return stub


# ----------------------------------------------------------------------------- splits and contexts
def test_views_split_by_their_index():
    splits = split_views(20, 8)
    assert splits == {
        "eval": [0, 8, 16],
        "val": [4, 12],
        "train": [1, 2, 3, 5, 6, 7, 9, 10, 11, 13, 14, 15, 17, 18, 19],
    }
    assert split_views(9, 4)["val"] == [2, 6] and split_views(9, 4)["eval"] == [0, 4, 8]
    with pytest.raises(SceneError, match="test_every must be an integer >= 3"):
        split_views(9, 2)


def cameras_at_yaws(degrees: list[float]) -> torch.Tensor:
    """World-to-camera ``(V, 4, 4)`` of cameras on a circle, each looking at the origin along the
    horizontal direction at ``degrees`` (so two axes differ by the difference of their angles)."""
    poses = []
    for angle in torch.tensor(degrees, dtype=torch.float64).deg2rad():
        forward = torch.stack([torch.sin(angle), torch.zeros(()), torch.cos(angle)]).double()
        down = torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64)
        R = torch.stack([torch.linalg.cross(down, forward), down, forward])  # rows: right, down, forward
        E = torch.eye(4, dtype=torch.float64)
        E[:3, :3], E[:3, 3] = R, -R @ (-3 * forward)
        poses.append(E)
    return torch.stack(poses)


def test_contexts_are_the_nearest_training_views_by_axis_angle():
    yaws = [0.0, 10.0, 25.0, 31.0, 50.0, 95.0, 100.0, 105.0]
    angles = axis_angles(optical_axes(cameras_at_yaws(yaws)))
    expected = torch.tensor([[abs(a - b) for b in yaws] for a in yaws], dtype=torch.float64)
    torch.testing.assert_close(angles, expected, rtol=0, atol=1e-12)
    assert nearest_views(angles, 2, [0, 1, 2, 3, 4], 2) == [3, 1]  # 6 and 15 degrees; never the target
    assert nearest_views(angles, 6, [1, 5, 7], 2) == [5, 7]  # a tie (5 degrees each) goes to the lower index
    assert nearest_views(angles, 0, [0, 4, 5], 2) == [4, 5]  # only the views offered
    with pytest.raises(SceneError, match="needs 2 other training views"):
        nearest_views(angles, 0, [0, 4], 2)


# ----------------------------------------------------------------------------- the leak rule
@pytest.mark.parametrize("geometry", ["sfm", "priors"])
def test_no_validation_or_test_view_reaches_training_and_targets_carry_no_geometry(captures, sfm_stub, geometry):
    splits = split_views(NUM_VIEWS, 8)
    for split in ("train", "val", "eval"):
        sfm_stub.calls.clear()
        data = CaptureScenes([captures / "a"], split=split, image_size=32, geometry=geometry)
        assert sfm_stub.calls == [("a", splits["train"])]  # triangulated from the training views only
        assert sorted(cut.target for cut in data.cuts) == splits[split]
        assert all(set(cut.context) <= set(splits["train"]) for cut in data.cuts)
        if split == "train":  # no validation or test view is even decoded for training
            assert set(data.captures["a"].views) == set(splits["train"])
        for index in range(len(data)):
            example = data[index]
            assert example.depth is not None and torch.isinf(example.depth[2]).all()
            assert torch.isfinite(example.depth[:2]).flatten(1).any(1).all()
            if geometry == "priors":
                assert example.normals is not None and (example.normals[2] == 0).all()
                assert (example.normals[:2].norm(dim=1) > 0.99).float().mean() > 0.5


def test_priors_are_aligned_to_the_sparse_depth(captures, sfm_stub):
    data = CaptureScenes([captures / "a"], split="eval", image_size=32, geometry="priors")
    loaded = data.captures["a"]
    sparse = sfm_stub.sparse_depth(("a", set(range(NUM_VIEWS))), loaded.scene, loaded.views)
    context = [loaded.row(v) for cut in data.cuts for v in cut.context]
    aligned, truth = loaded.scene.depth[context], sparse[context]
    seen = torch.isfinite(truth)
    # the prior is exactly affine in the true depth: the alignment recovers it to float32 rounding
    torch.testing.assert_close(aligned[seen], truth[seen], rtol=1e-4, atol=0)


# ----------------------------------------------------------------------------- crops and determinism
def test_the_square_crop_carries_the_intrinsics(captures):
    data = CaptureScenes([captures / "b"], split="eval", image_size=32)
    scene = data.captures["b"].scene
    native = make_scene(2, 0, "object", NUM_VIEWS, NATIVE, frames=FRAMES)
    v = data.captures["b"].views[0]
    row, column = 21, 30  # a native pixel inside the crop
    depth = float(native.depth[v, row, column])
    ray = torch.linalg.inv(native.cameras.K[0, v].double()) @ torch.tensor(
        [column + 0.5, row + 0.5, 1.0], dtype=torch.float64
    )
    point = torch.linalg.inv(native.cameras.world_to_cam[0, v].double()) @ torch.cat(
        [ray * depth, torch.ones(1, dtype=torch.float64)]
    )
    camera = scene.cameras.world_to_cam[0, 0].double() @ point
    pixel = scene.cameras.K[0, 0].double() @ camera[:3]
    # the loaders' plan: resize by 32/40 (width 56 -> round(44.8) = 45, so x scales by 45/56), then
    # crop 32 columns from column (45 - 32) // 2 = 6 of the resized image
    expected = torch.tensor([(column + 0.5) * 45 / 56 - 6, (row + 0.5) * 32 / 40], dtype=torch.float64)
    torch.testing.assert_close(pixel[:2] / pixel[2], expected, rtol=0, atol=2e-4)  # float32 cameras


def test_examples_are_deterministic_and_drawn_contexts_stay_near(captures):
    first, second = (CaptureScenes([captures / "b"], split="train", image_size=32) for _ in range(2))
    for index in (0, 5, len(first) - 1):
        torch.testing.assert_close(first[index].images, second[index].images, rtol=0, atol=0)
        torch.testing.assert_close(
            first[index].cameras.world_to_cam, second[index].cameras.world_to_cam, rtol=0, atol=0
        )
    drawn = CaptureScenes([captures / "b"], split="train", image_size=32, context_choices=4, seed=3)
    again = CaptureScenes([captures / "b"], split="train", image_size=32, context_choices=4, seed=3)
    poses = torch.stack([frame.world_to_cam for frame in drawn.captures["b"].frames])
    target = drawn.cuts[0].target
    nearest = nearest_views(axis_angles(optical_axes(poses)), target, split_views(NUM_VIEWS)["train"], 4)
    contexts = set()
    for epoch in range(12):
        drawn.set_epoch(epoch)
        again.set_epoch(epoch)
        context = drawn.context(0)
        assert set(context) <= set(nearest) and len(set(context)) == 2 and context == again.context(0)
        contexts.add(context)
    assert len(contexts) > 1  # drawn afresh per epoch
    assert first.context(0) == first.cuts[0].context == tuple(nearest[:2])  # context_choices 2: the nearest two


def test_protocol_captures_holds_out_whole_captures(captures, sfm_stub):
    folders = capture_folders(captures)
    train = CaptureScenes(folders, protocol="captures", held_out=["a"], split="train", image_size=32, geometry="sfm")
    assert {cut.capture for cut in train.cuts} == {"b"} and len(train) == NUM_VIEWS
    assert sfm_stub.calls == [("b", list(range(NUM_VIEWS)))]  # the held-out capture is not even triangulated
    sfm_stub.calls.clear()
    test = CaptureScenes(folders, protocol="captures", held_out=["a"], split="eval", image_size=32, geometry="sfm")
    assert sfm_stub.calls == [("a", split_views(NUM_VIEWS)["train"])]  # its own training views only
    assert {cut.capture for cut in test.cuts} == {"a"} and [cut.target for cut in test.cuts] == split_views(NUM_VIEWS)[
        "eval"
    ]
    described = test.describe()
    assert described["captures"]["a"]["scenes"] == len(test)
    angles = [a for cut in test.cuts for a in cut.angles[:2]]
    assert described["angles"]["target_context"]["min"] == min(angles)
    assert described["angles"]["target_context"]["max"] == max(angles)


# ----------------------------------------------------------------------------- config
def config(folder: Path, **data):
    settings = {"kind": "captures", "root": str(folder), "num_scenes": None, **data}
    return resolve({"data": settings, "eval": {"num_scenes": 4 if data.get("kind") == "room" else None}})


@pytest.mark.parametrize(
    "data, message",
    [
        ({"held_out": ["a"]}, r"data.held_out \['a'\] is for data.protocol 'captures'"),
        ({"protocol": "captures"}, "data.protocol 'captures' needs data.held_out"),
        ({"num_context": 3}, "2 context views and 1 target"),
        ({"depth": "points"}, "use data.geometry"),
        ({"test_every": 2}, "data.test_every must be an integer >= 3"),
        ({"test_every_by_capture": {"a": 1}}, "data.test_every_by_capture.a must be an integer >= 3"),
        ({"background_color": [1, 2, 0]}, r"data.background_color must be a list \[r, g, b\]"),
        (
            {"kind": "room", "root": None, "num_scenes": 4, "geometry": "sfm"},
            "data.geometry is for data.kind 'captures', not 'room'",
        ),
    ],
)
def test_bad_settings_are_one_line_config_errors(captures, data, message):
    with pytest.raises(ConfigError, match=message):
        config(captures, **data)


@pytest.mark.parametrize(
    "data, message",
    [
        ({"protocol": "captures", "held_out": ["c"]}, r"held_out names \['c'\], which are not captures"),
        ({"test_every_by_capture": {"scan": 4}}, r"test_every_by_capture names \['scan'\]"),
        ({"background": "composite"}, "capture b: background 'composite' needs object masks"),
        ({"geometry": "priors"}, "capture b: geometry 'priors' needs monocular depth priors"),
    ],
)
def test_settings_the_captures_cannot_meet_fail_when_built(captures, data, message):
    with pytest.raises(ConfigError, match=message) as error:
        build_dataset(config(captures, **data), "eval")
    assert "\n" not in str(error.value)


def test_the_config_builds_each_split(captures):
    built = {
        split: build_dataset(config(captures, test_every_by_capture={"a": 4}), split)
        for split in ("train", "val", "eval")
    }
    assert all(isinstance(d, CaptureScenes) for d in built.values())
    assert len(built["eval"]) == len(split_views(NUM_VIEWS, 4)["eval"]) + len(split_views(NUM_VIEWS, 8)["eval"])
    assert resolve({}).to_dict() == resolve({"data": {"protocol": "views", "geometry": "none"}}).to_dict()  # sparse


def test_hrope_train_and_eval_on_captures(captures, sfm_stub, tmp_path):
    run = tmp_path / "run"
    preset = Path(__file__).resolve().parents[1] / "configs" / "captures.yaml"
    options = ["--data.root", str(captures), "--data.geometry", "sfm", "--train.steps", "2", "--train.out", str(run)]
    options += ["--train.batch_size", "2", "--data.cache_dir", str(tmp_path / "cache")]
    assert cli.run(["train", str(preset), *options]) == 0
    assert (run / "config.yaml").is_file() and sfm_stub.calls
    assert cli.run(["eval", str(run), "--split", "val", "--num-scenes", "2"]) == 0
    assert (run / "eval" / "val" / "results.json").is_file()


# ----------------------------------------------------------------------------- the real captures
needs_realdata = pytest.mark.skipif(
    not REALDATA.is_dir(), reason=f"the real captures are not here ({REALDATA}; set HROPE_REALDATA to their folder)"
)


@needs_realdata
def test_real_captures_cut_into_scenes_with_wide_angles():
    folders = capture_folders(REALDATA)
    data = CaptureScenes([REALDATA / "maryRose"], split="val", image_size=32)
    assert [cut.target for cut in data.cuts] == split_views(69)["val"]
    summary = data.angles()
    assert (
        0 < summary["target_context"]["min"] <= summary["target_context"]["median"] <= summary["target_context"]["max"]
    )
    assert summary["target_context"]["max"] > 5  # wider than the stereo pair's parallax
    assert "scan24" in [folder.name for folder in folders]


@needs_realdata
def test_real_sfm_triangulates_the_training_views_only(tmp_path, monkeypatch):
    pytest.importorskip("pycolmap")
    seen = []
    real = capture_geometry.triangulate

    def spy(frames, views, **options):
        seen.append(sorted(views))
        return real(frames, views, **options)

    monkeypatch.setattr(capture_geometry, "triangulate", spy)
    data = CaptureScenes(
        [REALDATA / "scan24"], split="eval", image_size=32, geometry="sfm", test_every=4, sfm_cache_dir=tmp_path
    )
    assert seen == [split_views(49, 4)["train"]]
    example = data[0]
    assert torch.isinf(example.depth[2]).all() and torch.isfinite(example.depth[:2]).any()


@needs_realdata
def test_hrope_train_on_a_real_capture(tmp_path):
    preset = Path(__file__).resolve().parents[1] / "configs" / "captures.yaml"
    options = ["--data.root", str(REALDATA / "maryRose"), "--data.background", "composite", "--train.steps", "2"]
    options += ["--train.out", str(tmp_path / "run"), "--train.batch_size", "2", "--data.cache", "false"]
    assert cli.run(["train", str(preset), *options]) == 0
