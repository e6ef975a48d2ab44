"""The attention probe: recorded weights equal a direct computation and leave the model's output unchanged."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from _lvsm_helpers import small_config, synthetic_batch
from PIL import Image

import hrope
import hrope.reference
from hrope.nvs.config import update_config
from hrope.nvs import cli
from hrope.nvs.evaluation.attention_probe import AttentionRecorder, landing_points, probe, query_token, query_weights
from hrope.nvs.model import build_model
from hrope.nvs.running.train import train
from hrope.nvs.viz.figures import VizError
from hrope.testing import encoding_params, random_cameras, random_planes, random_qkv

GRID = (2, 3)
V, HEADS, HEAD_DIM = 2, 2, 24  # rayrope needs head_dim >= 24
N = V * GRID[0] * GRID[1]


@pytest.mark.parametrize("encoding", ["none", "rope2d", "prope", "gta", "hrope-lift", "hrope", "hrope-depth"])
@pytest.mark.parametrize("index", [0, 7])
def test_weights_equal_dense_float64_attention(encoding, index):
    """softmax((D_i^T q_i)·(D_j^-1 k_j)/sqrt(d)) with every token's full matrix from hrope.reference."""
    cameras = random_cameras(1, V, (24, 36), seed=1)
    enc = hrope.get_encoding(encoding)
    planes = random_planes(1, N, seed=2) if enc.needs_planes else None
    params = encoding_params(encoding, 1, N, seed=3)
    q, k, _ = random_qkv(1, HEADS, N, HEAD_DIM, seed=4)
    prepared = enc.prepare(cameras, GRID, HEAD_DIM, planes=planes, **params)
    weights = query_weights(prepared, q, k, index)
    D, _ = hrope.reference.token_matrices(encoding, cameras, GRID, HEAD_DIM, planes, params)
    q_t = D[:, None, index].transpose(-1, -2) @ q[:, :, index, :, None]  # (1, heads, d, 1)
    k_t = torch.linalg.solve(D[:, None], k[..., None])  # D_j^-1 k_j: (1, heads, N, d, 1)
    direct = torch.softmax((k_t[..., 0] @ q_t)[..., 0] / math.sqrt(HEAD_DIM), dim=-1)
    assert weights.shape == (1, HEADS, N) and weights.dtype == torch.float64
    torch.testing.assert_close(weights, direct, rtol=0, atol=1e-10)


@pytest.mark.parametrize("encoding", ["urope", "rayrope", "worldrope"])
def test_query_frame_weights_reproduce_the_dense_reference_output(encoding):
    """Query-frame encodings (keys encoded in each query view's frame): the recorded weights, applied to
    the values in the query's frame, give the float64 reference's output for that query."""
    cameras = random_cameras(1, V, (24, 36), seed=1)
    params = encoding_params(encoding, 1, N, seed=3)
    q, k, v = random_qkv(1, HEADS, N, HEAD_DIM, seed=4)
    prepared = hrope.get_encoding(encoding).prepare(cameras, GRID, HEAD_DIM, **params)
    reference = hrope.reference.multiview_attention(
        q, k, v, encoding=encoding, cameras=cameras, grid=GRID, params=params
    )
    P = GRID[0] * GRID[1]
    for index in (1, P + 4):
        weights = query_weights(prepared, q, k, index)
        view = index // P
        _, v_view = prepared.apply_kv(k, v, view)
        mixed = (weights[..., None] * v_view).sum(2)  # (1, heads, d)
        rows = torch.zeros(1, HEADS, P, HEAD_DIM, dtype=q.dtype)
        rows[:, :, index - view * P] = mixed
        out = prepared.apply_o(rows, view)[:, :, index - view * P]
        torch.testing.assert_close(weights.sum(-1), torch.ones(1, HEADS, dtype=q.dtype), rtol=0, atol=1e-12)
        torch.testing.assert_close(out, reference[:, :, index], rtol=0, atol=1e-9)


@pytest.fixture(scope="module")
def batch():
    return synthetic_batch(num_scenes=1, num_views=3, num_context=2)


