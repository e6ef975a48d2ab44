"""Real data end to end: fixtures in the real formats (rendered synthetic videos with known
cameras), `hrope train` / `hrope eval` / protocols on them, and lazy frame decoding."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from _lvsm_helpers import SMALL_MODEL  # noqa: F401  (sets one torch thread)
from PIL import Image

from hrope.nvs.cli import run
from hrope.nvs.config import resolve
from hrope.nvs.data import SceneDataset, SceneError, make_scene, normalize_scene, resize_crop_scene
from hrope.nvs.evaluation.protocols import SourceVideos, protocol_plans
from hrope.nvs.build_data import build_dataset, build_scene_source

TINY = str(Path(__file__).parents[1] / "configs" / "tiny.yaml")
SMALL = [
    "--model.image_size",
    "32",
    "--model.dim",
    "48",
    "--model.layers",
    "2",
    "--model.heads",
    "2",
    "--train.batch_size",
    "1",
    "--train.warmup",
    "1",
    "--train.threads",
    "1",
    "--eval.batch_size",
    "2",
    "--eval.num_grid_scenes",
    "1",
]
NATIVE = (36, 48)  # resized to cover 32 x 32, then centre-cropped
FRAMES = list(range(0, 120, 10))  # 12-frame videos


def videos(count: int = 2):
    return [make_scene(7, i, "room", len(FRAMES), NATIVE, frames=FRAMES) for i in range(count)]


def uint8(image: torch.Tensor) -> np.ndarray:
    return (image.permute(1, 2, 0) * 255).round().byte().numpy()


def write_nerfstudio(folder: Path, scene) -> None:
    """``transforms.json`` (OpenGL camera-to-world, per-frame intrinsics) + PNG frames."""
    (folder / "images").mkdir(parents=True)
    frames = []
    for v in range(scene.num_views):
        c2w = torch.linalg.inv(scene.cameras.world_to_cam[0, v].double())
        c2w_gl = torch.stack([c2w[:, 0], -c2w[:, 1], -c2w[:, 2], c2w[:, 3]], 1)
        Image.fromarray(uint8(scene.images[v])).save(folder / "images" / f"{v:03d}.png")
        K = scene.cameras.K[0, v]
        frames.append(
            {
                "file_path": f"images/{v:03d}.png",
                "transform_matrix": c2w_gl.tolist(),
                "fl_x": float(K[0, 0]),
                "fl_y": float(K[1, 1]),
                "cx": float(K[0, 2]),
                "cy": float(K[1, 2]),
            }
        )
    meta = {"w": NATIVE[1], "h": NATIVE[0], "frames": frames}
    (folder / "transforms.json").write_text(json.dumps(meta))


def re10k_entry(key: str, scene) -> dict:
    """A pixelSplat scene dict: normalised intrinsics, world-to-camera 3x4, JPEG frames."""
    H, W = NATIVE
    K, E = scene.cameras.K[0].double(), scene.cameras.world_to_cam[0].double()
    intrinsics = torch.stack([K[:, 0, 0] / W, K[:, 1, 1] / H, K[:, 0, 2] / W, K[:, 1, 2] / H], 1)
    cameras = torch.cat([intrinsics, torch.zeros(len(K), 2, dtype=torch.float64), E[:, :3].reshape(len(K), 12)], 1)
    images = []
    for image in scene.images:
        buffer = io.BytesIO()
        Image.fromarray(uint8(image)).save(buffer, format="JPEG", quality=95)
        images.append(torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8))
    return {"key": key, "url": "", "timestamps": torch.arange(len(K)), "cameras": cameras.float(), "images": images}


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory):
    root = tmp_path_factory.mktemp("real")
    scenes = videos()
    for i, scene in enumerate(scenes):
        write_nerfstudio(root / "nerfstudio" / f"scene_{i}", scene)
    (root / "re10k").mkdir()
    torch.save([re10k_entry(f"key{i}", scene) for i, scene in enumerate(scenes)], root / "re10k" / "000000.torch")
    index = {"key0": None, "key1": {"context": [1, 10], "target": [3, 6, 8]}}
    (root / "index.json").write_text(json.dumps(index))
    return root, scenes


def real_config(folder: Path, **data) -> dict:
    return resolve(
        {
            "model": {**SMALL_MODEL, "preset": None},
            "data": {
                "kind": "nerfstudio",
                "root": str(folder / "nerfstudio"),
                "num_scenes": None,
                "context_gap": [3, 8],
                "num_target": 2,
                **data,
            },
            "eval": {"num_scenes": None},
        }
    )


def test_real_dataset_items_are_cropped_with_exact_intrinsics_and_normalised(fixtures):
    root, scenes = fixtures
    config = real_config(root)
    dataset = build_dataset(config, "eval")
    assert len(dataset) == 2
    for i in range(2):
        item = dataset[i]
        frames = dataset.frames(i, len(FRAMES))
        expected = normalize_scene(resize_crop_scene(scenes[i].select_views(frames), (32, 32)), [0, 1])
        assert item.image_size == (32, 32) and item.num_views == 4
        torch.testing.assert_close(item.cameras.K, expected.cameras.K, atol=1e-3, rtol=0)
        torch.testing.assert_close(item.cameras.world_to_cam, expected.cameras.world_to_cam, atol=1e-4, rtol=0)
        # uint8 PNG frames, then resized: measured 3.6e-3 (the quantisation through the resize); 3x margin
        torch.testing.assert_close(item.images, expected.images, atol=0.01, rtol=0)
    train = build_dataset(config, "train")
    draws = set()
    for epoch in range(4):
        train.set_epoch(epoch)
        draws.add(tuple(train.frames(0, len(FRAMES))))
    assert len(draws) > 1  # training views are redrawn


def test_re10k_evaluation_index_drives_the_protocol_frames(fixtures):
    root, _ = fixtures
    config = real_config(root, kind="re10k", root=str(root / "re10k"), eval_index=str(root / "index.json"))
    videos = SourceVideos(build_scene_source(config, "eval"), None, None)
    assert len(videos) == 1  # the null entry is left out
    _, standard, _ = protocol_plans(videos, "standard", (1,), 0)
    assert standard[0] == [([1, 10], [3, 6, 8])]
    _, views, _ = protocol_plans(videos, "views", (4,), 0)
    context, targets = views[0][0]
    assert len(context) == 4 and (context[0], context[-1]) == (1, 10) and targets == [3, 6, 8]
    assert not set(context) & set(targets)
    item = build_dataset(config, "eval")[0]  # plain evaluation uses the index too
    assert item.num_views == 5


def test_train_and_evaluate_on_real_formats(fixtures, tmp_path, capsys):
    root, _ = fixtures
    run_dir = tmp_path / "run"
    data = [
        "--data.kind",
        "nerfstudio",
        "--data.root",
        str(root / "nerfstudio"),
        "--data.context_gap",
        "[3, 8]",
        "--data.num_scenes",
        "null",
        "--eval.num_scenes",
        "null",
    ]
    assert run(["train", TINY, "--encoding", "prope", "--steps", "2", "--out", str(run_dir), *SMALL, *data]) == 0
    assert "trained 2 steps" in capsys.readouterr().out

    assert run(["eval", str(run_dir)]) == 0  # the run's own (nerfstudio) data
    results = json.loads((run_dir / "eval" / "results.json").read_text())
    assert results["num_scenes"] == 2 and 0 < results["metrics"]["psnr"] < 60

    re10k = ["--data.kind", "re10k", "--data.root", str(root / "re10k"), "--data.eval_index", str(root / "index.json")]
    assert run(["eval", str(run_dir), "--protocol", "standard", *re10k]) == 0
    standard = json.loads((run_dir / "eval" / "standard" / "results.json").read_text())[0]
    assert standard["num_scenes"] == 1 and standard["points"][0]["num_target"] == 3
    assert 0 < standard["points"][0]["metrics"]["psnr"] < 60

    out = tmp_path / "zoom"
    assert (
        run(
            [
                "eval",
                str(run_dir),
                str(run_dir / "checkpoint.safetensors"),
                "--protocol",
                "zoom",
                "--factors",
                "1",
                "2",
                "--out",
                str(out),
                *re10k,
            ]
        )
        == 0
    )
    table = (out / "results.md").read_text()
    assert table.count("| prope [") == 6 and (out / "metrics.png").is_file()  # 2 runs x 3 metric tables
    assert "trade-off plot is not drawn" in table


def test_cli_errors_for_real_data(fixtures, tmp_path, capsys):
    root, _ = fixtures
    run_dir = tmp_path / "run"
    assert run(["train", TINY, "--steps", "1", "--out", str(run_dir), *SMALL, "--data.num_scenes", "1"]) == 0
    assert run(["eval", str(run_dir), "--protocol", "nope"]) == 2
    assert "unknown protocol 'nope'" in capsys.readouterr().err
    assert run(["eval", str(run_dir), "--protocol", "standard", "--data.kind", "dl3dv"]) == 2
    assert "data.root is required" in capsys.readouterr().err
    assert run(["eval", str(run_dir), "--data.kind", "re10k", "--data.root", str(tmp_path)]) == 2
    assert "no readable *.torch chunks" in capsys.readouterr().err
    assert run(["eval", str(run_dir), str(run_dir), "--protocol", "zoom"]) == 2
    assert "--out DIR is required" in capsys.readouterr().err
    assert run(["eval", str(run_dir), "--train.lr", "1"]) == 2
    assert "--data.key overrides only" in capsys.readouterr().err


def test_scene_dataset_skips_unloadable_scenes_without_decoding_whole_videos(caplog):
    video = make_scene(4, 0, "room", 12, (16, 16), frames=FRAMES)

    class Source:
        requested: list[tuple[int, list[int]]] = []

        def __len__(self):
            return 3

        def num_frames(self, index):
            return 2 if index == 2 else video.num_views  # scene 2 is too short for the sampling

        def load_views(self, index, frames):
            self.requested.append((index, list(frames)))
            if index == 0:
                raise SceneError("scene 0: frame 3 is corrupt")
            return video.select_views(frames)

        def __getitem__(self, index):
            raise AssertionError("a whole video must never be decoded")

    source = Source()
    dataset = SceneDataset(source, num_context=2, num_target=1, context_gap=(2, 5), split="eval")
    with caplog.at_level(logging.WARNING, logger="hrope.nvs.data"):
        first, third = dataset[0], dataset[2]
    assert first.num_views == third.num_views == 3 and dataset.num_skipped == 2
    assert "frame 3 is corrupt" in caplog.text and "2 scene(s) skipped" in caplog.text
    assert all(len(frames) == 3 for _, frames in source.requested)


def test_scene_dataset_honours_skip_errors_and_never_swallows_bugs():
    video = make_scene(4, 0, "room", 12, (16, 16), frames=FRAMES)

    class Source:
        skip_errors = True

        def __init__(self, failure):
            self.failure = failure

        def __len__(self):
            return 2

        def num_frames(self, index):
            return video.num_views

        def load_views(self, index, frames):
            if index == 0:
                raise self.failure
            return video.select_views(frames)

    make = lambda failure: SceneDataset(Source(failure), context_gap=(2, 5), split="eval")  # noqa: E731
    assert make(SceneError("corrupt"))[0].num_views == 3  # skipped to scene 1
    strict = Source(SceneError("corrupt"))
    strict.skip_errors = False
    with pytest.raises(SceneError, match="corrupt"):
        SceneDataset(strict, context_gap=(2, 5), split="eval")[0]
    with pytest.raises(ValueError, match="a bug") as info:
        make(ValueError("a bug"))[0]
    assert not isinstance(info.value, SceneError)
    short = SceneDataset(Source(SceneError("unused")), context_gap=(20, 30), split="eval")
    with pytest.raises(SceneError, match="none of the 2 scenes.*impossible view sampling"):
        short[1]  # both videos too short: each skipped, then a clear error


@pytest.mark.parametrize("name", ["re10k", "dl3dv", "co3d", "folder"])
def test_example_configs_resolve(name):
    from hrope.nvs.config import load_config
    from hrope.nvs.data import LOADERS

    config = load_config(Path(__file__).parents[1] / "configs" / f"{name}.yaml")
    assert config.data.kind in LOADERS and config.data.root
