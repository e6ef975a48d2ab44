"""Parameter sources: decoders, learned / backbone / external / oracle, and their errors."""

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F
from _lvsm_helpers import SMALL_MODEL, synthetic_batch
from safetensors.torch import save_file
from torch import nn

from hrope import Planes, get_encoding
from hrope.encodings import Encoding
from hrope.nvs.model import LVSM, ModelConfig
from hrope.nvs.sources.plane_fitting import patch_planes_from_normals
from hrope.nvs.sources import (
    PredictorError,
    axis_angle_to_matrix,
    build_parameter_source,
    load_backbone,
    parameter_specs,
    token_rays,
)

GRID = (4, 4)


@pytest.fixture(scope="module")
def batch():
    return synthetic_batch(num_scenes=2, num_views=3)


def decode(encoding: str, raw: torch.Tensor, cameras, depth_init: float = 1.0):
    source = build_parameter_source(
        "learned", parameter_specs(get_encoding(encoding), depth_init), dim=4, num_layers=1, patch_size=8
    )
    return source.decode(raw, cameras, GRID)


def test_axis_angle_to_matrix():
    # float32: measured 2.4e-7 (this rotation) and 1.4e-6 (R^T R of ten random ones); 10x margins
    R = axis_angle_to_matrix(torch.tensor([0.0, 0.0, math.pi / 2]))
    torch.testing.assert_close(R @ torch.tensor([1.0, 0.0, 0.0]), torch.tensor([0.0, 1.0, 0.0]), atol=3e-6, rtol=0)
    R = axis_angle_to_matrix(torch.randn(10, 3))
    torch.testing.assert_close(R.transpose(-1, -2) @ R, torch.eye(3).expand(10, 3, 3), atol=2e-5, rtol=0)
    torch.testing.assert_close(torch.linalg.det(R), torch.ones(10))


def test_zero_output_decodes_to_neutral_values(batch):
    cameras = batch.cameras
    N = cameras.num_views * 16
    zero = lambda width: torch.zeros(2, N, width)  # noqa: E731
    assert (decode("hrope-lift", zero(4), cameras)["planes"] == 0).all()
    torch.testing.assert_close(decode("hrope-so3", zero(3), cameras)["rotation"], torch.eye(3).expand(2, N, 3, 3))
    torch.testing.assert_close(decode("hrope-se3", zero(6), cameras)["transform"], torch.eye(4).expand(2, N, 4, 4))
    torch.testing.assert_close(decode("hrope-full", zero(16), cameras)["transform"], torch.eye(4).expand(2, N, 4, 4))
    depth = decode("hrope-depth", zero(1), cameras, depth_init=2.5)["depth"]
    torch.testing.assert_close(depth, torch.full((2, N), 2.5))


def test_full_transform_decoder_is_never_singular(batch):
    """hrope-full's head output A decodes to exp(A): invertible with det e^{tr A}, even where
    I + A (the additive decoder it replaced) is singular."""
    cameras = batch.cameras
    N = cameras.num_views * 16
    raw = 0.7 * torch.randn(2, N, 4, 4, generator=torch.Generator().manual_seed(0))
    raw[:, 0] = -torch.eye(4)  # I + A = 0
    G = decode("hrope-full", raw.flatten(-2), cameras)["transform"].double()
    torch.testing.assert_close(
        torch.linalg.det(G), torch.exp(raw.double().diagonal(dim1=-2, dim2=-1).sum(-1)), rtol=1e-5, atol=0
    )
    torch.testing.assert_close(G[:, 0], torch.eye(4, dtype=G.dtype).expand(2, 4, 4) / math.e, rtol=1e-6, atol=1e-7)
    identity = torch.eye(4, dtype=G.dtype).expand_as(G)
    torch.testing.assert_close(torch.linalg.inv(G) @ G, identity, rtol=0, atol=1e-9)


