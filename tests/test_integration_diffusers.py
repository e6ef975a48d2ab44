"""The diffusers adapter (hrope.integrations.diffusers): MultiViewAttnProcessor inside diffusers'
Attention against AttnProcessor2_0, hrope.multiview_attention, hrope.cross_attention and the dense
float64 reference; geometry forwarded by diffusers' own models; its one-line errors; and the
EscherNet-style example (examples/eschernet_style_denoiser.py) run tiny."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from diffusers import UNet2DConditionModel
from diffusers.models.attention import BasicTransformerBlock
from diffusers.models.attention_processor import Attention, AttnProcessor2_0
from hypothesis import given, settings
from hypothesis import strategies as st

import hrope
import hrope.reference
from helpers import RELATIVE, encoding_inputs, random_cameras, random_se3
from hrope.integrations.diffusers import MultiViewAttnProcessor, SceneGeometry, TokenGeometry, set_processor
from hrope.reference import dense_attention, token_matrices, with_identity_tokens

GRID, P = (2, 2), 4
HEADS, HEAD_DIM, DIM = 2, 24, 32  # head_dim 24: 3x3 and 4x4 tiles, RoPE, rayrope's 12 coordinates
ROOT = Path(__file__).resolve().parents[1]
EXAMPLE, BENCHMARKS = ROOT / "examples" / "eschernet_style_denoiser.py", ROOT / "benchmarks"
NAMED = ["cape", "prope", "hrope", "hrope-lift"]


def layer(dtype=torch.float64, seed=0, **options) -> Attention:
    torch.manual_seed(seed)
    return Attention(query_dim=DIM, heads=HEADS, dim_head=HEAD_DIM, **options).to(dtype)


def run(attn: Attention, processor, x, context=None, **kwargs):
    attn.set_processor(processor)
    return attn(x, encoder_hidden_states=context, **kwargs)


def project(attn: Attention, x, context=None):
    """AttnProcessor2_0's q, k, v of a plain Attention, (B, heads, L, head_dim)."""
    context = x if context is None else context
    return [
        y.unflatten(-1, (HEADS, HEAD_DIM)).transpose(1, 2)
        for y in (attn.to_q(x), attn.to_k(context), attn.to_v(context))
    ]


def merge(attn: Attention, out):
    return attn.to_out[0](out.transpose(1, 2).flatten(2))


def scene_of(name, cameras, grid=GRID, seed=0):
    inputs = encoding_inputs(name, cameras, grid, seed=seed, dtype=cameras.K.dtype)
    return SceneGeometry(cameras, grid, **inputs), inputs


