"""Planes on real data behind ``--predictor external``: sparse depth from COLMAP points, depth and
normal maps on disk, a user depth model; the robust per-patch fit; ``hrope viz planes`` on real runs.
Fixtures are synthetic renders written out in the real formats."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from _lvsm_helpers import SMALL_MODEL  # (importing it sets one torch thread)
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image
from safetensors.torch import save_file

from hrope import Cameras, Planes, get_encoding
from hrope.geometry import patchify, pixel_rays
from hrope.nvs.cli import run
from hrope.nvs.config import ConfigError, resolve
from hrope.nvs.data import SceneError, make_scene, normalize_scene, resize_crop_scene
from hrope.nvs.data.batch import collate_scenes
from hrope.nvs.build_data import build_dataset
from hrope.nvs.data.real.colmap import quaternion_to_rotation
from hrope.nvs.data.real.colmap_points import rotation_to_quaternion, write_colmap_model
from hrope.nvs.data.real.depth_maps import with_depth_maps
from hrope.nvs.data.real.frames import Frame, pinhole
from hrope.nvs.data.real.loaders import SceneFolderSource
from hrope.nvs.sources.plane_fitting import robust_patch_planes
from hrope.nvs.sources import PredictorError, build_parameter_source, parameter_specs

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
    "--data.num_scenes",
    "null",
    "--eval.num_scenes",
    "null",
]
FRAMES = list(range(0, 60, 10))  # 6 views per scene
GRID = (4, 4)


def room(size=(32, 32), index: int = 0):
    return make_scene(5, index, "room", len(FRAMES), size, frames=FRAMES)


@pytest.fixture(scope="module")
def colmap_root(tmp_path_factory):
    """Two COLMAP scene folders of 32x32 renders with 300 SfM points per view, and their scenes."""
    root = tmp_path_factory.mktemp("colmap")
    scenes = [room(index=i) for i in range(2)]
    for i, scene in enumerate(scenes):
        write_colmap_model(scene, root / f"scene_{i}", points_per_view=300)
    return root, scenes


def single_plane_patches(plane_m: torch.Tensor, p: int = 8) -> torch.Tensor:
    """``(B, N)``: patches whose pixels all see one plane (``plane_m (B, V, 3, H, W)``)."""
    m = patchify(plane_m, p)  # (B, V, P, 3, p*p)
    return ((m - m[..., :1]).abs().amax((-1, -2)) < 1e-6).flatten(1)


def plane_depth(m: torch.Tensor, cameras: Cameras) -> torch.Tensor:
    """z-depth ``(B, V, H, W)`` of the plane ``m · X = 1`` seen by every pixel."""
    return 1.0 / (pixel_rays(cameras.K, cameras.image_size) @ m)


def test_quaternions_round_trip():
    for q in torch.randn(20, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0)):
        R = quaternion_to_rotation(q)
        torch.testing.assert_close(quaternion_to_rotation(rotation_to_quaternion(R)), R, atol=1e-12, rtol=0)


def test_sparse_depth_from_points3d_reprojects_exactly(colmap_root):
    """Points at pixel centres come back at their pixels with their depth, rescaled by the scene
    normalisation like the cameras, and give the ground-truth plane where a patch sees one plane."""
    root, scenes = colmap_root
    config = resolve(
        {
            "model": {**SMALL_MODEL, "preset": None},
            "data": {"kind": "colmap", "root": str(root), "depth": "points", "num_scenes": None},
            "eval": {"num_scenes": None},
        }
    )
    dataset = build_dataset(config, "eval")
    for i in range(2):
        item, views = dataset[i], dataset.frames(i, len(FRAMES))
        truth = normalize_scene(scenes[i].select_views(views), [0, 1])
        seen = torch.isfinite(item.depth)
        assert seen.flatten(1).sum(1).tolist() == [300] * len(views)
        torch.testing.assert_close(item.depth[seen], truth.depth[seen], atol=0, rtol=5e-5)  # measured 5e-6 (float32)
        fitted = robust_patch_planes(item.depth[None], item.cameras, 8).m(item.cameras, GRID)
        exact = truth.planes(8).m(truth.cameras, GRID)
        enough = patchify(seen[None, :, None].float(), 8).sum(-1)[..., 0].flatten(1) >= 5
        chosen = single_plane_patches(truth.plane_m[None]) & enough
        assert chosen.sum() >= 10
        torch.testing.assert_close(fitted[chosen], exact[chosen], atol=1e-4, rtol=1e-4)


def test_sparse_depth_uses_the_final_cameras(tmp_path):
    """Loaded at another size (resize + centre crop), points are projected with the final cameras:
    their depth matches the resized ground truth at their pixel (a point moves by under a pixel)."""
    scene = room((36, 48))
    write_colmap_model(scene, tmp_path / "scene", points_per_view=300)
    loaded = SceneFolderSource(tmp_path / "scene", depth="points", image_size=(32, 32)).load_views(0, [0, 2, 4])
    truth = resize_crop_scene(scene.select_views([0, 2, 4]), (32, 32))
    seen = torch.isfinite(loaded.depth)
    error = ((loaded.depth - truth.depth).abs() / truth.depth)[seen]
    # measured: median 1.6e-7 (float32), 90th percentile 0.0026 (the nearest-neighbour ground truth is
    # another native pixel's depth on slanted planes)
    assert seen.sum() > 500 and error.median() < 1e-6 and error.quantile(0.9) < 0.005


def test_too_few_points_is_a_scene_error_naming_the_scene_and_counts(tmp_path):
    write_colmap_model(room(), tmp_path / "sparse_scene", points_per_view=1)
    source = SceneFolderSource(tmp_path / "sparse_scene", depth="points", skip_errors=False)
    with pytest.raises(SceneError, match=r"sparse_scene: too few SfM points for any plane: .* see \[1, 1\] point"):
        source.load_views(0, [0, 3])
    points3d = tmp_path / "sparse_scene" / "sparse" / "0" / "points3D.txt"
    lines = points3d.read_text().splitlines()
    points3d.write_text("\n".join(lines[:1] + lines[2:]) + "\n")  # point 1 removed, the header kept
    with pytest.raises(SceneError, match=r"points3D.txt: the header declares 6 points, the file has 5"):
        source.load_views(0, [0, 3])
    points3d.write_text("\n".join(lines[2:]) + "\n")
    with pytest.raises(SceneError, match=r"images.txt:2: field POINTS2D refers to POINT3D_ID 1, which .* does not"):
        source.load_views(0, [0, 3])
    points3d.write_text("1 0 0 nan 0 0 0 0\n")
    with pytest.raises(SceneError, match=r"points3D.txt:1: field X Y Z must be finite"):
        source.load_views(0, [0, 3])
    points3d.unlink()
    with pytest.raises(SceneError, match="points3D.txt: cannot read the COLMAP points"):
        source.load_views(0, [0, 3])


@settings(max_examples=15, deadline=None)
@given(normal=st.tuples(*[st.floats(-0.6, 0.6)] * 2), depth=st.floats(1.0, 4.0), seed=st.integers(0, 2**16))
def test_robust_fit_ignores_far_outliers(normal, depth, seed):
    """A slanted plane seen by 40 sparse pixels per patch, 8 of them (20 %) pushed 1.5-3x further
    away: the robust fit gives the plane back, the least-squares fit does not."""
    cameras = Cameras(torch.tensor([[[[30.0, 0, 16], [0, 30.0, 16], [0, 0, 1]]]]), torch.eye(4)[None, None], (32, 32))
    n = torch.tensor([normal[0], normal[1], -1.0])
    m = n / (n @ torch.tensor([0.0, 0.0, depth]))  # through the point at depth on the optical axis
    truth = plane_depth(m, cameras)
    generator = torch.Generator().manual_seed(seed)
    order = patchify(torch.rand(1, 1, 1, 32, 32, generator=generator), 8).argsort(-1)  # per patch, random pixels
    rank = torch.empty_like(order).scatter_(-1, order, torch.arange(64).expand_as(order))
    rank = rank.reshape(1, 1, 4, 4, 8, 8).transpose(3, 4).reshape(1, 1, 32, 32)  # back to pixels
    sparse = torch.where(rank < 40, truth, torch.inf)
    far = 1.5 + 1.5 * torch.rand(sparse.shape, generator=generator)
    noisy = torch.where(rank < 8, sparse * far, sparse)
    robust = robust_patch_planes(noisy, cameras, 8).m(cameras, GRID)
    torch.testing.assert_close(robust, m.expand_as(robust), atol=1e-5, rtol=1e-4)
    least_squares = Planes.from_depth(noisy, cameras, 8).m(cameras, GRID)
    assert (least_squares - m).norm(dim=-1).min() > 1e-2 * m.norm()


def test_fallback_where_points_are_missing():
    """Too few points: the fronto-parallel plane at the patch's median depth, at the view's median
    depth for a patch without points, the plane at infinity for a view without points; ``infinity``
    gives m = 0 everywhere it applies."""
    cameras = Cameras(
        torch.tensor([[30.0, 0, 16], [0, 30.0, 16], [0, 0, 1]]).expand(1, 2, 3, 3),
        torch.eye(4).expand(1, 2, 4, 4),
        (32, 32),
    )
    depth = torch.full((1, 2, 32, 32), torch.inf)
    depth[0, 0, 0, 0], depth[0, 0, 2, 3], depth[0, 0, 5, 5] = 2.0, 3.0, 7.0  # patch 0: three points
    depth[0, 0, 8:16, 8:16] = 4.0  # patch 5: a full fronto-parallel patch (fitted)
    m = robust_patch_planes(depth, cameras, 8, min_points=5).m(cameras, GRID)
    view_median = depth[0, 0][torch.isfinite(depth[0, 0])].median()
    torch.testing.assert_close(m[0, 0], torch.tensor([0, 0, 1 / 3.0]))  # the patch's median point depth
    torch.testing.assert_close(m[0, 5], torch.tensor([0, 0, 1 / 4.0]))
    torch.testing.assert_close(m[0, 1], torch.tensor([0, 0, 1 / float(view_median)]))
    assert (m[0, 16:] == 0).all()  # the second view has no point
    infinity = robust_patch_planes(depth, cameras, 8, fallback="infinity").m(cameras, GRID)
    assert (infinity[0, [0, 1]] == 0).all() and torch.equal(infinity[0, 5], m[0, 5])


def write_nerfstudio_with_maps(folder: Path, scene) -> None:
    """``transforms.json`` + PNG frames, depth maps (``.npy`` for even frames, 16-bit millimetre
    PNG for odd ones) and ``.npy`` normal maps."""
    (folder / "images").mkdir(parents=True)
    frames = []
    for v in range(scene.num_views):
        c2w = torch.linalg.inv(scene.cameras.world_to_cam[0, v].double())
        c2w_gl = torch.stack([c2w[:, 0], -c2w[:, 1], -c2w[:, 2], c2w[:, 3]], 1)
        image = (scene.images[v].permute(1, 2, 0) * 255).round().byte().numpy()
        Image.fromarray(image).save(folder / "images" / f"{v}.png")
        depth = scene.depth[v].numpy()
        if v % 2:
            millimetres = np.where(np.isfinite(depth), np.round(depth * 1000), 0).astype(np.uint16)
            Image.fromarray(millimetres).save(folder / f"depth_{v}.png")
        else:
            np.save(folder / f"depth_{v}.npy", depth)
        np.save(folder / f"normal_{v}.npy", -scene.normals[v].permute(1, 2, 0).numpy())  # facing away: flipped back
        K = scene.cameras.K[0, v]
        frames.append(
            {
                "file_path": f"images/{v}.png",
                "transform_matrix": c2w_gl.tolist(),
                "depth_file_path": f"depth_{v}.{'png' if v % 2 else 'npy'}",
                "normal_file_path": f"normal_{v}.npy",
            }
        )
    meta = {
        "fl_x": float(K[0, 0]),
        "fl_y": float(K[1, 1]),
        "cx": float(K[0, 2]),
        "cy": float(K[1, 2]),
        "w": scene.image_size[1],
        "h": scene.image_size[0],
        "frames": frames,
    }
    (folder / "transforms.json").write_text(json.dumps(meta))


def test_depth_maps_load_with_their_scale_and_corrupt_ones_name_the_file(tmp_path):
    scene = room((36, 48))
    folder = tmp_path / "captured"
    write_nerfstudio_with_maps(folder, scene)
    views = [0, 1, 2, 3]
    loaded = SceneFolderSource(folder, depth="maps").load_views(0, views)
    truth = scene.select_views(views)
    seen = torch.isfinite(truth.depth)
    assert torch.equal(torch.isfinite(loaded.depth), seen)
    torch.testing.assert_close(loaded.depth[0::2], truth.depth[0::2], atol=0, rtol=0)  # .npy: as written
    assert (loaded.depth[1::2] - truth.depth[1::2])[seen[1::2]].abs().max() < 0.0005 + 1e-6  # whole millimetres
    torch.testing.assert_close(loaded.normals, truth.normals, atol=1e-6, rtol=0)  # turned to face the camera
    resized = SceneFolderSource(folder, depth="maps", image_size=(32, 32)).load_views(0, [0])
    assert torch.equal(resized.depth, resize_crop_scene(truth.select_views([0]), (32, 32)).depth)
    metres = SceneFolderSource(folder, depth="maps", depth_scale=1.0).load_views(0, [1])
    torch.testing.assert_close(metres.depth, loaded.depth[1:2] * 1000, atol=0, rtol=1e-6)

    (folder / "depth_1.png").write_bytes(b"\x89PNG not really")
    with pytest.raises(SceneError, match=r"frames\[1\].*cannot read depth map .*depth_1\.png"):
        SceneFolderSource(folder, depth="maps").load_views(0, [1])
    Image.fromarray(np.zeros((36, 48), np.uint8)).save(folder / "depth_1.png")
    with pytest.raises(SceneError, match=r"depth_1\.png must be a single-channel 16-bit PNG"):
        SceneFolderSource(folder, depth="maps").load_views(0, [1])
    np.save(folder / "depth_0.npy", -np.ones((36, 48), np.float32))
    with pytest.raises(SceneError, match=r"depth_0\.npy has negative values"):
        SceneFolderSource(folder, depth="maps").load_views(0, [0])
    np.save(folder / "depth_2.npy", np.ones((10, 10), np.float32))
    with pytest.raises(SceneError, match=r"depth_2\.npy is 10x10, its image 36x48"):
        SceneFolderSource(folder, depth="maps").load_views(0, [2])
    write_colmap_model(room(), tmp_path / "colmap")
    with pytest.raises(SceneError, match="images.txt:2: data.depth 'maps' needs a depth map per frame"):
        SceneFolderSource(tmp_path / "colmap", depth="maps").load_views(0, [0])
    with pytest.raises(SceneError, match=r"frames\[0\]: data.depth 'points' needs a COLMAP model"):
        SceneFolderSource(folder, depth="points").load_views(0, [0])
    meta = json.loads((folder / "transforms.json").read_text())
    meta["frames"][0]["depth_file_path"] = 7
    (folder / "transforms.json").write_text(json.dumps(meta))
    with pytest.raises(SceneError, match=r"frames\[0\]: fields 'depth_file_path' and 'normal_file_path' must be"):
        SceneFolderSource(folder, depth="maps").load_views(0, [1])
    with pytest.raises(ConfigError, match="data.depth 'maps' is for scene folders"):
        build_dataset(resolve({"data": {"kind": "re10k", "root": str(tmp_path), "depth": "maps"}}))
    with pytest.raises(ConfigError, match="data.depth are for real data"):
        build_dataset(resolve({"data": {"depth": "points"}}))


def test_a_depth_map_whose_image_bytes_do_not_decode_names_the_frame_not_the_bytes(tmp_path):
    np.save(tmp_path / "depth.npy", np.ones((36, 48), np.float32))
    K, world_to_cam = pinhole(40.0, 40.0, 24.0, 18.0), torch.eye(4, dtype=torch.float64)
    frame = Frame(b"not an image file", K, world_to_cam, label="chunk[0]", depth_map=tmp_path / "depth.npy")
    with pytest.raises(
        SceneError, match=r"^chunk\[0\]: the encoded image is in no image format PIL can read$"
    ) as error:
        with_depth_maps(room((36, 48)).select_views([0]), [frame])
    assert "not an image file" not in str(error.value)


def test_depth_maps_are_undistorted_like_their_images(tmp_path):
    """A distorted capture: the depth map moves with the image (no depth where the lens saw nothing)."""
    (tmp_path / "images").mkdir()
    Image.fromarray(np.full((32, 32, 3), 255, np.uint8)).save(tmp_path / "images" / "0.png")
    np.save(tmp_path / "depth.npy", np.full((32, 32), 2.0, np.float32))
    frame = {"file_path": "images/0.png", "transform_matrix": torch.eye(4).tolist(), "depth_file_path": "depth.npy"}
    meta = {"fl_x": 20.0, "fl_y": 20.0, "cx": 16.0, "cy": 16.0, "w": 32, "h": 32, "k1": 0.5, "frames": [frame]}
    (tmp_path / "transforms.json").write_text(json.dumps(meta))
    scene = SceneFolderSource(tmp_path, depth="maps").load_views(0, [0])
    black, seen = scene.images[0].amax(0) == 0, torch.isfinite(scene.depth[0])
    assert black.any() and not (black & seen).any() and (scene.depth[0][seen] == 2.0).all()
    assert seen.float().mean() > 0.5 and not (~seen & (scene.images[0].amin(0) == 1)).any()


DEPTH_MODULE = """
import torch
from torch import nn


