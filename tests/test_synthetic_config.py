"""The synthetic generator's SyntheticConfig is reachable from the run config (data.synthetic)."""

from __future__ import annotations

import math

import pytest
from _lvsm_helpers import small_config

from hrope.nvs.config import ConfigError, update_config
from hrope.nvs.data.rng import Rng
from hrope.nvs.data.synthetic.config import SyntheticConfig
from hrope.nvs.data.synthetic.layouts import object_layout
from hrope.nvs.build_data import build_dataset
from hrope.nvs.evaluation.protocols import build_videos


def horizontal_fov_deg(scene) -> float:
    K, (_, W) = scene.cameras.K[0, 0], scene.image_size
    return math.degrees(2 * math.atan(W / (2 * float(K[0, 0]))))


@pytest.mark.parametrize("split", ["train", "eval"])
def test_data_synthetic_reaches_the_training_and_evaluation_scenes(split):
    config = update_config(small_config(), {"data": {"synthetic": {"fov_deg": [30.0, 30.0]}}})
    assert horizontal_fov_deg(build_dataset(config, split)[0]) == pytest.approx(30.0, abs=1e-3)
    default = horizontal_fov_deg(build_dataset(small_config(), split)[0])
    assert 50.0 <= default <= 80.0 and abs(default - 30.0) > 10  # SyntheticConfig's default range


def test_data_synthetic_reaches_the_protocol_videos():
    config = update_config(
        small_config(), {"data": {"synthetic": {"num_frames": 60, "fov_deg": [30, 30]}}, "eval": {"num_scenes": 1}}
    )
    videos = build_videos(config)
    assert videos.num_frames(0) == 60
    scene = videos.load(0, [0, 59], (32, 32))
    assert horizontal_fov_deg(scene) == pytest.approx(30.0, abs=1e-3)


@pytest.mark.parametrize(
    "synthetic, message",
    [
        ({"no_such_key": 1}, "unknown data.synthetic keys"),
        ({"fov_deg": [80, 40]}, "fov_deg"),
        ("wide", "data.synthetic must be null or a mapping"),
    ],
)
def test_bad_synthetic_overrides_name_the_key(synthetic, message):
    """Caught when the config is built: its type, its keys and their values."""
    with pytest.raises(ConfigError, match=message):
        update_config(small_config(), {"data": {"synthetic": synthetic}})


def test_object_layout_follows_its_config():
    def num_quads(seed, **ranges):
        return object_layout(Rng("layout-test", seed), SyntheticConfig(**ranges)).quads.centre.shape[0]

    for seed in range(3):
        one_box = num_quads(seed, object_boxes=(1, 1), object_boards=(0, 0))
        four_boxes_two_boards = num_quads(seed, object_boxes=(4, 4), object_boards=(2, 2))
        assert four_boxes_two_boards - one_box == 3 * 6 + 2  # three more cuboids (6 faces each), two boards
