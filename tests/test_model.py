"""LVSM model: every encoding runs forward/backward, folding, ray frames, invariances, presets."""

import pytest
import torch
from _lvsm_helpers import SMALL_MODEL, synthetic_batch

from hrope.encodings import ENCODINGS
from hrope.nvs.model import (
    APE_ENCODINGS,
    LVSM,
    PRESETS,
    ModelConfig,
    ModelError,
    count_parameters,
    encoding_names,
    unpatchify,
)
from hrope.nvs.sources import axis_angle_to_matrix
from hrope.geometry import make_se3, patchify
from hrope.rays import plucker_rays


@pytest.fixture(scope="module")
def batch():
    return synthetic_batch(num_scenes=1, num_views=3)


def make_model(encoding, seed=0, **options):
    torch.manual_seed(seed)
    return LVSM(ModelConfig(**SMALL_MODEL, encoding=encoding, **options))


@pytest.mark.parametrize("encoding", encoding_names())
def test_forward_backward_every_encoding(encoding, batch):
    model = make_model(encoding)
    out = model(batch)
    assert out.images.shape == (1, 1, 3, 32, 32)
    assert ((out.images > 0) & (out.images < 1)).all()
    target = batch.images[:, 2:]
    (out.images - target).square().mean().backward()
    for name, param in model.named_parameters():
        assert param.grad is not None and torch.isfinite(param.grad).all(), name
    needs_params = encoding.endswith("-ape") or ENCODINGS[encoding].needs_planes or ENCODINGS[encoding].param_names
    assert len(out.parameters) == (SMALL_MODEL["layers"] if needs_params else 0)


def copy_weights(source: LVSM, target: LVSM) -> None:
    missing, unexpected = target.load_state_dict(source.state_dict(), strict=False)
    assert not unexpected
    assert all(k.startswith(("source.", "ape.")) for k in missing), missing


def test_zero_initialised_planes_make_hrope_lift_start_as_prope(batch):
    prope, lift = make_model("prope"), make_model("hrope-lift", seed=1)
    copy_weights(prope, lift)
    out = lift(batch)
    assert all((values["planes"] == 0).all() for values in out.parameters)
    torch.testing.assert_close(out.images, prope(batch).images, atol=1e-6, rtol=0)


def test_ape_variant_adds_embedding_and_attends_without_encoding(batch):
    none, ape = make_model("none"), make_model("hrope-lift-ape", seed=1)
    copy_weights(none, ape)
    assert ape.encoding.name == "none" and ape.config.ray_frame == "world"
    torch.testing.assert_close(ape(batch).images, none(batch).images)  # zero-init heads: m = 0 adds nothing
    with torch.no_grad():
        for head in ape.source.heads:
            head.bias[-1] = 0.5  # nonzero planes (m_z of the direct decoder)
    assert (ape(batch).images - none(batch).images).abs().max() > 1e-4  # the embedding is added
    with torch.no_grad():
        for layer in ape.ape:
            layer.weight.zero_()
    torch.testing.assert_close(ape(batch).images, none(batch).images, atol=1e-6, rtol=0)


def test_each_target_is_rendered_independently_with_all_context(batch):
    model = make_model("prope")
    two_targets = synthetic_batch(num_scenes=1, num_views=4)
    both = model(two_targets).images
    for t in (2, 3):
        single = synthetic_batch(num_scenes=1, num_views=4)
        keep = [0, 1, t]
        single.images = single.images[:, keep]
        single.cameras = single.cameras.select_views(keep)
        torch.testing.assert_close(model(single).images[:, 0], both[:, t - 2], atol=1e-5, rtol=0)


@pytest.mark.parametrize("encoding", ["prope", "hrope-lift", "gta", "hrope"])
def test_relative_encodings_with_camera_rays_are_world_frame_invariant(encoding, batch):
    model = make_model(encoding)
    G = make_se3(axis_angle_to_matrix(torch.tensor([0.3, -0.2, 0.5])), torch.tensor([1.0, -2.0, 0.5]))
    moved = synthetic_batch(num_scenes=1, num_views=3)
    moved.cameras = batch.cameras.transform_world(G)
    with torch.no_grad():
        torch.testing.assert_close(model(moved).images, model(batch).images, atol=2e-5, rtol=0)


def test_world_rays_make_none_depend_on_the_world_frame(batch):
    model = make_model("none")
    G = make_se3(torch.eye(3), torch.tensor([1.0, 0.0, 0.0]))
    moved = synthetic_batch(num_scenes=1, num_views=3)
    moved.cameras = batch.cameras.transform_world(G)
    assert (model(moved).images - model(batch).images).abs().max() > 1e-4