class ScaledOnes(nn.Module):
    \"\"\"A stand-in depth model: ``scale`` everywhere, at half resolution (resized by the source).\"\"\"

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(()))

    def forward(self, images):
        return self.scale * images.new_ones(len(images), 1, 16, 16)
"""


def test_depth_model_is_loaded_locally_and_aligned_to_the_sparse_depth(colmap_root, tmp_path, monkeypatch):
    root, _ = colmap_root
    (tmp_path / "my_depth.py").write_text(DEPTH_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    save_file({"scale": torch.tensor(2.5)}, str(tmp_path / "depth.safetensors"))
    scenes = [SceneFolderSource(root, depth="points").load_views(0, [0, 2, 4])]
    batch = collate_scenes([normalize_scene(s, [0, 1]) for s in scenes], 2)
    specs = parameter_specs(get_encoding("hrope-lift"))
    options = {"depth": "model", "module": "my_depth:ScaledOnes", "checkpoint": str(tmp_path / "depth.safetensors")}
    source = build_parameter_source("external", specs, dim=4, num_layers=1, patch_size=8, options=options)
    assert float(source.depth_model.scale) == 2.5 and not source.train().depth_model.training
    m = source.static(batch, batch.cameras, GRID, 2)["planes"].reshape(1, 3, 16, 3)
    for v in range(2):  # fronto-parallel at the median sparse depth of the view (context views only)
        median = batch.depth[0, v][torch.isfinite(batch.depth[0, v])].median()
        torch.testing.assert_close(m[0, v], torch.tensor([0, 0, 1 / float(median)]).expand(16, 3))
    assert (m[0, 2] == 0).all()  # the target: neutral
    raw = build_parameter_source(
        "external", specs, dim=4, num_layers=1, patch_size=8, options={**options, "align": "none"}
    ).static(batch, batch.cameras, GRID, 2)
    torch.testing.assert_close(raw["planes"][0, :32], torch.tensor([0, 0, 1 / 2.5]).expand(32, 3))
    identity = build_parameter_source(
        "external", specs, dim=4, num_layers=1, patch_size=8, options={"depth": "model", "module": torch.nn.Identity()}
    )
    with pytest.raises(PredictorError, match=r"must return \(N, H, W\) or \(N, 1, H, W\) depth for N = 2 images"):
        identity.static(batch, batch.cameras, GRID, 2)
    batch.depth = None
    with pytest.raises(PredictorError, match="align 'median' scales the depth model's output"):
        source.static(batch, batch.cameras, GRID, 2)
    with pytest.raises(PredictorError, match="cannot be imported"):
        build_parameter_source(
            "external",
            specs,
            dim=4,
            num_layers=1,
            patch_size=8,
            options={"depth": "model", "module": "no_such_module:build"},
        )
    for bad, message in (
        ({"fit": "sideways"}, "fit must be one of least-squares, robust"),
        ({"min_points": 2}, "min_points must be an integer >= 3"),
        ({"depth": "model"}, "module is the depth model of depth: model"),
    ):
        with pytest.raises(PredictorError, match=message):
            build_parameter_source("external", specs, dim=4, num_layers=1, patch_size=8, options=bad)


def figure_columns(path: Path, cell: int = 32, pad: int = 2) -> int:
    return (Image.open(path).width - pad) // (cell + pad)


def hrope_lift_training(out: Path, steps: int, *predictor: str) -> list[str]:
    """The ``hrope train`` arguments of the tiny hrope-lift model (``predictor``: its source flags)."""
    return ["train", TINY, "--encoding", "hrope-lift", *predictor, "--steps", str(steps), "--out", str(out), *SMALL]


def test_external_planes_train_on_a_colmap_folder_and_viz_planes_draws_real_runs(colmap_root, tmp_path, capsys):
    root, _ = colmap_root
    data = ["--data.kind", "folder", "--data.root", str(root), "--data.cache", "false"]  # nothing outside tmp
    external = tmp_path / "external"
    depth = ["--data.depth", "points", "--model.predictor_options", "{fit: robust, targets: transfer}"]
    assert run([*hrope_lift_training(external, 2, "--predictor", "external"), *data, *depth]) == 0
    assert "trained 2 steps" in capsys.readouterr().out
    assert run(["eval", str(external)]) == 0
    assert 0 < json.loads((external / "eval" / "results.json").read_text())["metrics"]["psnr"] < 60
    assert run(["eval", str(external), "--protocol", "standard"]) == 0  # the protocols load the depth too
    standard = json.loads((external / "eval" / "standard" / "results.json").read_text())[0]
    assert 0 < standard["points"][0]["metrics"]["psnr"] < 60
    assert run(["viz", "planes", str(external), "--num-scenes", "1"]) == 0
    assert figure_columns(external / "viz" / "planes.png") == 4  # the sparse depth's own fit as the last column

    learned = tmp_path / "learned"  # no depth at all: no ground-truth column
    assert run([*hrope_lift_training(learned, 1), *data]) == 0
    assert run(["viz", "planes", str(learned), "--num-scenes", "1"]) == 0
    assert figure_columns(learned / "viz" / "planes.png") == 3
    capsys.readouterr()
    assert run([*hrope_lift_training(tmp_path / "no_depth", 1, "--predictor", "external"), *data]) == 2
    assert "set data.depth (points: COLMAP points3D.txt" in capsys.readouterr().err