def test_plane_decoders_give_planes_at_the_requested_depth(batch):
    cameras = batch.cameras
    N = cameras.num_views * 16
    raw = torch.zeros(2, N, 3)
    raw[..., 2] = 0.5  # hrope-lift's direct decoder: m = raw, so m·r̂ = 0.5 (r̂ has unit z): z = 2
    m = decode("hrope-lift", raw, cameras)["planes"]
    _, depth = Planes.from_m(m).normal_and_depth(cameras, GRID)
    torch.testing.assert_close(depth, torch.full((2, N), 2.0))
    torch.testing.assert_close(m[..., :2], torch.zeros(2, N, 2))  # fronto-parallel at zero normal offset
    # hrope and hrope-pf: positive depth depth_init * exp(b), zero output = fronto-parallel at depth_init
    for encoding in ("hrope", "hrope-pf"):
        for b, expected in ((0.0, 3.0), (math.log(2.0), 6.0), (-1.0, 3.0 * math.exp(-1.0))):
            raw = torch.zeros(2, N, 4)
            raw[..., 3] = b
            m = decode(encoding, raw, cameras, depth_init=3.0)["planes"]
            _, depth = Planes.from_m(m).normal_and_depth(cameras, GRID)
            torch.testing.assert_close(depth, torch.full((2, N), expected), rtol=1e-5, atol=0)


def test_unknown_parameter_is_a_clear_error():
    class Odd(Encoding):
        name = "odd"
        param_names = ("wobble",)

    with pytest.raises(PredictorError, match="wobble"):
        parameter_specs(Odd())
    with pytest.raises(PredictorError, match="unknown predictor"):
        build_parameter_source("psychic", [], dim=4, num_layers=1, patch_size=8)


def test_oracle_source_gives_the_dataset_planes(batch):
    """scope 'all' (with target geometry) gives every view's planes; the default, 'context', the
    context views' and the neutral planes on the target view (hrope: fronto-parallel at depth_init)."""
    specs = parameter_specs(get_encoding("hrope"))
    expected = batch.planes(8).m(batch.cameras, GRID)
    every = build_parameter_source("oracle", specs, dim=4, num_layers=1, patch_size=8, options={"scope": "all"})
    torch.testing.assert_close(every.static(batch, batch.cameras, GRID, 2)["planes"], expected)
    context = build_parameter_source("oracle", specs, dim=4, num_layers=1, patch_size=8)
    values = context.static(batch, batch.cameras, GRID, 2)["planes"]
    torch.testing.assert_close(values[:, :32], expected[:, :32])
    torch.testing.assert_close(values[:, 32:], torch.tensor([0.0, 0.0, 1.0]).expand(2, 16, 3))
    assert (
        every.describe("oracle") == "oracle, with target geometry"
        and context.describe("oracle") == "oracle, targets neutral"
    )