def tokens(B, L, dtype, seed=1, dim=DIM):
    return torch.randn(B, L, dim, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(dtype)


# --------------------------------------------------------------------------- AttnProcessor2_0
CONFIGS = {  # Attention options, input shape, with encoder states, attention mask, temb
    "self": ({}, (2, 12, DIM), False, True, False),
    "4d-spatial-group-norm-residual": (
        dict(norm_num_groups=4, spatial_norm_dim=3, residual_connection=True, rescale_output_factor=2.0),
        (2, DIM, 2, 3),
        False,
        False,
        True,
    ),
    "cross-norms": (
        dict(cross_attention_dim=16, qk_norm="layer_norm", cross_attention_norm="layer_norm"),
        (2, 4, DIM),
        True,
        True,
        False,
    ),
}


@pytest.mark.parametrize("config", list(CONFIGS))
def test_none_encoding_is_attn_processor_2_0(config):
    """With the identity encoding the processor is AttnProcessor2_0 bit for bit: norms, spatial norm,
    4-D inputs, the mask, the output projection, residual and rescaling."""
    options, shape, cross, masked, with_temb = CONFIGS[config]
    attn = layer(**options)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(*shape, generator=g, dtype=torch.float64)
    context = torch.randn(2, 8, 16, generator=g, dtype=torch.float64) if cross else None
    kv_length = 8 if cross else 12
    kwargs = {"attention_mask": torch.randn(2, 1, kv_length, generator=g, dtype=torch.float64)} if masked else {}
    if with_temb:
        kwargs["temb"] = torch.randn(2, 3, 1, 1, generator=g, dtype=torch.float64)
    expected = run(attn, AttnProcessor2_0(), x, context, **kwargs)
    views = 1 if x.ndim == 4 else shape[1] // P
    grid = tuple(shape[2:]) if x.ndim == 4 else GRID
    scene = SceneGeometry(random_cameras(B=2, V=views), grid)
    got = run(attn, MultiViewAttnProcessor("none"), x, context, geometry=scene.tokens(), **kwargs)
    assert torch.equal(got, expected)


# --------------------------------------------------------------------------- self-attention
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", [*NAMED, "gta", "rayrope", "urope"])
def test_self_attention_is_multiview_attention(name, dtype):
    """Exactly hrope.multiview_attention on the projected q, k, v (same calls), and in float64 the
    dense reference (measured worst 7e-15, hrope)."""
    cameras = random_cameras(B=2, V=3, seed=3, dtype=dtype)
    scene, inputs = scene_of(name, cameras, seed=3)
    attn, x = layer(dtype), tokens(2, 12, dtype)
    got = run(attn, MultiViewAttnProcessor(name), x, geometry=scene.tokens())
    q, k, v = project(attn, x)
    args = dict(encoding=name, cameras=cameras, grid=GRID, **inputs)
    assert torch.equal(got, merge(attn, hrope.multiview_attention(q, k, v, **args)))
    if dtype == torch.float64:
        reference = merge(attn, hrope.reference.multiview_attention(q, k, v, **args))
        torch.testing.assert_close(got, reference, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("name", ["hrope-lift", "urope"])
def test_self_attention_with_register_tokens(name):
    """Camera tokens among identity tokens (registers first, then text between the views)."""
    cameras = random_cameras(B=1, V=2, seed=4)
    scene, inputs = scene_of(name, cameras, seed=4)
    attn, x = layer(), tokens(1, 11, torch.float64, seed=4)
    layout = [2, 3, 4, 5, 7, 8, 9, 10]
    got = run(attn, MultiViewAttnProcessor(name), x, geometry=scene.tokens(camera_tokens=layout, length=11))
    q, k, v = project(attn, x)
    args = dict(encoding=name, cameras=cameras, grid=GRID, camera_tokens=layout, **inputs)
    assert torch.equal(got, merge(attn, hrope.multiview_attention(q, k, v, **args)))
    torch.testing.assert_close(
        got, merge(attn, hrope.reference.multiview_attention(q, k, v, **args)), rtol=1e-13, atol=1e-13
    )


# --------------------------------------------------------------------------- cross-attention
def cross_reference(name, q, k, v, queries, keys):
    """Dense float64 cross-attention; each side (scene, views, camera_tokens, length), or None for
    tokens without cameras (identity)."""
    matrices = []
    for side, x in ((queries, q), (keys, k)):
        if side is None:
            matrices.append(torch.eye(HEAD_DIM, dtype=torch.float64).expand(x.shape[0], x.shape[2], -1, -1))
            continue
        scene, views, camera_tokens, length = side
        M, _ = token_matrices(
            name, scene.cameras.to(dtype=torch.float64), scene.grid, HEAD_DIM, scene.planes, scene.params
        )
        P_scene = scene.grid[0] * scene.grid[1]
        M = M[:, [c * P_scene + p for c in views for p in range(P_scene)]]
        matrices.append(M if camera_tokens is None else with_identity_tokens(M, camera_tokens, length))
    return dense_attention(q, k, v, *matrices, transform_values=hrope.ENCODINGS[name].transform_values)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", [*NAMED, "gta"])
def test_cross_attention_is_core_cross_attention(name, dtype):
    """Target view 2 attends to reference views 0 and 1 of one scene: exactly hrope.cross_attention
    with the scene's transform split by select_views."""
    cameras = random_cameras(B=2, V=3, seed=5, dtype=dtype)
    scene, inputs = scene_of(name, cameras, seed=5)
    attn = layer(dtype, cross_attention_dim=16)
    x, context = tokens(2, 4, dtype, seed=5), tokens(2, 8, dtype, seed=6, dim=16)
    got = run(
        attn,
        MultiViewAttnProcessor(name),
        x,
        context,
        geometry=scene.tokens([2]),
        encoder_geometry=scene.tokens([0, 1]),
    )
    t = hrope.get_encoding(name).prepare(cameras, GRID, HEAD_DIM, planes=inputs["planes"], **inputs["params"])
    q, k, v = project(attn, x, context)
    expected = hrope.cross_attention(q, k, v, query=t.select_views([2]), key=t.select_views([0, 1]))
    assert torch.equal(got, merge(attn, expected))


@pytest.mark.parametrize("name", RELATIVE)
def test_cross_attention_matches_the_dense_reference(name):
    """Every relative encoding, float64: targets (views 3, 1) with a register token attend to references
    (views 0, 2) and, with no encoder_geometry, to keys without cameras (text: identity)."""
    cameras = random_cameras(B=2, V=4, seed=7)
    scene, _ = scene_of(name, cameras, seed=7)
    attn = layer(cross_attention_dim=16)
    x, context = tokens(2, 9, torch.float64, seed=7), tokens(2, 8, torch.float64, seed=8, dim=16)
    queries, keys = (scene, [3, 1], slice(1, None), 9), (scene, [0, 2], None, None)
    q_geometry = scene.tokens([3, 1], camera_tokens=slice(1, None), length=9)
    processor = MultiViewAttnProcessor(name)
    got = run(attn, processor, x, context, geometry=q_geometry, encoder_geometry=scene.tokens([0, 2]))
    q, k, v = project(attn, x, context)
    torch.testing.assert_close(got, merge(attn, cross_reference(name, q, k, v, queries, keys)), rtol=1e-13, atol=1e-13)
    text = run(attn, processor, x, context, geometry=q_geometry)
    expected = merge(attn, cross_reference(name, q, k, v, queries, None))
    torch.testing.assert_close(text, expected, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("name", ["hrope", "hrope-lift", "cape"])
def test_token_sets_of_two_grids_share_one_gauge(name):
    """Queries on a 3x2 grid, keys on a 2x2 grid: two scenes over the same cameras give exact
    cross-attention (hrope's centroid gauge depends on the cameras only), while preparing the
    reference cameras alone changes hrope's gauge and so its output."""
    cameras = random_cameras(B=1, V=3, seed=9)
    fine, _ = scene_of(name, cameras, grid=(3, 2), seed=9)
    coarse, _ = scene_of(name, cameras, grid=(2, 2), seed=10)
    attn = layer(cross_attention_dim=16)
    x, context = tokens(1, 6, torch.float64, seed=9), tokens(1, 8, torch.float64, seed=10, dim=16)
    processor = MultiViewAttnProcessor(name)
    got = run(attn, processor, x, context, geometry=fine.tokens([2]), encoder_geometry=coarse.tokens([0, 1]))
    q, k, v = project(attn, x, context)
    expected = cross_reference(name, q, k, v, (fine, [2], None, None), (coarse, [0, 1], None, None))
    torch.testing.assert_close(got, merge(attn, expected), rtol=1e-13, atol=1e-13)
    planes = None if coarse.planes is None else hrope.Planes.from_m(coarse.planes.m(cameras, (2, 2))[:, :8])
    alone = SceneGeometry(cameras.select_views([0, 1]), (2, 2), planes=planes)
    separate = run(attn, processor, x, context, geometry=fine.tokens([2]), encoder_geometry=alone.tokens())
    if name == "hrope":
        assert (separate - got).abs().max() > 1e-3
    else:  # the other encodings' transforms do not depend on other cameras
        torch.testing.assert_close(separate, got, rtol=1e-13, atol=1e-13)


@settings(max_examples=15, deadline=None)
@given(
    data=st.data(),
    name=st.sampled_from(NAMED),
    views=st.integers(2, 4),
    registers=st.integers(0, 2),
    heads=st.sampled_from([1, 2, 3]),
)
def test_any_split_of_views_into_targets_and_references(data, name, views, registers, heads):
    """Random targets and references (any order), query registers and head counts: the dense reference."""
    order = data.draw(st.permutations(range(views)))
    split = data.draw(st.integers(1, views - 1))
    targets, references = list(order[:split]), list(order[split:])
    cameras = random_cameras(B=1, V=views, seed=views + registers)
    scene, _ = scene_of(name, cameras, seed=heads)
    torch.manual_seed(heads)
    attn = Attention(query_dim=DIM, heads=heads, dim_head=HEAD_DIM, cross_attention_dim=16).double()
    length = registers + len(targets) * P
    x, context = tokens(1, length, torch.float64, seed=views), tokens(1, len(references) * P, torch.float64, dim=16)
    queries = (scene, targets, slice(registers, None) if registers else None, length if registers else None)
    got = run(
        attn,
        MultiViewAttnProcessor(name),
        x,
        context,
        geometry=scene.tokens(targets, camera_tokens=queries[2], length=queries[3]),
        encoder_geometry=scene.tokens(references),
    )
    q, k, v = (
        y.unflatten(-1, (heads, HEAD_DIM)).transpose(1, 2)
        for y in (attn.to_q(x), attn.to_k(context), attn.to_v(context))
    )
    expected = cross_reference(name, q, k, v, queries, (scene, references, None, None))
    torch.testing.assert_close(got, attn.to_out[0](expected.transpose(1, 2).flatten(2)), rtol=1e-13, atol=1e-13)


# --------------------------------------------------------------------------- diffusers' own models
def tiny_unet() -> UNet2DConditionModel:
    """Attention at 8x8 (down and up blocks) and 4x4 (mid block); cross-attention to 16-dim tokens."""
    torch.manual_seed(0)
    return UNet2DConditionModel(
        sample_size=8,
        in_channels=3,
        out_channels=3,
        layers_per_block=1,
        block_out_channels=(16, 32),
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=16,
        attention_head_dim=2,
        norm_num_groups=8,
    ).double()


def test_unet_forwards_the_geometry_to_every_attention_layer():
    """EscherNet's layout in diffusers' UNet2DConditionModel: each sample is one target view (view 2)
    with two reference views' tokens (2x2 grid) as encoder states; geometry for both resolutions.
    'none' is the default processor exactly; with cape a change of world frame leaves the output
    unchanged, and moving one reference camera changes it."""
    unet = tiny_unet()
    base = random_cameras(B=1, V=4, image_size=(32, 32), seed=11)
    views = torch.tensor([[0, 1, 2], [0, 1, 3]])  # references 0, 1; target 2 or 3

    def cameras_of(E):
        return hrope.Cameras(base.K[0, views], E[0, views], (32, 32))

    g = torch.Generator().manual_seed(11)
    sample, context = torch.randn(2, 3, 8, 8, generator=g, dtype=torch.float64), tokens(2, 8, torch.float64, dim=16)

    def denoise(processor, E=base.world_to_cam):
        cameras = cameras_of(E)
        levels = [SceneGeometry(cameras, grid).tokens([2]) for grid in ((8, 8), (4, 4))]
        kwargs = {"geometry": levels, "encoder_geometry": SceneGeometry(cameras, (2, 2)).tokens([0, 1])}
        unet.set_attn_processor(processor)
        return unet(sample, 10, encoder_hidden_states=context, cross_attention_kwargs=kwargs).sample

    unet.set_attn_processor(AttnProcessor2_0())
    default = unet(sample, 10, encoder_hidden_states=context).sample
    assert torch.equal(denoise(MultiViewAttnProcessor("none")), default)
    cape = MultiViewAttnProcessor("cape")
    out = denoise(cape)
    moved = base.world_to_cam @ torch.linalg.inv(random_se3(generator=torch.Generator().manual_seed(12)))
    torch.testing.assert_close(denoise(cape, moved), out, rtol=1e-13, atol=1e-13)  # measured 1.3e-15
    shifted = base.world_to_cam.clone()
    shifted[0, 0, :3, 3] += 0.5
    assert (denoise(cape, shifted) - out).abs().max() > 1e-3


def test_learnable_encoding_options_train_with_the_model():
    """set_processor reaches both attentions of a BasicTransformerBlock; GTA's learnable
    translation scale becomes a parameter of the block and gets a gradient."""
    torch.manual_seed(0)
    block = BasicTransformerBlock(DIM, HEADS, HEAD_DIM, cross_attention_dim=16).double()
    encoding = hrope.get_encoding("gta", learnable_translation_scale=True)
    assert set_processor(block, MultiViewAttnProcessor(encoding)) == 2
    assert any(p is encoding.translation_scale for p in block.parameters())
    cameras = random_cameras(B=1, V=3, seed=13)
    scene = SceneGeometry(cameras, GRID)
    kwargs = {"geometry": scene.tokens([1, 2]), "encoder_geometry": scene.tokens([0])}
    out = block(
        tokens(1, 8, torch.float64),
        encoder_hidden_states=tokens(1, 4, torch.float64, dim=16),
        cross_attention_kwargs=kwargs,
    )
    out.square().sum().backward()
    assert encoding.translation_scale.grad.abs().item() > 0


# --------------------------------------------------------------------------- errors
def bad_calls():
    """(call, message fragment) for every bad input."""
    cameras = random_cameras(B=1, V=3, seed=14)
    scene = SceneGeometry(cameras, GRID)
    attn, cross = layer(), layer(cross_attention_dim=16)
    x, context = tokens(1, 8, torch.float64), tokens(1, 4, torch.float64, dim=16)

    def self_attention(name="prope", **kwargs):
        return lambda: run(attn, MultiViewAttnProcessor(name), x, **kwargs)

    def cross_attention(name="prope", **kwargs):
        return lambda: run(cross, MultiViewAttnProcessor(name), x, context, **kwargs)

    def views(index):  # a scene of some of the cameras, all its views
        return SceneGeometry(cameras.select_views(index), GRID).tokens()

    two = scene.tokens([0, 1])
    return {
        "no geometry": (self_attention(), "self-attention needs cross_attention_kwargs"),
        "cross without geometry": (cross_attention(), "needs cross_attention_kwargs 'geometry'"),
        "scene instead of tokens": (self_attention(geometry=scene), "must be a TokenGeometry"),
        "not a list of tokens": (self_attention(geometry=[two, "x"]), "got ['TokenGeometry', 'str']"),
        "token count": (self_attention(geometry=scene.tokens()), "no TokenGeometry for a sequence of 8 tokens"),
        "two matches": (self_attention(geometry=[two, scene.tokens([1, 2])]), "more than one TokenGeometry"),
        "key count": (cross_attention(geometry=two, encoder_geometry=two), "'encoder_geometry': no TokenGeometry"),
        "batch": (
            self_attention(geometry=SceneGeometry(random_cameras(B=2, V=2), GRID).tokens()),
            "cameras have batch 2, the hidden states 1",
        ),
        "planes missing": (self_attention("hrope-lift", geometry=two), "needs planes"),
        "query-frame subset": (self_attention("urope", geometry=two), "build a SceneGeometry of those views"),
        "query-frame cross": (
            cross_attention("urope", geometry=views([0, 1]), encoder_geometry=views([2])),
            "got a query-frame transform",
        ),
        "view out of range": (lambda: scene.tokens([0, 3]), "view indices in [0, 3)"),
        "views not a list": (lambda: scene.tokens(2), "got 2"),
        "length alone": (lambda: scene.tokens(length=12), "camera_tokens and length go together"),
        "short length": (lambda: scene.tokens(camera_tokens=slice(0, None), length=8), "at least the 12"),
        "duplicate positions": (lambda: scene.tokens([0], camera_tokens=[0, 1, 1, 2], length=5), "given twice"),
        "cameras": (lambda: SceneGeometry(cameras.K, GRID), "cameras must be hrope.Cameras"),
        "grid": (lambda: SceneGeometry(cameras, (2, 0)), "grid must be (grid_h, grid_w)"),
        "encoding name": (lambda: MultiViewAttnProcessor("hrope2"), "unknown encoding 'hrope2'"),
    }


@pytest.mark.parametrize("case", list(bad_calls()))
def test_bad_inputs_raise_one_line_input_errors(case):
    call, fragment = bad_calls()[case]
    with pytest.raises(hrope.InputError) as info:
        call()
    message = str(info.value)
    assert fragment in message and "\n" not in message, message


def test_without_diffusers_the_import_says_what_to_install():
    code = "import sys; sys.modules['diffusers'] = None; import hrope.integrations.diffusers"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        "ImportError: hrope.integrations.diffusers needs diffusers: pip install 'hrope[diffusers]'"
    )


def test_token_geometry_reuses_its_prepared_transform():
    """Every layer of a forward pass reuses one transform per token set (tables built once)."""
    scene = SceneGeometry(random_cameras(B=1, V=2), GRID)
    geometry = scene.tokens([1])
    encoding = hrope.get_encoding("prope")
    first = geometry.transform(encoding, HEAD_DIM, torch.float32)
    assert geometry.transform(encoding, HEAD_DIM, torch.float32) is first
    assert isinstance(geometry, TokenGeometry) and geometry.num_tokens == P and first.num_tokens == P


def test_adapter_overhead_benchmark_times_the_processor(tmp_path, monkeypatch):
    """A two-repetition run of benchmarks/adapter_overhead.py's diffusers rows on a tiny shape."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import adapter_overhead

    tiny = ["--reps", "2", "--grid", "2", "--heads", "2", "--head-dim", "16", "--threads", str(torch.get_num_threads())]
    results = adapter_overhead.main(["--adapters", "diffusers", *tiny, "--out", str(tmp_path)])
    rows = [(r["call"], r["relative_to"]) for r in results["diffusers"]]
    assert ("Attention + processor", "Attention + AttnProcessor2_0") in rows and len(rows) == 4
    assert all(r["ratio"] > 0 for r in results["diffusers"])
    table = (tmp_path / "adapter_overhead.md").read_text()
    assert "| diffusers | processor | multiview_attention |" in table


# --------------------------------------------------------------------------- the example
def load_example():
    spec = importlib.util.spec_from_file_location("eschernet_style_denoiser", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TINY = [
    "--views",
    "1",
    "2",
    "--targets",
    "1",
    "--steps",
    "2",
    "--batch-size",
    "1",
    "--image-size",
    "16",
    "--layers",
    "1",
    "--threads",
    "1",
]


@pytest.fixture
def keep_threads():
    """The example sets torch's thread count; give the rest of the session its own back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_example_runs_tiny_and_prints_the_losses(capsys, keep_threads):
    example = load_example()
    results = example.main([*TINY, "--encoding", "cape", "hrope", "hrope-lift"])
    assert sorted(results) == sorted((v, e) for v in (1, 2) for e in ("cape", "hrope", "hrope-lift"))
    for result in results.values():
        assert len(result["train"]) == 2 and all(0 < x < 10 for x in [*result["train"], result["held_out"]])
    assert results[2, "cape"]["held_out"] != results[2, "hrope"]["held_out"]  # the name swaps the encoding
    printed = capsys.readouterr().out
    assert " 2 input views  hrope-lift  train loss" in printed


def test_example_learned_planes_come_from_the_references_and_train():
    """With --planes learned the zero-initialised plane head gets a gradient through the reference and
    the carried target planes; the prediction depends on the reference images."""
    example = load_example()
    torch.manual_seed(0)
    model = example.Denoiser("hrope-lift", 16, 4, 48, 2, 1, learned_planes=True)
    batch = example.make_batches(1, 1, 2, 1, 16, seed=0)[0]
    assert batch["reference_depth"].shape[1] == 2  # the target's depth is not in the batch
    noisy = torch.randn_like(batch["targets"])
    t = torch.tensor([500])
    out = model(noisy, t, batch["references"], batch["cameras"], batch["reference_depth"])
    out.square().mean().backward()
    assert model.plane_head.weight.grad.abs().max() > 0
    with torch.no_grad():
        other = model(noisy, t, batch["references"].flip(-1), batch["cameras"], batch["reference_depth"])
    assert (other - out).abs().max() > 1e-4
