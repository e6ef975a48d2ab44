"""LVSM's training recipe as options: its normalisation, its view sampling, its step skipping, its
VGG-19 perceptual loss and LPIPS-VGG (both from local weights, checked against references written
from the descriptions in docs/model.md, not from the modules under test)."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from _lvsm_helpers import VGG_CONVOLUTIONS, random_lpips_weights, random_vgg_weights, small_config, synthetic_batch

from hrope.cameras import Cameras
from hrope.nvs.build_data import build_dataset
from hrope.nvs.config import ConfigError, load_config, resolve, update_config
from hrope.nvs.data import make_scene
from hrope.nvs.data.dataset import SyntheticDataset, TooFewFramesError, sample_lvsm_views
from hrope.nvs.data.normalize import LVSM_SCALE, normalize_lvsm
from hrope.nvs.data.rng import Rng
from hrope.nvs.data.scene import SceneError
from hrope.nvs.evaluation.metrics import LPIPS, MetricError
from hrope.nvs.evaluation.vgg import VGGFeatures
from hrope.nvs.model import build_model
from hrope.nvs.running.perceptual import VGGPerceptualLoss
from hrope.nvs.running.train import train
from hrope.nvs.running.train_step import make_optimizer, perceptual_loss, train_step
from hrope.testing import random_se3


# ----------------------------------------------------------------------------- normalisation
def lvsm_normalized_poses(world_to_cam: np.ndarray) -> np.ndarray:
    """LVSM's preprocess_poses written out in numpy (float64): camera-to-world poses ``c2w`` (V, 4, 4)
    moved into the average camera's frame, then translations divided by 1.35 max|t|; returned as
    world-to-camera."""
    c2w = np.linalg.inv(world_to_cam)
    center = c2w[:, :3, 3].mean(0)
    forward = c2w[:, :3, 2].mean(0)
    forward /= np.linalg.norm(forward)
    right = np.cross(c2w[:, :3, 1].mean(0), forward)
    right /= np.linalg.norm(right)
    down = np.cross(forward, right)
    down /= np.linalg.norm(down)
    average = np.eye(4)
    average[:3, :3] = np.stack([right, down, forward], axis=1)
    average[:3, 3] = center
    c2w = np.linalg.inv(average) @ c2w
    c2w[:, :3, 3] /= 1.35 * np.abs(c2w[:, :3, 3]).max()
    return np.linalg.inv(c2w)


def test_lvsm_normalisation_is_lvsms_and_world_frame_free():
    scene = make_scene(0, 3, "room", num_views=5, image_size=(16, 16))
    normalized = normalize_lvsm(scene)
    want = lvsm_normalized_poses(scene.cameras.world_to_cam[0].double().numpy())
    got = normalized.cameras.world_to_cam[0].double().numpy()
    assert np.abs(got - want).max() < 1e-6  # the scene's float32 poses, re-expressed in float64
    centres = torch.linalg.inv(normalized.cameras.world_to_cam[0].double())[:, :3, 3]
    assert centres.abs().max().item() == pytest.approx(1 / LVSM_SCALE, abs=1e-6)
    # the same cameras in another world frame and unit: the same normalised scene
    G = random_se3(generator=torch.Generator().manual_seed(0))
    moved_E = scene.cameras.world_to_cam.double() @ torch.linalg.inv(G)
    moved_E[..., :3, 3] *= 3.7
    moved = replace(scene, cameras=Cameras(scene.cameras.K, moved_E, scene.cameras.image_size), depth=scene.depth * 3.7)
    again = normalize_lvsm(moved)
    torch.testing.assert_close(again.cameras.world_to_cam.double(), normalized.cameras.world_to_cam.double())
    seen = torch.isfinite(normalized.depth)
    assert seen.any()
    torch.testing.assert_close(again.depth[seen], normalized.depth[seen])  # depth follows the scale
    single = scene.select_views([0, 0])
    with pytest.raises(SceneError, match="camera centres coincide"):
        normalize_lvsm(single)


# ----------------------------------------------------------------------------- view sampling
def test_lvsm_views_are_distinct_frames_with_targets_among_all_of_them():
    context_as_target, draws = 0, 400
    for i in range(draws):
        frames, example = sample_lvsm_views(300, 2, 6, Rng("lvsm-views", i), context_gap=(25, 192))
        first, last = frames[:2]
        assert len(set(frames)) == 8 and 25 <= last - first <= 192 and 0 <= first and last < 300
        assert all(first < f < last for f in frames[2:])
        assert example[:2] == [0, 1] and len(set(example[2:])) == 6 and set(example[2:]) <= set(range(8))
        context_as_target += sum(position < 2 for position in example[2:])
    assert abs(context_as_target / (6 * draws) - 0.25) < 0.03  # each target is a context view 1/4 of the time
    short, _ = sample_lvsm_views(40, 2, 6, Rng("short"), context_gap=(25, 192))
    assert 25 <= short[1] - short[0] <= 39
    with pytest.raises(TooFewFramesError, match="need 26 frames, the video has 20"):
        sample_lvsm_views(20, 2, 6, Rng("x"), context_gap=(25, 192))


def test_lvsm_sampling_normalises_over_all_sampled_views():
    dataset = SyntheticDataset(
        "room", 2, image_size=(16, 16), num_context=2, num_target=3, sampling="lvsm", normalization="lvsm"
    )
    example = dataset[1]
    frames, positions = dataset.plan(1, dataset.config.num_frames)
    pool = make_scene(dataset.scene_seed, 1, "room", len(frames), (16, 16), frames=frames, config=dataset.config)
    want = normalize_lvsm(pool).select_views(positions)
    assert example.num_views == 5 and len(frames) == 5
    torch.testing.assert_close(example.cameras.world_to_cam, want.cameras.world_to_cam)
    torch.testing.assert_close(example.images, want.images)
    held_out = SyntheticDataset("room", 2, image_size=(16, 16), num_target=3, split="eval", sampling="lvsm")
    assert held_out.plan(0, held_out.config.num_frames)[1] is None  # held-out views: fixed, as before


def test_the_data_options_reach_the_dataset():
    config = update_config(small_config(), {"data": {"view_sampling": "lvsm", "normalize": "lvsm", "num_target": 2}})
    assert (config.data.view_sampling, config.data.normalize) == ("lvsm", "lvsm")
    dataset = build_dataset(config, "train").dataset
    assert (dataset.sampling, dataset.normalization) == ("lvsm", "lvsm")
    default = build_dataset(small_config(), "train").dataset
    assert (default.sampling, default.normalization) == ("uniform", "context")


# ----------------------------------------------------------------------------- step skipping
def test_a_step_whose_gradient_norm_exceeds_the_bound_is_skipped(tmp_path):
    config = small_config()
    model = build_model(config)
    options = replace(config.train, grad_clip=1e-6, skip_grad_factor=5.0)
    optimizer = make_optimizer(model, options)
    before = [p.detach().clone() for p in model.parameters()]
    result = train_step(model, optimizer, synthetic_batch(), 0, options)
    assert result.finite and not result.applied and float(result.grad_norm) > 5e-6
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    applied = train_step(model, optimizer, synthetic_batch(), 0, replace(options, skip_grad_factor=None))
    assert applied.applied and not all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    config = update_config(
        config, {"train": {"out": str(tmp_path / "run"), "grad_clip": 1e-6, "skip_grad_factor": 1.0}}
    )
    run = train(config, progress=False)  # every step skipped: counted, not a divergence
    assert run.outcome == "completed" and run.skipped_steps == config.train.steps


# ----------------------------------------------------------------------------- VGG networks
def reference_taps(state: dict, x: torch.Tensor, program: str, pool) -> list[torch.Tensor]:
    """Feature maps in float64 from a program of conv indices (each + ReLU), ``P`` (pool) and ``T`` (tap)."""
    taps = []
    for op in program.split():
        if op == "P":
            x = pool(x, 2)
        elif op == "T":
            taps.append(x)
        else:
            x = F.relu(
                F.conv2d(x, state[f"features.{op}.weight"].double(), state[f"features.{op}.bias"].double(), 1, 1)
            )
    return taps


# LVSM's taps relu1_2, relu2_2, relu3_2, relu4_2, relu5_2 of VGG-19 (average pools); LPIPS-VGG's
# relu1_2, relu2_2, relu3_3, relu4_3, relu5_3 of VGG-16 (max pools)
LVSM_PROGRAM = "0 2 T P 5 7 T P 10 12 T 14 16 P 19 21 T 23 25 P 28 30 T"
LPIPS_PROGRAM = "0 2 T P 5 7 T P 10 12 14 T P 17 19 21 T P 24 26 28 T"
# float32 modules against the float64 references, 32x32 images: measured <= 1e-7 relative (5 seeds); 10x margin
RTOL = 1e-6


def test_vgg_features_have_torchvisions_layout():
    for layout, convolutions in VGG_CONVOLUTIONS.items():
        features = VGGFeatures(layout, last=len(convolutions) + 4 + len(convolutions) - 1)
        shapes = {k: tuple(v.shape) for k, v in features.state_dict().items()}
        assert shapes == {
            **{f"{i}.weight": (o, c, 3, 3) for i, (c, o) in convolutions.items()},
            **{f"{i}.bias": (o,) for i, (c, o) in convolutions.items()},
        }
    with pytest.raises(ValueError, match="last must be a layer index"):
        VGGFeatures("vgg16", last=31)


def test_lvsm_perceptual_loss_matches_its_description(tmp_path):
    state = random_vgg_weights(tmp_path / "vgg19.safetensors", "vgg19")
    loss = VGGPerceptualLoss(tmp_path / "vgg19.safetensors")
    torch.manual_seed(0)
    a, b = torch.rand(2, 3, 32, 32, requires_grad=True), torch.rand(2, 3, 32, 32)
    mean = torch.tensor([123.68, 116.779, 103.939], dtype=torch.float64)[None, :, None, None]
    x, y = a.detach().double() * 255 - mean, b.double() * 255 - mean
    want = (x - y).abs().mean((1, 2, 3))
    taps = zip(
        reference_taps(state, x, LVSM_PROGRAM, F.avg_pool2d), reference_taps(state, y, LVSM_PROGRAM, F.avg_pool2d)
    )
    for (p, q), divisor in zip(taps, (2.6, 4.8, 3.7, 5.6, 0.15)):
        want = want + (p - q).abs().mean((1, 2, 3)) / divisor
    got = loss(a, b)
    torch.testing.assert_close(got.double(), want / 255, rtol=RTOL, atol=0)
    torch.testing.assert_close(loss(b, a), got)
    assert (loss(b, b) == 0).all()
    got.sum().backward()
    assert a.grad is not None and torch.isfinite(a.grad).all() and a.grad.abs().sum() > 0
    random_vgg_weights(tmp_path / "vgg19.pth", "vgg19")  # a torch.save file, read with weights_only
    torch.testing.assert_close(VGGPerceptualLoss(tmp_path / "vgg19.pth")(a, b), got)


def test_lpips_vgg_matches_its_description(tmp_path):
    state = random_vgg_weights(tmp_path / "lpips_vgg.safetensors", "vgg16", lpips_heads=True)
    lpips = LPIPS(tmp_path / "lpips_vgg.safetensors", "vgg")
    assert lpips.name == "LPIPS-VGG"
    torch.manual_seed(1)
    a, b = torch.rand(2, 3, 32, 32, requires_grad=True), torch.rand(2, 3, 32, 32)
    shift = torch.tensor([-0.030, -0.088, -0.188], dtype=torch.float64)[None, :, None, None]
    scale = torch.tensor([0.458, 0.448, 0.450], dtype=torch.float64)[None, :, None, None]
    x, y = ((t.detach().double() * 2 - 1 - shift) / scale for t in (a, b))
    want = 0
    for i, (p, q) in enumerate(
        zip(
            reference_taps(state, x, LPIPS_PROGRAM, F.max_pool2d), reference_taps(state, y, LPIPS_PROGRAM, F.max_pool2d)
        )
    ):
        p, q = (
            p / (p.square().sum(1, keepdim=True).sqrt() + 1e-10),
            q / (q.square().sum(1, keepdim=True).sqrt() + 1e-10),
        )
        want = want + ((p - q).square() * state[f"lin{i}.model.1.weight"].double()).sum(1).mean((1, 2))
    got = lpips(a, b)
    torch.testing.assert_close(got.double(), want, rtol=RTOL, atol=0)
    torch.testing.assert_close(lpips(b, a), got)
    assert (lpips(b, b) == 0).all() and torch.isfinite(got).all()
    got.sum().backward()
    assert a.grad is not None and torch.isfinite(a.grad).all() and a.grad.abs().sum() > 0


def test_weights_of_another_network_are_one_line_errors(tmp_path):
    random_lpips_weights(tmp_path / "alex.safetensors")
    with pytest.raises(MetricError) as error:
        LPIPS(tmp_path / "alex.safetensors", "vgg")
    message = str(error.value)
    assert "\n" not in message and message.startswith("LPIPS-VGG weights ") and " lack features." in message
    assert "have mis-shaped features.0.weight (64, 3, 11, 11)" in message
    random_vgg_weights(tmp_path / "vgg16.safetensors", "vgg16")
    with pytest.raises(MetricError, match="have mis-shaped features.0.weight"):
        LPIPS(tmp_path / "vgg16.safetensors", "alex")
    with pytest.raises(MetricError, match="VGG-19 perceptual loss weights .* lack features.16.bias"):
        VGGPerceptualLoss(tmp_path / "vgg16.safetensors")
    (tmp_path / "junk.pth").write_bytes(b"not a checkpoint")
    with pytest.raises(MetricError, match="cannot be read: ") as error:
        VGGPerceptualLoss(tmp_path / "junk.pth")
    assert "\n" not in str(error.value)
    with pytest.raises(MetricError, match="must be one of alex, vgg"):
        LPIPS(tmp_path / "alex.safetensors", "squeeze")


def test_the_vgg19_perceptual_loss_trains(tmp_path):
    values = {"out": str(tmp_path / "run"), "steps": 1, "perceptual_weight": 0.5, "perceptual_loss": "vgg19"}
    with pytest.raises(ConfigError, match="train.vgg19_weights"):
        update_config(small_config(), {"train": values})
    random_vgg_weights(tmp_path / "vgg19.safetensors", "vgg19")
    config = update_config(small_config(), {"train": {**values, "vgg19_weights": str(tmp_path / "vgg19.safetensors")}})
    assert isinstance(perceptual_loss(config, torch.device("cpu")), VGGPerceptualLoss)
    assert train(config, progress=False).outcome == "completed"


def test_checkpointed_blocks_give_the_same_gradients():
    grads = []
    for checkpoint_blocks in (False, True):
        torch.manual_seed(0)
        model = build_model(small_config(encoding="prope", checkpoint_blocks=checkpoint_blocks)).train()
        model(synthetic_batch(num_views=4)).images.square().sum().backward()
        grads.append({name: p.grad for name, p in model.named_parameters()})
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=0, atol=0, msg=name)


LVSM_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "lvsm_re10k.yaml"


def test_the_lvsm_config_is_lvsms_recipe_and_trains(tmp_path):
    config = load_config(LVSM_CONFIG)
    model = config.model
    assert (model.dim, model.layers, model.heads, model.patch_size, model.image_size) == (768, 24, 12, 8, 256)
    assert model.encoding == "none" and model.ray_frame == "world" and model.qk_norm_eps == 1e-5
    assert model.checkpoint_blocks
    data, options = config.data, config.train
    assert data.context_gap == [25, 192] and (data.num_context, data.num_target) == (2, 6)
    assert (data.view_sampling, data.normalize, config.eval.lpips_net) == ("lvsm", "lvsm", "vgg")
    assert (options.warmup, options.min_lr_ratio, options.skip_grad_factor) == (3000, 0.0, 5.0)
    assert (options.perceptual_loss, options.perceptual_weight, options.lr) == ("vgg19", 0.5, 4e-4)
    # the same recipe on a small model and synthetic rooms, a few steps on the CPU
    plain, small = config.to_dict(), small_config().to_dict()
    plain["model"] = {**small["model"], "encoding": "none", "qk_norm_eps": 1e-5, "checkpoint_blocks": True}
    plain["data"].update(kind="room", root=None, eval_root=None, eval_index=None, context_gap=[25, 60], num_scenes=2)
    plain["eval"]["num_scenes"] = 2
    random_vgg_weights(tmp_path / "vgg19.safetensors", "vgg19")
    plain["train"].update(small["train"], out=str(tmp_path / "run"), vgg19_weights=str(tmp_path / "vgg19.safetensors"))
    plain["train"]["steps"] = 2
    result = train(resolve(plain), progress=False)
    assert result.outcome == "completed" and math.isfinite(result.last_loss)