def test_plucker_rays(batch):
    cameras = batch.cameras
    world, camera = plucker_rays(cameras, "world"), plucker_rays(cameras, "camera")
    assert world.shape == (1, 3, 6, 32, 32)
    for rays in (world, camera):
        torch.testing.assert_close(rays[:, :, 3:].norm(dim=2), torch.ones(1, 3, 32, 32))
    assert (camera[:, :, :3] == 0).all()
    # world directions are R^T times camera directions; moments are c x d, orthogonal to d
    d_cam = camera[:, :, 3:].permute(0, 1, 3, 4, 2)
    d_world = torch.einsum("bvji,bvhwj->bvhwi", cameras.R, d_cam)
    torch.testing.assert_close(world[:, :, 3:].permute(0, 1, 3, 4, 2), d_world, atol=1e-5, rtol=0)
    moment = torch.cross(cameras.centers()[:, :, None, None].expand_as(d_world), d_world, dim=-1)
    torch.testing.assert_close(world[:, :, :3].permute(0, 1, 3, 4, 2), moment, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="ray frame"):
        plucker_rays(cameras, "ndc")


def test_patchify_round_trip_and_order():
    x = torch.arange(2 * 3 * 16 * 24, dtype=torch.float32).reshape(1, 2, 3, 16, 24)
    patches = patchify(x, 8).flatten(-2)
    assert patches.shape == (1, 2, 6, 3 * 64)
    assert patches[0, 0, 1, 0] == x[0, 0, 0, 0, 8]  # second patch is to the right (x fastest)
    torch.testing.assert_close(unpatchify(patches, 8, (2, 3)), x)


def test_parameter_count_matches_architecture():
    c = ModelConfig(**{**SMALL_MODEL, "dim": 64})
    d, p2, hidden, head_dim = c.dim, c.patch_size**2, int(c.dim * c.mlp_ratio), c.dim // c.heads
    per_layer = 4 * d * d + 2 * d * hidden + 2 * d + 2 * head_dim
    expected = 9 * p2 * d + 6 * p2 * d + 3 * p2 * d + 2 * d + c.layers * per_layer
    assert count_parameters(LVSM(c)) == {"total": expected, "trainable": expected}


def test_presets_and_bad_configs():
    assert ModelConfig.from_dict({"preset": "paper"}).dim == 768 and PRESETS["paper"]["heads"] == 16
    assert ModelConfig.from_dict({"preset": "tiny", "dim": 192}).dim == 192
    with pytest.raises(ModelError, match="unknown encoding 'hrope-xyz'"):
        ModelConfig(encoding="hrope-xyz")
    with pytest.raises(ModelError, match="not divisible"):
        ModelConfig(image_size=60, patch_size=8)
    with pytest.raises(ModelError, match="preset"):
        ModelConfig.from_dict({"preset": "huge"})
    with pytest.raises(ModelError, match="unknown model options"):
        ModelConfig.from_dict({"layer": 3})
    with pytest.raises(ModelError, match="predictor"):
        ModelConfig(encoding="hrope", predictor="magic")
    assert "prope-ape" not in encoding_names() and "hrope-ape" in encoding_names()


def test_wrong_image_size_is_a_clear_error(batch):
    model = LVSM(ModelConfig(**{**SMALL_MODEL, "image_size": 64}))
    with pytest.raises(ModelError, match="64x64"):
        model(batch)


@pytest.mark.filterwarnings("ignore:Mismatch dtype between input and weight")  # torch perf note (RMSNorm)
@pytest.mark.parametrize("encoding", ["none", "hrope", "hrope-lift"])
def test_bf16_autocast_matches_float32(encoding, batch):
    model = make_model(encoding)
    with torch.no_grad():
        for head in getattr(model.source, "heads", []):
            head.bias[-1] = 0.3  # nonzero planes (m_z, or the depth offset of normal-depth)
        full = model(batch).images
        with torch.autocast("cpu", dtype=torch.bfloat16):
            half = model(batch).images
    assert half.dtype == torch.bfloat16
    assert (half.float() - full).abs().max() < 0.025  # measured worst 0.0026 (hrope-lift); 10x margin


def test_ape_variants_are_the_encodings_with_token_inputs():
    """Every encoding with per-token inputs has a distinct ``-ape`` model, except hrope-pf (hrope-ape's
    twin) and hrope-lift-uv (hrope-lift-ape's twin)."""
    with_inputs = {name for name, cls in ENCODINGS.items() if cls.takes_token_inputs()}
    assert set(APE_ENCODINGS) == with_inputs - {"hrope-pf", "hrope-lift-uv"}
    assert "hrope-lift-uv" in with_inputs and "hrope-lift-uv-ape" not in encoding_names()
    assert "hrope-pf" in with_inputs and "hrope-pf-ape" not in encoding_names()