def block_inputs(model):
    """Forward pre-hooks that keep each block's attention input ``x`` and its prepared transform."""
    seen = {}
    handles = [
        block.attn.register_forward_pre_hook(lambda module, args, layer=layer: seen.__setitem__(layer, args))
        for layer, block in enumerate(model.blocks)
    ]
    return seen, handles


def dense_weights(encoding: str, cameras, q: torch.Tensor, k: torch.Tensor, index: int, m=None) -> torch.Tensor:
    """Float64 softmax((D_i^T q_i)·(D_j^-1 k_j)/sqrt(d)) of query ``index`` from hrope.reference's full
    matrices; q, k ``(B, heads, N, d)``, planes ``m (B, N, 3)`` when the encoding takes them."""
    planes = None if m is None else hrope.Planes.from_m(m.double())
    D, _ = hrope.reference.token_matrices(encoding, cameras.to(dtype=torch.float64), (4, 4), q.shape[-1], planes)
    q, k = q.double(), k.double()
    q_t = D[:, None, index].transpose(-1, -2) @ q[:, :, index, :, None]
    k_t = torch.linalg.solve(D[:, None], k[..., None])
    return torch.softmax((k_t[..., 0] @ q_t)[..., 0] / math.sqrt(q.shape[-1]), dim=-1)


