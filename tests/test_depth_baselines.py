"""Depth-aware baselines given the same depth as HRoPE: the additive embedding on top of any
relative encoding (``model.additive``), the query-frame encodings fed a geometry source's depth
(rayrope also in its known-depth mode, per-ray depth off the depth maps); and the validation split
the options are chosen on."""

import dataclasses

import pytest
import torch
from _lvsm_helpers import SMALL_MODEL, small_config, synthetic_batch

from hrope.encodings import get_encoding, sample_ray_depths
from hrope.nvs.build_data import build_dataset
from hrope.nvs.config import ConfigError, update_config
from hrope.nvs.data.dataset import SyntheticDataset
from hrope.nvs.evaluation.evaluate import evaluate_model
from hrope.nvs.model import LVSM, ModelConfig, ModelError, build_model
from hrope.nvs.sources import ExternalSource, PredictorError, build_parameter_source, external, parameter_specs
from hrope.nvs.running.train_step import make_optimizer, train_step
from hrope.nvs.sources.transfer import transfer_depth

TRANSFER = {"targets": "transfer", "use_normals": False}
KNOWN = {"encoding": "rayrope", "encoding_options": {"depth": "known"}, "predictor": "external"}
GRID = (4, 4)


@pytest.fixture(scope="module")
def batch():
    return synthetic_batch(num_scenes=1, num_views=3)


def make_model(seed=0, **options):
    torch.manual_seed(seed)
    return LVSM(ModelConfig(**{**SMALL_MODEL, **options}))


def copy_weights(source: LVSM, target: LVSM) -> None:
    missing, unexpected = target.load_state_dict(source.state_dict(), strict=False)
    assert not unexpected and all(k.startswith("ape.") for k in missing), missing


def scrambled(batch, views, **values):
    """``batch`` with the geometry of ``views`` replaced (depth, normals, plane vectors)."""
    out = dataclasses.replace(
        batch, depth=batch.depth.clone(), normals=batch.normals.clone(), plane_m=batch.plane_m.clone()
    )
    out.depth[:, views] = values.get("depth", 7.0)
    out.normals[:, views] = torch.tensor([1.0, 0.0, 0.0])[:, None, None]
    out.plane_m[:, views] = torch.tensor([0.3, 0.0, 0.0])[:, None, None]
    return out


def test_additive_planes_on_prope_keep_prope_and_add_the_embedding(batch):
    prope = make_model(encoding="prope", rays="world")
    both = make_model(seed=1, encoding="prope", rays="world", additive="hrope-lift", predictor="external",
                      predictor_options=TRANSFER)  # fmt: skip
    copy_weights(prope, both)
    assert both.encoding.name == "prope" and both.source is not None and len(both.ape) == 1
    out = both(batch)
    assert out.images.shape == (1, 1, 3, 32, 32)
    assert out.parameters[0]["planes"].shape == (1, 3 * 16, 3)
    assert (out.images - prope(batch).images).abs().max() > 1e-4  # the context depth's planes are added
    with torch.no_grad():
        both.ape[0].weight.zero_()
    torch.testing.assert_close(both(batch).images, prope(batch).images, atol=1e-6, rtol=0)


def test_ape_encoding_is_none_with_the_same_additive_embedding(batch):
    ape = make_model(encoding="hrope-lift-ape", predictor="external", predictor_options=TRANSFER)
    additive = make_model(encoding="none", additive="hrope-lift", predictor="external", predictor_options=TRANSFER)
    additive.load_state_dict(ape.state_dict())
    assert ape.config.ray_frame == additive.config.ray_frame == "world"
    torch.testing.assert_close(additive(batch).images, ape(batch).images, atol=0, rtol=0)


