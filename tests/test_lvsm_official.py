"""Official LVSM checkpoints: the converted model renders what the official one rendered, the patch
feature order is LVSM's, files are read safely, other checkpoints get one line, and the converted
weights fine-tune with another encoding through ``train.init_from``."""

from __future__ import annotations

import ast
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from _lvsm_helpers import small_config
from safetensors.torch import save_file

from hrope.cameras import Cameras
from hrope.geometry import patchify
from hrope.nvs.lvsm_official import (
    OfficialCheckpointError,
    convert_official_state,
    load_official_state,
    official_config,
    patch_order,
)
from hrope.nvs.config import update_config
from hrope.nvs.model import LVSM, ModelConfig
from hrope.nvs.pretrained import init_weights, save_pretrained
from hrope.nvs.running.train import train

VECTORS = Path(__file__).resolve().parent / "data" / "lvsm_official_vectors.npz"
# max |ours - official| over the rendered pixels, float32: measured 4.8e-7 (values in [0.07, 0.98]);
# a 4x margin. Without the patch-feature permutation the error is of order 0.1.
RENDER_TOLERANCE = 2e-6


def vectors() -> dict[str, np.ndarray]:
    with np.load(VECTORS) as data:
        return {key: data[key] for key in data.files}


def official_state() -> dict[str, torch.Tensor]:
    return {key[len("state/") :]: torch.tensor(v) for key, v in vectors().items() if key.startswith("state/")}


def official_batch(dtype=torch.float32):
    """The stored inputs: images (B, V, 3, 32, 32), OpenCV world-to-camera, pixel fx, fy, cx, cy."""
    data = vectors()
    f = torch.tensor(data["fxfycxcy"])
    K = torch.zeros(*f.shape[:2], 3, 3, dtype=f.dtype)
    K[..., 0, 0], K[..., 1, 1], K[..., 0, 2], K[..., 1, 2], K[..., 2, 2] = f[..., 0], f[..., 1], f[..., 2], f[..., 3], 1
    cameras = Cameras(K, torch.tensor(data["world_to_cam"]), (32, 32))
    meta = ast.literal_eval(str(data["meta"]))
    return types.SimpleNamespace(
        images=torch.tensor(data["images"]).to(dtype), cameras=cameras, num_context=meta["num_context"]
    )


def test_the_converted_model_renders_what_the_official_model_rendered():
    model = load_official_state(official_state(), image_size=32)
    config = model.config
    assert (config.dim, config.heads, config.layers, config.patch_size) == (64, 2, 2, 8)
    assert config.encoding == "none" and config.ray_frame == "world" and config.qk_norm_eps == 1e-5
    with torch.no_grad():
        rendered = model(official_batch()).images
    want = torch.tensor(vectors()["rendered"])
    assert rendered.shape == want.shape
    assert (rendered - want).abs().max() <= RENDER_TOLERANCE


def test_without_the_feature_permutation_the_rendering_is_wrong():
    state = official_state()
    config = official_config(state, image_size=32)
    converted = convert_official_state(state, 8)
    converted["context_tokenizer.weight"] = state["image_tokenizer.1.weight"]  # LVSM's feature order as it is
    model = LVSM(config)
    model.load_state_dict(converted)
    with torch.no_grad():
        error = (model(official_batch()).images - torch.tensor(vectors()["rendered"])).abs().max()
    assert error > 100 * RENDER_TOLERANCE


@pytest.mark.parametrize("channels", [9, 6, 3])
def test_patch_order_maps_lvsm_patch_features_to_ours(channels):
    """LVSM flattens a patch as (ph pw c), ours as (c ph pw): ours[i] = LVSM's[patch_order[i]]."""
    p, x = 4, torch.randn(2, 3, channels, 8, 12)
    ours = patchify(x, p).flatten(-2)  # (B, V, P, C * p * p)
    B, V, C, H, W = x.shape
    lvsm = x.reshape(B, V, C, H // p, p, W // p, p).permute(0, 1, 3, 5, 4, 6, 2).reshape(B, V, -1, p * p * C)
    assert torch.equal(ours, lvsm[..., patch_order(channels, p)])
    assert sorted(patch_order(channels, p).tolist()) == list(range(channels * p * p))


def test_files_load_as_safetensors_and_as_weights_only_torch_checkpoints(tmp_path):
    state = official_state()
    save_file(state, str(tmp_path / "lvsm.safetensors"))
    wrapped = {"model": {f"module.{k}": v for k, v in state.items()}, "optimizer": {"state": {}}, "step": 7}
    wrapped["model"]["module.loss_computer.perceptual_loss_module.vgg.features.0.weight"] = torch.ones(1)
    torch.save(wrapped, tmp_path / "lvsm.pt")
    expected = load_official_state(state, image_size=32).state_dict()
    for name in ("lvsm.safetensors", "lvsm.pt"):
        loaded = load_official_state(tmp_path / name, image_size=32).state_dict()
        assert loaded.keys() == expected.keys()
        assert all(torch.equal(loaded[k], expected[k]) for k in expected), name


class NotATensor:
    pass


def test_a_file_that_is_not_an_official_checkpoint_is_one_line(tmp_path):
    ours = LVSM(ModelConfig(image_size=32, patch_size=8, dim=64, layers=2, heads=2)).state_dict()
    save_file({k: v.contiguous() for k, v in ours.items()}, str(tmp_path / "ours.safetensors"))
    with pytest.raises(OfficialCheckpointError) as error:
        load_official_state(tmp_path / "ours.safetensors", image_size=32)
    message = str(error.value)
    assert "\n" not in message and "is not an official LVSM decoder-only checkpoint" in message
    assert "missing: image_token_decoder.0.weight, image_token_decoder.1.weight, image_tokenizer.1.weight" in message
    assert "unexpected: blocks.0.attn.k_norm.weight" in message and "more)" in message
    torch.save({"model": NotATensor()}, tmp_path / "pickled.pt")  # never unpickled
    with pytest.raises(OfficialCheckpointError, match="pickled.pt is not a readable checkpoint: ") as error:
        load_official_state(tmp_path / "pickled.pt")
    assert "\n" not in str(error.value)
    with pytest.raises(OfficialCheckpointError, match="checkpoint not found"):
        load_official_state(tmp_path / "absent.pt")
    state = official_state()
    del state["transformer_blocks.1.attn.fc.weight"]
    with pytest.raises(OfficialCheckpointError, match=r"\(missing: transformer_blocks.1.attn.fc.weight\)$"):
        load_official_state(state, image_size=32)


def test_converted_weights_fine_tune_with_another_encoding(tmp_path):
    official = load_official_state(official_state(), image_size=32)
    folder = save_pretrained(official, tmp_path / "official")
    learned = LVSM(ModelConfig(**{**official.config.to_dict(), "encoding": "hrope-lift"}))
    kept = init_weights(folder, learned)
    assert kept and all(name.startswith("source.") for name in kept)  # the plane heads start at zero
    weights = official.state_dict()
    for name, value in learned.state_dict().items():
        assert name in kept or torch.equal(value, weights[name]), name
    config = small_config(encoding="prope", dim=64, heads=2, qk_norm_eps=1e-5)
    config = update_config(config, {"train": {"out": str(tmp_path / "tuned"), "init_from": str(folder)}})
    start = train(config, stop_at=0, progress=False)  # the loaded weights, nothing trained
    assert start.model.config.ray_frame == "camera"
    assert all(torch.equal(v, weights[k]) for k, v in start.model.state_dict().items())
    assert train(config, progress=False).outcome == "completed"
