"""Depth as users have it (hrope.nvs.sources.user_depth) and the external source's depth_noise / depth_sparse."""

import dataclasses

import pytest
import torch
from _lvsm_helpers import SMALL_MODEL, synthetic_batch

from hrope import get_encoding
from hrope.nvs.model import LVSM, ModelConfig
from hrope.nvs.sources import PredictorError, build_parameter_source, parameter_specs, token_rays
from hrope.nvs.sources.user_depth import NOISE_LEVELS, noisy_depth, sparse_depth, view_seeds

GRID = (4, 4)
SPECS = parameter_specs(get_encoding("hrope-lift"))


@pytest.fixture(scope="module")
def batch():
    return synthetic_batch(num_scenes=4, num_views=3)


def valid(depth):
    return torch.isfinite(depth) & (depth > 0)


def external(**options):
    options = {"use_normals": False, **options}
    return build_parameter_source("external", SPECS, dim=4, num_layers=1, patch_size=8, options=options)


def planes(source, batch):
    return source.static(batch, batch.cameras, GRID, 2)["planes"]


def test_level_zero_and_no_points_leave_the_source_bit_identical(batch):
    for options in ({}, {"targets": "transfer"}, {"fit": "robust", "targets": "transfer"}):
        default = planes(external(**options), batch)
        off = planes(external(depth_noise=0, depth_sparse=0, **options), batch)
        assert torch.equal(off, default)
    assert noisy_depth(batch.depth, batch.images, 0) is batch.depth


def test_error_grows_with_the_level(batch):
    depth, images = batch.depth[:, :2], batch.images[:, :2]
    medians, missing = [], []
    for level in (1, 2, 3):
        noisy = noisy_depth(depth, images, level)
        both = valid(depth) & valid(noisy)
        medians.append(((noisy - depth).abs() / depth)[both].median().item())
        missing.append((valid(depth) & ~valid(noisy)).sum().item())
    assert 0 < medians[0] < medians[1] < medians[2], medians
    assert 0 < missing[0] < missing[1] < missing[2], missing


def test_noise_is_a_function_of_the_view(batch):
    """Same image, same noise (whatever the global RNG or the batch position); other views differ."""
    depth, images = batch.depth[:, :2], batch.images[:, :2]
    torch.manual_seed(1)
    first = noisy_depth(depth, images, 2)
    torch.manual_seed(2)
    again = noisy_depth(depth.flip(0), images.flip(0), 2).flip(0)
    assert torch.equal(first.nan_to_num(-1), again.nan_to_num(-1))
    seeds = view_seeds(images)
    assert len(set(seeds)) == len(seeds) == 8
    ratio = (first / depth)[valid(first)]
    views = (first / depth).flatten(0, 1)
    assert not torch.allclose(views[0].nan_to_num(0), views[1].nan_to_num(0))
    assert ratio.std() > 0


def test_holes_are_missing_depth_and_invalid_depth_stays_invalid(batch):
    depth = batch.depth[:, :2].clone()
    depth[0, 0, :4] = torch.inf
    noisy = noisy_depth(depth, batch.images[:, :2], 3)
    assert torch.isinf(noisy[0, 0, :4]).all()
    holes = valid(depth) & noisy.isnan()
    per_view = holes.flatten(2).sum(-1)
    assert (per_view > 0).all(), per_view
    assert noisy.isnan().sum() == holes.sum()


def test_target_depth_is_never_read_with_noise_or_points(batch):
    scrambled = dataclasses.replace(batch, depth=batch.depth.clone())
    scrambled.depth[:, 2] = 7.0
    for options in ({"depth_noise": 3}, {"depth_sparse": 40, "fit": "robust"}, {"depth_noise": 1, "depth_sparse": 40}):
        for targets in ("neutral", "transfer"):
            source = external(targets=targets, **options)
            assert torch.equal(planes(source, scrambled), planes(source, batch)), (options, targets)


def test_noise_reaches_context_and_transferred_target_planes(batch):
    clean, noisy = (
        planes(external(targets="transfer"), batch),
        planes(external(targets="transfer", depth_noise=2), batch),
    )
    assert (clean[:, :32] - noisy[:, :32]).abs().max() > 1e-3
    assert (clean[:, 32:] - noisy[:, 32:]).abs().max() > 1e-3


def test_sparse_points_keep_the_requested_count_and_planes_still_fit(batch):
    depth, images = batch.depth[:, :2], batch.images[:, :2]
    sparse = sparse_depth(depth, images, 300)
    kept = valid(sparse)
    assert (kept.flatten(2).sum(-1) == 300).all()
    rel = ((sparse - depth).abs() / depth)[kept]
    assert 0 < rel.max() < 0.06  # SPARSE_NOISE = 0.01: within 6 sigma
    assert torch.isinf(sparse[~kept]).all()
    gradient = images.mean(2).diff(dim=-1).abs()
    assert gradient[kept[..., :, :-1]].mean() > 1.5 * gradient.mean()  # keypoint-like: where the image varies
    assert (valid(sparse_depth(depth, images, 32 * 32 + 5)) == valid(depth)).all()
    rays = token_rays(batch.cameras, GRID)[:, :32]  # m·r̂ = 1 / z at the patch centre
    truth = (batch.planes(8).m(batch.cameras, GRID)[:, :32] * rays).sum(-1)
    fitted = (planes(external(depth_sparse=300, fit="robust"), batch)[:, :32] * rays).sum(-1)
    assert (fitted > 0).all()  # every patch has a plane in front of the camera
    error = (fitted / truth - 1).abs()  # measured: 83 % of the patches within 5 %, median 0.5 %
    assert (error < 0.05).float().mean() > 0.75 and error.median() < 0.01, error


def test_level_numbers_are_ordered():
    levels = [NOISE_LEVELS[k] for k in (1, 2, 3)]
    for field in ("scale", "shift", "pixel", "smooth", "smear", "holes", "hole_radius"):
        values = [getattr(level, field) for level in levels]
        assert values == sorted(values) and values[0] < values[2], field


@pytest.mark.parametrize(
    "options, match",
    [
        ({"depth_noise": 4}, "predictor_options.depth_noise"),
        ({"depth_noise": -1}, "predictor_options.depth_noise"),
        ({"depth_sparse": 2.5}, "predictor_options.depth_sparse"),
        ({"depth_noise": 1, "depth": "model", "module": "torch.nn:Identity"}, "depth_noise and depth_sparse"),
    ],
)
def test_bad_values_are_one_line_errors(options, match):
    with pytest.raises(PredictorError, match=match) as error:
        external(**options)
    assert "\n" not in str(error.value)


def test_model_with_level_zero_is_bit_identical(batch):
    outputs = []
    for options in ({}, {"depth_noise": 0, "depth_sparse": 0}):
        torch.manual_seed(0)
        model = LVSM(ModelConfig(**SMALL_MODEL, encoding="hrope-lift", predictor="external",
                                 predictor_options={"targets": "transfer", **options}))  # fmt: skip
        with torch.no_grad():
            outputs.append(model(batch).images)
    assert torch.equal(outputs[0], outputs[1])