@pytest.mark.parametrize(
    "options",
    [
        {"encoding": "prope", "rays": "world", "additive": "hrope-lift"},
        {"encoding": "worldrope"},
        {"encoding": "worldrope", "encoding_options": {"footprint": False}},
        {"encoding": "rayrope"},
        {"encoding": "rayrope", "encoding_options": {"depth": "known"}},
        {"encoding": "rayrope", "encoding_options": {"depth": "known+halfwidth"}},
        {
            "encoding": "prope",
            "rays": "world",
            "additive": "hrope-lift",
            "predictor_options": {**TRANSFER, "depth_noise": 3},
        },
        {"encoding": "hrope-lift", "predictor_options": {**TRANSFER, "depth_sparse": 60, "fit": "robust"}},
    ],
    ids=[
        "prope+additive",
        "worldrope",
        "worldrope-no-footprint",
        "rayrope",
        "rayrope-known",
        "rayrope-known-hw",
        "noisy-prope+additive",
        "sparse-hrope-lift",
    ],
)
def test_the_context_depth_reaches_the_model_and_the_target_geometry_does_not(options, batch):
    model = make_model(**{"predictor": "external", "predictor_options": TRANSFER, **options})
    with torch.no_grad():
        reference = model(batch).images
        torch.testing.assert_close(model(scrambled(batch, [2])).images, reference, atol=0, rtol=0)
        assert (model(scrambled(batch, [0, 1], depth=0.7)).images - reference).abs().max() > 1e-4


def test_worldrope_without_footprint_on_a_sources_depth_is_urope_anchored_at_that_depth(batch):
    """A geometry source gives worldrope the patch ray's depth with no spread (split 0, sigma 0);
    without the footprint term that is urope with the token's own depth as its single anchor.
    Context depth 3 everywhere and neutral target depth (depth_init) 3: urope with anchor 3."""
    flat = dataclasses.replace(batch, depth=torch.full_like(batch.depth, 3.0))
    world = make_model(encoding="worldrope", encoding_options={"footprint": False}, predictor="external",
                       predictor_options={"use_normals": False}, depth_init=3.0)  # fmt: skip
    urope = make_model(encoding="urope", encoding_options={"anchors": [3.0]})
    urope.load_state_dict(world.state_dict())
    values = world(flat).parameters[0]
    torch.testing.assert_close(values["depth"], torch.full_like(values["depth"], 3.0), atol=1e-4, rtol=0)
    torch.testing.assert_close(world(flat).images, urope(flat).images, atol=1e-5, rtol=0)
    assert (world(batch).images - urope(batch).images).abs().max() > 1e-4  # the scene's own depth differs


def known_depth_of(model: LVSM, batch):
    """The known depths ``(B, V*P, 3)`` the model fed its encoding, unfolded (one target view)."""
    return model(batch).parameters[0]["known_depth"]


def test_known_depth_is_the_context_depth_per_ray_and_the_splatted_depth_in_the_target(batch):
    """Context rays read the context depth maps (sample_ray_depths), target rays the context
    depth splatted into the target camera (0 where nothing landed: predicted there); neutral
    targets know no ray; scope 'all' reads the target's own depth (the labelled upper bound)."""
    context = 2 * GRID[0] * GRID[1]
    with torch.no_grad():
        known = known_depth_of(make_model(**KNOWN, predictor_options=TRANSFER), batch)
        splatted = transfer_depth(batch.depth[:, :2], batch.cameras, 2)
        expected = sample_ray_depths(torch.cat([batch.depth[:, :2], splatted.nan_to_num(posinf=0.0)], 1), GRID)
        torch.testing.assert_close(known, expected, atol=0, rtol=0)
        torch.testing.assert_close(known[:, :context], sample_ray_depths(batch.depth[:, :2], GRID), atol=0, rtol=0)
        target, own = known[:, context:], sample_ray_depths(batch.depth[:, 2:], GRID)
        hit = target > 0
        assert 0.5 < hit.float().mean() < 1  # some target rays see no context pixel: missing there
        assert ((target[hit] / own[hit] - 1).abs().max()) < 0.1  # splatted: near the target's own depth
        neutral = known_depth_of(make_model(**KNOWN, predictor_options={"use_normals": False}), batch)
        torch.testing.assert_close(neutral[:, :context], known[:, :context], atol=0, rtol=0)
        assert not neutral[:, context:].any()
        every = known_depth_of(make_model(**KNOWN, predictor_options={"scope": "all", "use_normals": False}), batch)
        torch.testing.assert_close(every, sample_ray_depths(batch.depth, GRID), atol=0, rtol=0)


def test_known_depth_reaches_the_encoding(batch, monkeypatch):
    """The same weights with every ray's depth missing are the planes' one depth per token (the
    plain mode with the same source); the known depths move the output away from it (an untrained
    model's output moves little: measured 5e-5)."""
    with torch.no_grad():
        planes_only = make_model(encoding="rayrope", predictor="external", predictor_options=TRANSFER)(batch).images
        known = make_model(**KNOWN, predictor_options=TRANSFER)(batch).images
        monkeypatch.setattr(external, "ray_depths", lambda depth, grid: sample_ray_depths(depth, grid).zero_())
        missing = make_model(**KNOWN, predictor_options=TRANSFER)(batch).images
    torch.testing.assert_close(missing, planes_only, atol=1e-7, rtol=0)
    assert (known - planes_only).abs().max() > 1e-5