def single_plane_patches(batch, p: int = 8) -> torch.Tensor:
    """``(B, N)`` mask of patches whose pixels all see one plane (exact plane_m constant, depth finite)."""
    B, V, _, H, W = batch.plane_m.shape
    m = batch.plane_m.reshape(B, V, 3, H // p, p, W // p, p)
    spread = (m - m[:, :, :, :, :1, :, :1]).abs().amax(dim=(2, 4, 6))
    finite = torch.isfinite(batch.depth).reshape(B, V, H // p, p, W // p, p).all(5).all(3)
    return ((spread < 1e-6) & finite).reshape(B, -1)


def test_external_source_recovers_planes_from_depth(batch):
    """Where a patch sees one plane, the fit of depth (with or without normals) is the exact plane."""
    exact = batch.planes(8).m(batch.cameras, GRID)
    single = single_plane_patches(batch)
    assert single.float().mean() > 0.25
    for use_normals in (False, True):
        source = build_parameter_source(
            "external",
            parameter_specs(get_encoding("hrope")),
            dim=4,
            num_layers=1,
            patch_size=8,
            options={"use_normals": use_normals, "scope": "all"},
        )
        fitted = source.static(batch, batch.cameras, GRID, 2)["planes"]
        torch.testing.assert_close(fitted[single], exact[single], atol=1e-4, rtol=1e-3)


def test_normal_based_fit_is_exact_for_one_plane(batch):
    cameras = batch.cameras
    m_true = torch.tensor([0.1, -0.2, 0.4])  # plane m·X = 1
    H, W = cameras.image_size
    ys, xs = torch.meshgrid(torch.arange(H) + 0.5, torch.arange(W) + 0.5, indexing="ij")
    pix = torch.stack([xs, ys, torch.ones_like(xs)], -1).float()
    rays = torch.einsum("bvij,hwj->bvhwi", torch.linalg.inv(cameras.K), pix)
    depth = 1.0 / (rays @ m_true)  # z along each pixel ray (rays have z = 1)
    normals = (-m_true / m_true.norm()).reshape(1, 1, 3, 1, 1).expand(2, 3, 3, H, W)
    fitted = patch_planes_from_normals(depth, normals, cameras, 8).m(cameras, GRID)
    torch.testing.assert_close(fitted, m_true.expand_as(fitted), atol=1e-4, rtol=1e-4)
    with pytest.raises(PredictorError, match="depth"):
        build_parameter_source("external", [], dim=4, num_layers=1, patch_size=8).static(
            type("NoDepth", (), {"depth": None})(), cameras, GRID, 2
        )


@pytest.mark.parametrize("use_normals", [False, True])
def test_external_patches_without_depth_get_finite_params_at_depth_init(use_normals, batch):
    """A patch with no valid depth pixel has the plane at infinity; its depth-like inputs use depth_init."""
    depth = batch.depth.clone()
    depth[:, 0, :8, :8] = float("nan")  # token 0 of view 0: no valid pixel
    depth[:, 1, 8:16, :8] = 0.0  # token 4 of view 1: no valid pixel
    holed = dataclasses.replace(batch, depth=depth)
    missing = torch.zeros(2, 3 * 16, dtype=torch.bool)
    missing[:, [0, 16 + 4]] = True
    for encoding in ("hrope-depth", "rayrope", "worldrope", "hrope-so3", "hrope-se3", "hrope-lift"):
        specs = parameter_specs(get_encoding(encoding), 2.5)
        source = build_parameter_source(
            "external",
            specs,
            dim=4,
            num_layers=1,
            patch_size=8,
            options={"use_normals": use_normals, "scope": "all"},
            depth_init=2.5,
        )
        values = source.static(holed, holed.cameras, GRID, 2)
        for name, value in values.items():
            assert torch.isfinite(value).all(), (encoding, name)
        if "depth" in values:
            torch.testing.assert_close(values["depth"][missing], torch.full((4,), 2.5))
        if "log_depth" in values:
            torch.testing.assert_close(values["log_depth"][missing], torch.full((4,), math.log(2.5)))
        if "transform" in values:  # fronto-parallel plane at depth_init: a rigid G that sends p = 2.5 r̂ to 0
            G = values["transform"][missing]
            R = G[..., :3, :3]
            torch.testing.assert_close(R @ R.transpose(-1, -2), torch.eye(3).expand_as(R), atol=1e-5, rtol=0)
            p = 2.5 * token_rays(holed.cameras, GRID)[missing]
            torch.testing.assert_close(
                (R @ p[..., None]).squeeze(-1) + G[..., :3, 3], torch.zeros(4, 3), atol=1e-5, rtol=0
            )
        if "planes" in values:
            assert (values["planes"][missing] == 0).all()  # the source's plane itself is unchanged
    model = LVSM(
        ModelConfig(
            **SMALL_MODEL, encoding="hrope-se3", predictor="external", predictor_options={"use_normals": use_normals}
        )
    )
    assert torch.isfinite(model(holed).images).all()


@pytest.mark.parametrize("encoding", ["hrope-depth", "hrope-so3", "hrope-se3", "hrope-full", "rayrope", "worldrope"])
def test_oracle_provides_every_encoding_parameter(encoding, batch):
    model = LVSM(ModelConfig(**SMALL_MODEL, encoding=encoding, predictor="oracle"))
    out = model(batch)
    assert torch.isfinite(out.images).all() and len(out.parameters) == 1
    if encoding == "hrope-so3":
        R = out.parameters[0]["rotation"]
        torch.testing.assert_close(R @ R.transpose(-1, -2), torch.eye(3).expand_as(R), atol=1e-5, rtol=0)


class TinyBackbone(nn.Module):
    def __init__(self, channels: int = 8) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, channels, 3, stride=2, padding=1)
        self.norm = nn.BatchNorm2d(channels)

    def forward(self, x):
        return self.norm(self.conv(x))


@pytest.mark.parametrize("fmt", ["safetensors", "pt"])
def test_backbone_source_loads_local_weights_and_stays_frozen(fmt, tmp_path, batch):
    torch.manual_seed(0)
    saved = TinyBackbone()
    path = tmp_path / f"backbone.{fmt}"
    if fmt == "safetensors":
        save_file(saved.state_dict(), str(path))
    else:
        torch.save(saved.state_dict(), path)
    loaded = load_backbone(TinyBackbone(), path)
    for a, b in zip(saved.state_dict().values(), loaded.state_dict().values()):
        assert torch.equal(a, b)
    options = {"module": TinyBackbone(), "checkpoint": str(path), "feature_dim": 8}
    model = LVSM(ModelConfig(**SMALL_MODEL, encoding="hrope-lift", predictor="backbone", predictor_options=options))
    model.train()
    assert not model.source.backbone.training
    out = model(batch)
    (out.images - batch.images[:, 2:]).square().mean().backward()
    assert all(p.grad is None for p in model.source.backbone.parameters())
    assert all(p.grad is not None for p in model.source.head.parameters())
    P = 16
    target_planes = out.parameters[0]["planes"][:, 2 * P :]
    assert (target_planes == 0).all()  # target views (no image): plane at infinity


def test_backbone_errors(tmp_path):
    with pytest.raises(PredictorError, match="not found"):
        load_backbone(TinyBackbone(), tmp_path / "missing.safetensors")
    with pytest.raises(PredictorError, match="predictor_options.module"):
        LVSM(ModelConfig(**SMALL_MODEL, encoding="hrope", predictor="backbone"))
    with pytest.raises(PredictorError, match="feature_dim"):
        LVSM(
            ModelConfig(
                **SMALL_MODEL,
                encoding="hrope",
                predictor="backbone",
                predictor_options={"module": "test_predictors:TinyBackbone"},
            )
        )


def test_learned_heads_predict_per_layer_from_hidden_states(batch):
    model = LVSM(ModelConfig(**SMALL_MODEL, encoding="hrope-lift", predictor_options={"targets": "hidden"}))
    with torch.no_grad():
        for head in model.source.heads:
            head.bias[2] = 0.25  # direct decoder: m = (0, 0, 0.25)
    out = model(batch)
    rays = token_rays(model.fold_cameras(batch.cameras, 2), GRID)
    for values in out.parameters:  # inverse depth 0.25 everywhere: m·r̂ = 0.25
        torch.testing.assert_close((values["planes"] * rays).sum(-1), torch.full(rays.shape[:2], 0.25))


def test_context_scope_reads_no_target_geometry(batch):
    """With the default scope the target view's depth, normals and planes can be anything: the
    values do not change (external with and without transfer, with simulated user depth, oracle
    with transfer)."""
    specs = parameter_specs(get_encoding("hrope-lift"))
    scrambled = dataclasses.replace(
        batch, depth=batch.depth.clone(), normals=batch.normals.clone(), plane_m=batch.plane_m.clone()
    )
    scrambled.depth[:, 2] = 7.0
    scrambled.normals[:, 2] = torch.tensor([1.0, 0.0, 0.0])[:, None, None]
    scrambled.plane_m[:, 2] = torch.tensor([0.3, 0.0, 0.0])[:, None, None]
    for name, options in (
        ("external", {}),
        ("external", {"targets": "transfer"}),
        ("oracle", {"targets": "transfer"}),
        ("external", {"depth_noise": 3}),
        ("external", {"targets": "transfer", "depth_noise": 2, "depth_sparse": 60, "fit": "robust"}),
    ):
        source = build_parameter_source(name, specs, dim=4, num_layers=1, patch_size=8, options=options)
        torch.testing.assert_close(
            source.static(scrambled, batch.cameras, GRID, 2)["planes"],
            source.static(batch, batch.cameras, GRID, 2)["planes"],
        )


def test_transferred_target_planes_match_the_target_ground_truth(batch):
    """Context planes carried into the target camera are the target's own planes wherever the same
    single surface is seen (oracle: exact; external: fitted to the splatted context depth)."""
    specs = parameter_specs(get_encoding("hrope-lift"))
    truth = batch.planes(8).m(batch.cameras, GRID)[:, 32:]
    single = single_plane_patches(batch)[:, 32:]
    for name, atol in (("oracle", 1e-4), ("external", 2e-2)):
        source = build_parameter_source(name, specs, dim=4, num_layers=1, patch_size=8, options={"targets": "transfer"})
        target = source.static(batch, batch.cameras, GRID, 2)["planes"][:, 32:]
        close = ((target - truth).norm(dim=-1) <= atol * truth.norm(dim=-1).clamp_min(1)) & single
        assert close.sum() >= 0.6 * single.sum(), (name, close.sum().item(), single.sum().item())


def test_learned_targets_neutral_and_transfer(batch):
    """targets 'neutral': target planes are the decoders' zero output whatever the head says;
    'transfer': they come from the context tokens' planes (for a single world plane predicted
    exactly on the context views, the target's own plane), and gradients reach the context heads."""
    from hrope.nvs.model import LVSM, ModelConfig

    model = LVSM(ModelConfig(**SMALL_MODEL, encoding="hrope-lift", predictor_options={"targets": "neutral"}))
    with torch.no_grad():
        for head in model.source.heads:
            head.bias[2] = 0.25
    values = model(batch).parameters[-1]["planes"]
    assert (values[:, 32:] == 0).all() and (values[:, :32, 2] == 0.25).all()
    source = build_parameter_source(
        "learned",
        parameter_specs(get_encoding("hrope-lift")),
        dim=4,
        num_layers=1,
        patch_size=8,
        options={"targets": "transfer"},
    )
    cameras = LVSM.fold_cameras(batch.cameras, 2)
    world_plane = torch.tensor([0.05, -0.1, 0.2, -1.0])  # {X : w·X = 1} in homogeneous form (w, -1)
    plane = torch.linalg.inv(cameras.world_to_cam).transpose(-1, -2) @ world_plane  # (a, d): a·X_c + d = 0
    m_views = -plane[..., :3] / plane[..., 3:]  # m·X_c = 1
    m = m_views.repeat_interleave(16, dim=1).requires_grad_()
    hit_values = source.with_targets({"planes": m}, cameras, GRID, 2)["planes"]
    torch.testing.assert_close(
        hit_values[:, 32:], m_views[:, 2:].repeat_interleave(16, dim=1).detach(), atol=1e-4, rtol=1e-4
    )
    hit_values[:, 32:].sum().backward()
    assert m.grad[:, :32].abs().sum() > 0 and (m.grad[:, 32:] == 0).all()


@pytest.mark.parametrize("encoding", ["hrope", "hrope-lift", "hrope-pf"])
def test_plane_decoders_have_full_rank_at_zero_output(encoding, batch):
    """The Jacobian of every token's plane vector with respect to its head outputs has rank 3 at the
    initial (zero) output, so every direction of m gets a gradient from the first step."""
    spec = parameter_specs(get_encoding(encoding))[0]
    token = 5
    jacobian = torch.autograd.functional.jacobian(
        lambda raw: spec.decode(raw, batch.cameras, GRID)[:, token], torch.zeros(2, 48, spec.raw_dim)
    )
    assert torch.linalg.matrix_rank(jacobian[0, :, 0, token, :]) == 3


def test_predictor_options_are_validated():
    specs = parameter_specs(get_encoding("hrope-lift"))
    for name, options, message in (
        ("learned", {"targets": "sideways"}, "targets must be one of"),
        ("oracle", {"targets": "hidden"}, "targets must be one of"),
        ("oracle", {"scope": "all", "targets": "transfer"}, "takes no targets"),
        ("external", {"scope": "everything"}, "scope must be one of"),
        ("learned", {"per_layer": "yes"}, "per_layer must be"),
        ("learned", {"use_normals": True}, "unknown predictor_options"),
    ):
        with pytest.raises(PredictorError, match=message):
            build_parameter_source(name, specs, dim=4, num_layers=1, patch_size=8, options=options)
    with pytest.raises(PredictorError, match="needs an encoding that takes planes"):  # a rule of the model config
        ModelConfig(**SMALL_MODEL, encoding="hrope-depth", predictor_options={"targets": "transfer"})
    with pytest.raises(PredictorError, match="normal-depth"):
        parameter_specs(get_encoding("hrope-pf"), plane_decoder="direct")


def test_planes_predicted_once_serve_every_layer(batch):
    from hrope.nvs.model import LVSM, ModelConfig

    model = LVSM(
        ModelConfig(**SMALL_MODEL, encoding="hrope-lift", predictor_options={"per_layer": False, "targets": "hidden"})
    )
    assert len(model.source.heads) == 1
    with torch.no_grad():
        model.source.heads[0].bias[2] = 0.25
    out = model(batch)
    assert len(out.parameters) == 1 and (out.parameters[0]["planes"][..., 2] == 0.25).all()


def test_learned_targets_default_to_hidden_and_labels_say_otherwise():
    specs = parameter_specs(get_encoding("hrope-lift"))
    default = build_parameter_source("learned", specs, dim=4, num_layers=1, patch_size=8)
    transfer = build_parameter_source(
        "learned", specs, dim=4, num_layers=1, patch_size=8, options={"targets": "transfer"}
    )
    assert default.targets == "hidden" and default.describe("learned") == "learned"
    assert transfer.describe("learned") == "learned, targets transfer"


def per_head_pair(encoding="hrope-lift", targets="transfer", seed=0):
    """A shared-planes model with random (small) plane heads and the per-head model whose every
    attention head predicts exactly those planes (the head weights tiled), all else equal."""
    torch.manual_seed(seed)
    shared = LVSM(ModelConfig(**SMALL_MODEL, encoding=encoding, predictor_options={"targets": targets}))
    per_head = LVSM(
        ModelConfig(**SMALL_MODEL, encoding=encoding, predictor_options={"targets": targets, "per_head": True})
    )
    heads = SMALL_MODEL["heads"]
    state = shared.state_dict()
    with torch.no_grad():
        for head in shared.source.heads:
            head.weight.normal_(0, 0.05)
            head.bias.normal_(0, 0.05)
        state = {
            name: value.repeat(heads, *(1,) * (value.ndim - 1)) if name.startswith("source.heads") else value
            for name, value in shared.state_dict().items()
        }
    per_head.load_state_dict(state)
    return shared, per_head


@pytest.mark.parametrize(
    ("encoding", "targets"), [("hrope-lift", "transfer"), ("hrope-lift", "hidden"), ("hrope", "transfer")]
)
def test_per_head_planes_that_agree_reproduce_shared_planes(encoding, targets, batch):
    """Every head predicting the shared planes gives the shared model's images, planes and plane
    errors (per head: a heads axis after N, each head's targets transferred on their own)."""
    from hrope.nvs.evaluation.plane_accuracy import plane_accuracy

    shared, per_head = per_head_pair(encoding, targets)
    expected, got = shared(batch), per_head(batch)
    torch.testing.assert_close(got.images, expected.images, rtol=1e-5, atol=1e-6)
    for mine, theirs in zip(got.parameters, expected.parameters):
        assert mine["planes"].shape == (*theirs["planes"].shape[:2], SMALL_MODEL["heads"], 3)
        for h in range(SMALL_MODEL["heads"]):
            torch.testing.assert_close(mine["planes"][:, :, h], theirs["planes"], rtol=1e-5, atol=1e-6)
    accuracy, reference = (
        plane_accuracy(got.parameters, batch, per_head),
        plane_accuracy(expected.parameters, batch, shared),
    )
    for group in ("context", "target"):
        for metric, value in reference[group].items():
            assert accuracy[group][metric] == pytest.approx(value, rel=1e-4, abs=1e-4), (group, metric)


def test_per_head_planes_give_each_head_its_own_transform(batch):
    """One attention layer with per-head planes equals each head attending on its own with its own
    planes (hrope.multiview_attention, one head at a time), and differs from shared planes."""
    import hrope

    _, model = per_head_pair()
    cameras = model.fold_cameras(batch.cameras, 2)
    B, N, heads = cameras.batch_size, 3 * 16, SMALL_MODEL["heads"]
    generator = torch.Generator().manual_seed(3)
    m = 0.3 * torch.randn(B, N, heads, 3, generator=generator)
    q, k, v = (torch.randn(B, heads, N, 24, generator=generator) for _ in range(3))
    got = model._prepare(cameras, {"planes": m}).full.attention(q, k, v)
    for h in range(heads):
        alone = hrope.multiview_attention(
            q[:, h : h + 1],
            k[:, h : h + 1],
            v[:, h : h + 1],
            encoding="hrope-lift",
            cameras=cameras,
            grid=GRID,
            planes=Planes.from_m(m[:, :, h]),
        )
        torch.testing.assert_close(got[:, h : h + 1], alone, rtol=1e-5, atol=1e-6)
    shared = hrope.multiview_attention(
        q, k, v, encoding="hrope-lift", cameras=cameras, grid=GRID, planes=Planes.from_m(m[:, :, 0])
    )
    assert not torch.allclose(got[:, 1:], shared[:, 1:], atol=1e-3)


def test_per_head_planes_train_and_reject_additive_encodings(batch):
    """Gradients reach every head's slice of the plane heads; an APE variant (parameters added to the
    tokens once) refuses per-head planes with one clear line."""
    from hrope.nvs.model import ModelError

    _, model = per_head_pair()
    model(batch).images.mean().backward()
    grad = model.source.heads[0].weight.grad.reshape(SMALL_MODEL["heads"], 3, -1)
    assert (grad.abs().sum((1, 2)) > 0).all()
    with pytest.raises(ModelError, match="per_head needs a relative encoding"):
        LVSM(ModelConfig(**SMALL_MODEL, encoding="hrope-lift-ape", predictor_options={"per_head": True}))
    with pytest.raises(PredictorError, match="per_head must be"):
        build_parameter_source(
            "learned",
            parameter_specs(get_encoding("hrope-lift")),
            dim=4,
            num_layers=1,
            patch_size=8,
            options={"per_head": 1},
        )


@pytest.mark.parametrize("name", ["oracle", "external"])
def test_geometry_sources_cap_planes_near_the_camera(name, batch):
    """max_inverse_distance (default 2, None: no cap) moves planes closer than 1 / cap out to that
    distance (normal kept) and leaves the others exactly as they are; the depth inputs follow the
    capped planes."""
    specs = parameter_specs(get_encoding("hrope-lift")) + parameter_specs(get_encoding("hrope-depth"))
    free = build_parameter_source(
        name, specs, dim=4, num_layers=1, patch_size=8, options={"scope": "all", "max_inverse_distance": None}
    )
    default = build_parameter_source(name, specs, dim=4, num_layers=1, patch_size=8)
    assert free.max_inverse_distance is None and default.max_inverse_distance == 2.0
    capped = build_parameter_source(
        name, specs, dim=4, num_layers=1, patch_size=8, options={"scope": "all", "max_inverse_distance": 0.6}
    )
    before, after = free.static(batch, batch.cameras, GRID, 2), capped.static(batch, batch.cameras, GRID, 2)
    norm = before["planes"].norm(dim=-1)
    inside, outside = norm <= 0.6, norm > 0.6
    assert inside.any() and outside.any()
    torch.testing.assert_close(after["planes"][inside], before["planes"][inside])
    torch.testing.assert_close(after["planes"][outside].norm(dim=-1), torch.full((int(outside.sum()),), 0.6))
    torch.testing.assert_close(
        F.normalize(after["planes"][outside], dim=-1), F.normalize(before["planes"][outside], dim=-1)
    )
    assert (after["depth"][outside] > before["depth"][outside]).all()
    with pytest.raises(PredictorError, match="max_inverse_distance must be"):
        build_parameter_source(name, specs, dim=4, num_layers=1, patch_size=8, options={"max_inverse_distance": 0})