def projected_qk(attention, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The block's q and k ``(B, heads, N, d)`` after QK-norm, computed from its input ``x``."""
    B, L, D = x.shape
    q, k, _ = attention.qkv(x).reshape(B, L, 3, attention.heads, D // attention.heads).permute(2, 0, 3, 1, 4)
    return attention.q_norm(q), attention.k_norm(k)


@pytest.mark.parametrize(
    "encoding, model_options",
    [
        ("prope", {}),
        ("hrope-lift", {}),  # learned planes, new ones in every layer
        ("hrope-lift", {"predictor": "oracle", "predictor_options": {"targets": "transfer"}}),
        ("hrope-lift", {"predictor_options": {"per_head": True}}),
    ],
)
def test_recording_changes_nothing_and_equals_a_direct_computation(batch, encoding, model_options):
    torch.manual_seed(0)
    model = build_model(small_config(encoding=encoding, **model_options)).eval()
    for parameter in model.parameters():  # away from the zero-initialised plane heads: planes that differ
        parameter.data += 0.02 * torch.randn_like(parameter)
    index = query_token((1, 2), model.config.grid, 2)
    with torch.no_grad():
        plain = model(batch)
        seen, handles = block_inputs(model)
        with AttentionRecorder(model, index) as recorder:
            recorded = model(batch).images
        for handle in handles:
            handle.remove()
        assert torch.equal(plain.images, recorded)  # the recording mode does not touch the numerics
        weights = recorder.stacked()
        assert weights.shape == (2, 1, 2, 3 * 16)  # layers, B*Vt, heads, (Vc+1)*P
        torch.testing.assert_close(weights.sum(-1), torch.ones(2, 1, 2), rtol=0, atol=1e-6)
        cameras = model.fold_cameras(batch.cameras, 2)
        for layer, block in enumerate(model.blocks):
            q, k = projected_qk(block.attn, seen[layer][0])
            values = plain.parameters[min(layer, len(plain.parameters) - 1)] if plain.parameters else {}
            m = values.get("planes")
            if m is not None and m.ndim == 4:  # planes per head: every head with its own
                direct = torch.cat(
                    [dense_weights(encoding, cameras, q[:, [h]], k[:, [h]], index, m[:, :, h]) for h in range(2)], 1
                )
            else:
                direct = dense_weights(encoding, cameras, q, k, index, m)
            torch.testing.assert_close(weights[layer].double(), direct, rtol=0, atol=2e-6)
    assert all(not block.attn._forward_pre_hooks for block in model.blocks)  # the hooks are gone on exit


def test_recording_a_query_frame_encoding_changes_nothing(batch):
    torch.manual_seed(0)
    model = build_model(small_config(encoding="urope")).eval()
    with torch.no_grad(), AttentionRecorder(model, 40) as recorder:
        recorded = model(batch).images
    assert torch.equal(model(batch).images, recorded)
    torch.testing.assert_close(recorder.stacked().sum(-1), torch.ones(2, 1, 2), rtol=0, atol=1e-6)


def test_a_folded_model_is_refused_in_one_line(batch):
    """The probe reads the unfolded transform; a model built with model.folded_attention says so."""
    model = build_model(small_config(encoding="prope", folded_attention=True)).eval()
    with torch.no_grad(), AttentionRecorder(model, 40), pytest.raises(VizError, match="folded_attention false"):
        model(batch)


def test_landing_point_of_a_view_seen_from_the_same_camera_is_the_patch_centre():
    """A context camera equal to the target camera sees the query patch's plane point at that patch's centre."""
    cameras = random_cameras(1, 2, (24, 36), seed=5)
    same = hrope.Cameras(cameras.K[:, [1, 1]], cameras.world_to_cam[:, [1, 1]], cameras.image_size)
    m = torch.tensor([0.1, -0.2, 0.4], dtype=torch.float64)
    points = landing_points(m, same, (4, 6), (5, 3))  # patches of 6x6 pixels
    torch.testing.assert_close(points, torch.tensor([[5.5 * 6, 3.5 * 6]]), rtol=0, atol=1e-4)
    assert landing_points(torch.zeros(3), same, (4, 6), (5, 3)) is None  # the plane at infinity: nowhere
    assert landing_points(-m, same, (4, 6), (5, 3)) is None  # crossed behind the camera


def test_probe_marks_the_true_and_the_model_landing_points(batch):
    oracle = build_model(
        small_config(encoding="hrope-lift", predictor="oracle", predictor_options={"targets": "transfer"})
    )
    result = probe(oracle, batch, (1, 2))
    assert result.truth is not None and result.truth.shape == (2, 2)
    assert len(result.planes) == 2 and all(p is not None for p in result.planes)
    plain = probe(build_model(small_config(encoding="prope")), batch, (1, 2))
    assert plain.planes == [None, None]  # no planes: no model marker
    torch.testing.assert_close(plain.truth, result.truth)
    with pytest.raises(VizError, match="outside"):
        probe(oracle, batch, (4, 0))


@pytest.fixture(scope="module")
def trained_runs(tmp_path_factory) -> list[Path]:
    """prope and urope trained for two steps (a real run folder each)."""
    runs = []
    for encoding in ("prope", "urope"):
        config = small_config(encoding=encoding)
        config = update_config(config, {"train": dict(steps=2, image_every=0, checkpoint_every=2)})
        config = update_config(config, {"train": {"out": str(tmp_path_factory.mktemp(encoding))}})
        train(config)
        runs.append(Path(config.train.out))
    return runs


@pytest.mark.slow
def test_cli_draws_runs_side_by_side(trained_runs, tmp_path, capsys):
    assert cli.run(["viz", "attention", *map(str, trained_runs), "--query", "1,2", "--out", str(tmp_path)]) == 0
    path = tmp_path / "attention.png"
    assert capsys.readouterr().out.strip() == f"wrote {path}"
    width, height = Image.open(path).size
    assert width > 2 * height  # 1 + 2 runs x 2 context views columns, 2 layer rows
    assert not list(tmp_path.glob("*.tmp"))


@pytest.mark.parametrize(
    "options, message",
    [
        (["--query", "9,0"], "outside"),
        (["--query", "1"], "two integers"),
        (["--query", "0,0", "--head", "5"], "--head 5"),
        (["--query", "0,0", "--scene", "50"], "--scene 50"),
    ],
)
def test_cli_errors_are_one_line(trained_runs, tmp_path, capsys, options, message):
    assert cli.run(["viz", "attention", str(trained_runs[0]), *options, "--out", str(tmp_path)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hrope viz: error:") and message in lines[0], lines