class ConstantDepth(torch.nn.Module):
    """A stand-in depth model: 2.5 everywhere, at half resolution (resized by the source)."""

    def forward(self, images):
        return images.new_full((len(images), 16, 16), 2.5)


def test_known_depth_reads_the_depth_models_output_and_nothing_else(batch):
    specs = parameter_specs(get_encoding("rayrope", depth="known"))
    options = {"depth": "model", "module": ConstantDepth(), "align": "none"}
    source = build_parameter_source(
        "external", specs, dim=4, num_layers=1, patch_size=8, options=options, data_params=("known_depth",)
    )
    known = source.static(batch, batch.cameras, GRID, 2)["known_depth"]
    assert (known[:, :32] == 2.5).all() and not known[:, 32:].any()  # neutral targets: missing
    with pytest.raises(PredictorError, match=r"cannot read \['depth'\] off depth maps"):
        ExternalSource(specs, 8, data_params=("depth",))


@pytest.mark.slow
def test_known_depth_row_trains_a_step_and_evaluates():
    config = small_config(**KNOWN, predictor_options={"targets": "transfer"})
    model = build_model(config)
    optimizer = make_optimizer(model, config.train)
    before = [p.detach().clone() for p in model.parameters()]
    assert train_step(model, optimizer, synthetic_batch(), 0, config.train).finite
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    psnr = evaluate_model(model.eval(), build_dataset(config, "eval"), 2, batch_size=2).means["psnr"]
    assert 0 < psnr < 60


@pytest.mark.parametrize(
    "options, error, match",
    [
        ({**KNOWN, "predictor": "learned"}, PredictorError, "needs model.predictor 'external', got 'learned'"),
        ({**KNOWN, "predictor": "oracle"}, PredictorError, "needs model.predictor 'external', got 'oracle'"),
        ({**KNOWN, "encoding": "rayrope-ape"}, ModelError, "'known_depth'.* would go unused"),
    ],
    ids=["learned", "oracle", "ape"],
)
def test_known_depth_without_a_depth_source_is_a_one_line_error(options, error, match):
    with pytest.raises(error, match=match) as caught:
        make_model(**options)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    "options, match",
    [
        ({"encoding": "hrope-lift", "additive": "hrope-lift"}, "without per-token inputs"),
        ({"encoding": "hrope-lift-ape", "additive": "hrope-lift"}, "without per-token inputs"),
        ({"encoding": "prope", "additive": "prope"}, "model.additive 'prope'"),
        ({"encoding": "prope", "additive": "hrope-lift", "predictor_options": {"per_head": True}}, "per_head"),
    ],
)
def test_bad_additive_options_are_one_line_errors(options, match):
    with pytest.raises(ModelError, match=match):
        make_model(**options)


def scene_bytes(split: str, kind: str = "room", seed: int = 0, count: int = 3) -> list[bytes]:
    dataset = SyntheticDataset(kind=kind, num_scenes=count, seed=seed, image_size=(16, 16), num_target=1, split=split)
    return [dataset[i].images.numpy().tobytes() for i in range(count)]


def test_validation_scenes_are_deterministic_and_disjoint_from_train_and_test():
    val = scene_bytes("val")
    assert val == scene_bytes("val")
    others = set(scene_bytes("train")) | set(scene_bytes("eval"))
    assert not set(val) & others
    assert scene_bytes("val", seed=1) != val


def test_eval_split_selects_the_scored_scenes_and_val_needs_synthetic_data(tmp_path):
    config = small_config()
    assert config.eval.split == "eval"
    val = update_config(config, {"eval": {"split": "val"}})
    assert [s.images.numpy().tobytes() for s in build_dataset(val, "val")] != [
        s.images.numpy().tobytes() for s in build_dataset(config, "eval")
    ]
    with pytest.raises(ConfigError, match="eval.split"):
        update_config(config, {"eval": {"split": "test"}})
    real = {"kind": "colmap", "root": str(tmp_path), "num_scenes": None}
    with pytest.raises(ConfigError, match="eval.split 'val'"):  # when the config is built
        update_config(val, {"data": real})
