"""Scene normalisation, view sampling, batching and the datasets."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader

from hrope.nvs.data import (
    Scene,
    SceneDataset,
    SceneError,
    SyntheticDataset,
    collate_scenes,
    make_scene,
    normalize_scene,
    sample_views,
)
from hrope.nvs.data.normalize import context_baseline
from hrope.nvs.data.rng import Rng
from hrope.geometry import invert_se3

from helpers import random_se3

SIZE = (16, 24)


@pytest.fixture(scope="module")
def scene() -> Scene:
    return make_scene(1, 2, "room", 4, SIZE, frames=[10, 60, 35, 90])


def back_projected(scene: Scene) -> torch.Tensor:
    """World points ``(V, H, W, 3)`` seen at every pixel (float64)."""
    H, W = scene.image_size
    ys, xs = torch.meshgrid(torch.arange(H) + 0.5, torch.arange(W) + 0.5, indexing="ij")
    K = scene.cameras.K[0].double()
    rays = torch.stack(
        [
            (xs - K[:, 0, 2, None, None]) / K[:, 0, 0, None, None],
            (ys - K[:, 1, 2, None, None]) / K[:, 1, 1, None, None],
            torch.ones(len(K), H, W),
        ],
        -1,
    )
    X_cam = rays * scene.depth[..., None].double()
    cam_to_world = invert_se3(scene.cameras.world_to_cam[0].double())
    return torch.einsum("vij,vhwj->vhwi", cam_to_world[:, :3, :3], X_cam) + cam_to_world[:, None, None, :3, 3]


@pytest.mark.parametrize("context", [[0, 1], [1, 0, 3]])
def test_normalize_scene_sets_the_frame_and_baseline(scene, context):
    normal = normalize_scene(scene, context)
    torch.testing.assert_close(normal.cameras.world_to_cam[0, context[0]], torch.eye(4), atol=1e-6, rtol=0)
    assert context_baseline(normal, context) == pytest.approx(1.0, abs=1e-5)
    centres = normal.cameras.centers()[0, context]
    distances = (centres[1:] - centres[0]).norm(dim=-1)
    assert float(distances.max()) == pytest.approx(1.0, abs=1e-5)
    if len(context) == 2:
        assert float(distances[0]) == pytest.approx(1.0, abs=1e-5)
    assert torch.equal(normal.images, scene.images) and torch.equal(normal.normals, scene.normals)
    assert torch.equal(normal.cameras.K, scene.cameras.K)

    # Relative geometry is unchanged up to the scale: relative rotations equal, translations scaled.
    scale = 1.0 / context_baseline(scene, context)
    E, N = scene.cameras.world_to_cam[0].double(), normal.cameras.world_to_cam[0].double()
    rel = lambda M: M[2] @ invert_se3(M[1])  # noqa: E731
    torch.testing.assert_close(rel(N)[:3, :3], rel(E)[:3, :3], atol=1e-5, rtol=0)
    torch.testing.assert_close(rel(N)[:3, 3], scale * rel(E)[:3, 3], atol=1e-5, rtol=0)
    seen = torch.isfinite(scene.depth)
    torch.testing.assert_close(normal.depth[seen], scene.depth[seen] * scale)
    # Depth and planes stay consistent: back-projected points lie on their planes, and are the old
    # points mapped into the new frame.
    points = back_projected(normal)
    X_cam = torch.einsum("vij,vhwj->vhwi", N[:, :3, :3], points) + N[:, None, None, :3, 3]
    on_plane = (normal.plane_m.permute(0, 2, 3, 1).double() * X_cam).sum(-1)
    torch.testing.assert_close(on_plane[seen], torch.ones_like(on_plane[seen]), atol=1e-4, rtol=0)
    old = back_projected(scene)
    expected = scale * (old - invert_se3(E[context[0]])[:3, 3]) @ invert_se3(E[context[0]])[:3, :3]
    torch.testing.assert_close(points[seen], expected[seen], atol=1e-4, rtol=1e-4)


def test_normalization_removes_a_change_of_world_frame(scene):
    G = random_se3(generator=torch.Generator().manual_seed(0), translation_scale=3.0)
    moved = Scene(
        scene.images, scene.cameras.transform_world(G.float()), scene.depth, scene.normals, scene.plane_m, scene.name
    )
    a, b = normalize_scene(scene, [0, 1]), normalize_scene(moved, [0, 1])
    torch.testing.assert_close(a.cameras.world_to_cam, b.cameras.world_to_cam, atol=2e-5, rtol=0)
    torch.testing.assert_close(a.depth, b.depth)


def test_normalize_scene_rejects_bad_contexts(scene):
    with pytest.raises(SceneError, match="at least one"):
        normalize_scene(scene, [])
    with pytest.raises(SceneError, match="coincide"):
        normalize_scene(scene, [2, 2])
    single = normalize_scene(scene, [3])
    torch.testing.assert_close(single.depth, scene.depth)  # one context view: frame only, no scaling


def test_sample_views_follows_the_protocol():
    for index in range(20):
        frames = sample_views(200, 2, 3, Rng(index), context_gap=(25, 100))
        first, last, targets = frames[0], frames[1], frames[2:]
        assert 25 <= last - first <= 100 and all(first <= t <= last for t in targets)
        frames = sample_views(200, 3, 2, Rng(index), context_gap=(25, 100), targets="extrapolate")
        first, last = frames[0], frames[2]
        gap = last - first
        assert first < frames[1] < last
        assert all((first - gap // 2 <= t < first) or (last < t <= last + gap // 2) for t in frames[3:])
    evaluation = sample_views(200, 2, 3, Rng(0), context_gap=(40, 40), random_targets=False)
    assert evaluation[2:] == [evaluation[0] + 10, evaluation[0] + 20, evaluation[0] + 30]
    with pytest.raises(ValueError, match="impossible"):
        sample_views(50, 2, 1, Rng(0), context_gap=(60, 80))
    with pytest.raises(ValueError, match="impossible"):
        sample_views(100, 2, 1, Rng(0), context_gap=(60, 80), targets="extrapolate")
    with pytest.raises(ValueError, match="num_context"):
        sample_views(100, 0, 1, Rng(0))


def test_training_views_vary_with_epoch_and_eval_views_do_not():
    train = SyntheticDataset("room", 4, seed=3, image_size=SIZE, split="train")
    evaluation = SyntheticDataset("room", 4, seed=3, image_size=SIZE, split="eval")
    before = [train.frames(i, 200) for i in range(4)], [evaluation.frames(i, 200) for i in range(4)]
    train.set_epoch(1)
    evaluation.set_epoch(1)
    after = [train.frames(i, 200) for i in range(4)], [evaluation.frames(i, 200) for i in range(4)]
    assert before[0] != after[0] and before[1] == after[1]


def test_synthetic_dataset_items_are_normalized_and_deterministic():
    def make(split):
        return SyntheticDataset(
            "object", 3, seed=5, image_size=SIZE, num_context=2, num_target=1, split=split, patch_size=8
        )

    train, again, evaluation = make("train"), make("train"), make("eval")
    item = train[1]
    assert item.num_views == 3 and item.image_size == SIZE
    torch.testing.assert_close(item.cameras.world_to_cam[0, 0], torch.eye(4), atol=1e-6, rtol=0)
    assert context_baseline(item, [0, 1]) == pytest.approx(1.0, abs=1e-5)
    assert torch.equal(item.images, again[1].images)
    assert not torch.equal(item.images, evaluation[1].images)  # separate seed streams
    assert not torch.equal(item.images, train[2].images)
    with pytest.raises(ValueError, match="divisible"):
        SyntheticDataset("room", 2, image_size=(20, 24), patch_size=8)
    with pytest.raises(ValueError, match="impossible"):
        SyntheticDataset("room", 2, image_size=SIZE, context_gap=(250, 300))
    with pytest.raises(IndexError):
        train[3]


def test_dataloader_with_workers_gives_the_same_batches():
    dataset = SyntheticDataset("room", 4, seed=2, image_size=SIZE, num_context=2, num_target=2)
    batches = [
        list(DataLoader(dataset, batch_size=2, num_workers=workers, collate_fn=dataset.collate)) for workers in (0, 2)
    ]
    for a, b in zip(*batches):
        assert torch.equal(a.images, b.images) and torch.equal(a.cameras.world_to_cam, b.cameras.world_to_cam)
        assert a.names == b.names
    batch = batches[0][0]
    assert batch.images.shape == (2, 4, 3, *SIZE) and batch.num_context == 2
    assert batch.cameras.K.shape == (2, 4, 3, 3) and batch.depth.shape == (2, 4, *SIZE)
    assert batch.normals.shape == batch.plane_m.shape == (2, 4, 3, *SIZE)


def test_batch_planes_follow_the_scene_rule(scene):
    other = make_scene(1, 3, "room", 4, SIZE)
    batch = collate_scenes([scene, other], num_context=2).to("cpu")
    planes = batch.planes(8)
    assert planes.shape == (2, 4 * 2 * 3)
    for b, s in enumerate([scene, other]):
        torch.testing.assert_close(planes.m(batch.cameras, (2, 3))[b], s.planes(8).m(s.cameras, (2, 3))[0])
    no_exact = collate_scenes([Scene(scene.images, scene.cameras, depth=scene.depth)], num_context=2)
    assert no_exact.plane_m is None and no_exact.normals is None
    fitted = no_exact.planes(8).m(no_exact.cameras, (2, 3))[0]
    torch.testing.assert_close(
        fitted, Scene(scene.images, scene.cameras, depth=scene.depth).planes(8).m(scene.cameras, (2, 3))[0]
    )
    with pytest.raises(SceneError, match="divisible"):
        batch.planes(5)
    with pytest.raises(SceneError, match="cannot batch"):
        collate_scenes([scene, scene.select_views([0, 1])], num_context=2)


def test_scene_dataset_wraps_any_scene_source():
    videos = [make_scene(4, i, "room", 12, SIZE, frames=list(range(0, 120, 10))) for i in range(2)]
    dataset = SceneDataset(videos, num_context=2, num_target=2, context_gap=(3, 6), split="eval")
    item = dataset[1]
    assert item.num_views == 4
    torch.testing.assert_close(item.cameras.world_to_cam[0, 0], torch.eye(4), atol=1e-6, rtol=0)
    frames = dataset.frames(1, 12)
    assert 3 <= frames[1] - frames[0] <= 6
    expected = normalize_scene(videos[1].select_views(frames), [0, 1])
    assert torch.equal(item.images, expected.images)
    torch.testing.assert_close(item.cameras.world_to_cam, expected.cameras.world_to_cam)
    assert dataset.collate([dataset[0], item]).images.shape == (2, 4, 3, *SIZE)


def test_scene_dataset_decodes_only_the_sampled_frames_of_a_scene_source():
    video = make_scene(4, 0, "room", 12, SIZE, frames=list(range(0, 120, 10)))

    class Source:
        requested: list[list[int]] = []

        def __len__(self):
            return 1

        def num_frames(self, index):
            return video.num_views

        def load_views(self, index, frames):
            self.requested.append(list(frames))
            return video.select_views(frames)

        def __getitem__(self, index):
            raise AssertionError("the whole scene should not be loaded")

    source = Source()
    item = SceneDataset(source, num_context=2, num_target=1, context_gap=(2, 5))[0]
    assert item.num_views == 3 and len(source.requested) == 1 and len(source.requested[0]) == 3
    assert torch.equal(item.images, video.select_views(source.requested[0]).images)
