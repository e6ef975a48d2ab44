"""Depth-aware baselines given the same depth as HRoPE: the additive embedding on top of any
relative encoding (``model.additive``) and the query-frame encodings fed a geometry source's depth;
and the validation split the options are chosen on."""

import dataclasses

import pytest
import torch
from _lvsm_helpers import SMALL_MODEL, small_config, synthetic_batch

from hrope.nvs.build_data import build_dataset
from hrope.nvs.config import ConfigError, resolve
from hrope.nvs.data.dataset import SyntheticDataset
from hrope.nvs.model import LVSM, ModelConfig, ModelError

TRANSFER = {"targets": "transfer", "use_normals": False}


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
    assert config["eval"]["split"] == "eval"
    val = resolve({**config, "eval": {**config["eval"], "split": "val"}})
    assert [s.images.numpy().tobytes() for s in build_dataset(val, "val")] != [
        s.images.numpy().tobytes() for s in build_dataset(config, "eval")
    ]
    with pytest.raises(ConfigError, match="eval.split"):
        resolve({**config, "eval": {**config["eval"], "split": "test"}})
    real = {**config, "data": {**config["data"], "kind": "colmap", "root": str(tmp_path), "num_scenes": None}}
    with pytest.raises(ConfigError, match="eval.split 'val'"):
        build_dataset(real, "val")
