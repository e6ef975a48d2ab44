"""hrope.integrations.transformers: the attention function registered in transformers'
AttentionInterface against hrope.multiview_attention and the dense reference inside tiny random
DINOv2 and Qwen2 models, the identity encoding against transformers' own sdpa, generation with
the cache against a full forward, the two examples, the benchmark, and the one-line errors."""

from __future__ import annotations

import runpy
import threading
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import Dinov2Config, Dinov2Model, Qwen2Config, Qwen2ForCausalLM

import hrope
import hrope.reference
from helpers import encoding_inputs, random_cameras, random_qkv
from hrope.integrations.transformers import NAME, Geometry, attention_forward

ROOT = Path(__file__).resolve().parents[1]
GRID, P = (2, 3), 6  # patches per view
HEAD_DIM = 24  # 3x3 and 4x4 tiles, RoPE, rayrope's 12 coordinates


def dinov2(layers=2, heads=2, implementation=NAME) -> Dinov2Model:
    torch.manual_seed(0)
    config = Dinov2Config(
        hidden_size=heads * HEAD_DIM,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=64,
        image_size=8,
        patch_size=4,
    )
    model = Dinov2Model(config).double().eval()
    model.set_attn_implementation(implementation)
    return model


def qwen2(implementation=NAME, layers=2) -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=40,
        hidden_size=4 * HEAD_DIM,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        pad_token_id=0,
    )  # grouped-query heads
    model = Qwen2ForCausalLM(config).double().eval()
    model.set_attn_implementation(implementation)
    return model


def cls_layout(views: int) -> torch.Tensor:
    """A boolean mask over ``[cls, P patches]`` per view: the patches are the camera tokens."""
    is_patch = torch.ones(views, 1 + P, dtype=torch.bool)
    is_patch[:, 0] = False
    return is_patch.flatten()


def geometry(name, cameras, camera_tokens, seed=0):
    return Geometry(name, cameras, GRID, camera_tokens=camera_tokens, **encoding_inputs(name, cameras, GRID, seed=seed))


def attention_io(attention: torch.nn.Module) -> dict:
    """Hooks on one attention layer: its q, k, v ``(B, heads, L, d)`` and its output before o_proj."""
    seen = {}

    def heads(x):
        return x.unflatten(-1, (-1, HEAD_DIM)).transpose(1, 2)

    for name in ("q", "k", "v"):
        getattr(attention, f"{name}_proj").register_forward_hook(
            lambda module, args, out, name=name: seen.__setitem__(name, heads(out))
        )
    attention.o_proj.register_forward_pre_hook(lambda module, args: seen.__setitem__("out", heads(args[0])))
    return seen


def example(name: str):
    return runpy.run_path(str(ROOT / "examples" / f"{name}.py"), run_name=name)["main"]


# --------------------------------------------------------------------------- multi-view ViT
@pytest.mark.parametrize("name", ["hrope", "hrope-lift", "prope", "rayrope"])
def test_a_dinov2_layer_computes_multiview_attention(name):
    """The second layer's attention, hooked inside the model, equals hrope.multiview_attention and the
    dense float64 reference on the same q, k, v (cls tokens: identity), and differs from plain SDPA."""
    model, V = dinov2(), 3
    cameras = random_cameras(B=2, V=V, seed=1)
    mask = cls_layout(V)
    inputs = encoding_inputs(name, cameras, GRID, seed=1)
    seen = attention_io(model.encoder.layer[1].attention)
    hidden = torch.randn(2, V * (1 + P), model.config.hidden_size, dtype=torch.float64)
    model.encoder(hidden, hrope_geometry=Geometry(name, cameras, GRID, camera_tokens=mask, **inputs))
    q, k, v = seen["q"], seen["k"], seen["v"]
    args = dict(encoding=name, cameras=cameras, grid=GRID, camera_tokens=mask, scale=HEAD_DIM**-0.5, **inputs)
    library = hrope.multiview_attention(q, k, v, **args)
    torch.testing.assert_close(seen["out"], library, rtol=0, atol=1e-13)  # measured 0
    reference = hrope.reference.multiview_attention(q, k, v, **args)
    torch.testing.assert_close(seen["out"], reference, rtol=0, atol=1e-13)  # measured 4e-15 (rayrope)
    assert (seen["out"] - torch.nn.functional.scaled_dot_product_attention(q, k, v)).abs().max() > 1e-2


def test_the_multiview_vit_example_runs_forward_and_backward():
    """examples/transformers_multiview_vit.py: gradients reach the encoder and the plane head."""
    result = example("transformers_multiview_vit")(["--batch", "1", "--views", "2", "--layers", "1"])
    assert result["hidden"].shape == (1, 2 * 17, 64) and torch.isfinite(result["hidden"]).all()
    norms = result["gradient_norms"]
    assert norms["encoder"] > 0 and norms["plane head"] > 0, norms


def test_one_prepare_per_model_call():
    """Every layer reuses the geometry's prepared transform."""
    model, encoding = dinov2(layers=3), hrope.get_encoding("prope")
    calls = []
    prepare = encoding.prepare
    encoding.prepare = lambda *a, **kw: calls.append(1) or prepare(*a, **kw)
    cameras = random_cameras(B=1, V=2, seed=2)
    hidden = torch.randn(1, 2 * (1 + P), model.config.hidden_size, dtype=torch.float64)
    model.encoder(hidden, hrope_geometry=Geometry(encoding, cameras, GRID, camera_tokens=cls_layout(2)))
    assert len(calls) == 1


# --------------------------------------------------------------------------- the identity encoding
def test_the_identity_encoding_equals_transformers_sdpa():
    """Geometry("none") (no transform, no RoPE) reproduces each model's own sdpa attention: the same
    masks (left padding, causal), grouped-query heads, scaling, for Qwen2 and DINOv2."""
    cameras = random_cameras(B=2, V=2, seed=3)
    ids = torch.randint(1, 40, (2, 2 * P + 3))
    padding = torch.ones_like(ids)
    padding[1, :2] = 0  # left padding of the second sample
    adapted = qwen2()(
        input_ids=ids,
        attention_mask=padding,
        hrope_geometry=Geometry("none", cameras, GRID, camera_tokens=list(range(2, 2 + 2 * P))),
    ).logits
    expected = qwen2("sdpa")(input_ids=ids, attention_mask=padding).logits
    torch.testing.assert_close(adapted, expected, rtol=0, atol=1e-13)  # measured 0: the same SDPA calls
    hidden = torch.randn(2, 2 * (1 + P), 2 * HEAD_DIM, dtype=torch.float64)
    adapted = dinov2().encoder(hidden, hrope_geometry=Geometry("none", cameras, GRID, camera_tokens=cls_layout(2)))
    expected = dinov2(implementation="sdpa").encoder(hidden)
    torch.testing.assert_close(adapted.last_hidden_state, expected.last_hidden_state, rtol=0, atol=1e-13)


# --------------------------------------------------------------------------- video LLM
def test_the_video_llm_example_generates_with_the_cache_as_a_full_forward():
    """examples/video_llm_qwen2.py: every logit of cached greedy generation equals the full forward's
    (float32 logits by two orders of summation: to float32 rounding), and the answer is its argmax."""
    result = example("video_llm_qwen2")(["--frames", "2", "--grid", "2", "2", "--new-tokens", "4"])
    cached, full = result["cached_logits"], result["full_logits"]
    assert cached.shape == full.shape == (4, 128)
    torch.testing.assert_close(full.float(), cached, rtol=2e-6, atol=2e-6)  # measured <= 1.8e-7; 10x margin
    assert torch.equal(full.argmax(-1), result["answer"][0])


def video_sequence(model, frames=2):
    """[3 text tokens, frame 1, 1 separator, frame 2, 2 text tokens] as embeddings, and the visual positions."""
    embed = model.get_input_embeddings()
    text = embed(torch.randint(1, 40, (1, 6)))
    visual = torch.randn(1, frames * P, model.config.hidden_size, dtype=torch.float64) * 0.1
    sequence = torch.cat([text[:, :3], visual[:, :P], text[:, 3:4], visual[:, P:], text[:, 4:]], 1)
    return sequence, [*range(3, 3 + P), *range(4 + P, 4 + 2 * P)]


def test_text_tokens_get_the_identity_and_the_causal_mask_is_kept():
    """Text before the first frame sees no camera (same logits for other cameras, and as with
    transformers' sdpa); later tokens do; changing a token never changes earlier logits."""
    model = qwen2()
    sequence, positions = video_sequence(model)
    runs = [
        model(
            inputs_embeds=sequence, hrope_geometry=geometry("hrope", random_cameras(B=1, V=2, seed=s), positions)
        ).logits
        for s in (4, 5)
    ]
    torch.testing.assert_close(runs[0][:, :3], runs[1][:, :3], rtol=0, atol=1e-13)  # measured 0
    assert (runs[0][:, 4:] - runs[1][:, 4:]).abs().amax(-1).min() > 1e-3  # measured 0.05
    model.set_attn_implementation("sdpa")
    torch.testing.assert_close(runs[0][:, :3], model(inputs_embeds=sequence).logits[:, :3], rtol=0, atol=1e-13)
    model.set_attn_implementation(NAME)
    changed = sequence.clone()
    changed[:, 8] += 1.0  # a visual token of the first frame
    later = model(
        inputs_embeds=changed, hrope_geometry=geometry("hrope", random_cameras(B=1, V=2, seed=4), positions)
    ).logits
    torch.testing.assert_close(later[:, :8], runs[0][:, :8], rtol=0, atol=1e-13)
    assert (later[:, 8:] - runs[0][:, 8:]).abs().amax(-1).min() > 1e-3


def test_generate_inside_the_geometry_prepares_once_and_leaves_it_afterwards():
    model, encoding = qwen2(), hrope.get_encoding("hrope-lift")
    calls = []
    prepare = encoding.prepare
    encoding.prepare = lambda *a, **kw: calls.append(1) or prepare(*a, **kw)
    sequence, positions = video_sequence(model)
    cameras = random_cameras(B=1, V=2, seed=6)
    g = Geometry(encoding, cameras, GRID, camera_tokens=positions, **encoding_inputs("hrope-lift", cameras, GRID))
    with torch.no_grad(), g:
        out = model.generate(inputs_embeds=sequence, max_new_tokens=3, min_new_tokens=3, do_sample=False)
    assert out.shape == (1, 3) and len(calls) == 1
    with pytest.raises(hrope.EncodingError, match="hrope_geometry"):
        model(inputs_embeds=sequence)


# --------------------------------------------------------------------------- the attention function
class Attention(torch.nn.Module):
    """What the attention function reads from a model's attention layer."""

    def __init__(self, is_causal: bool) -> None:
        super().__init__()
        self.is_causal = is_causal


@settings(max_examples=20, deadline=None)
@given(
    name=st.sampled_from(["hrope", "prope", "gta", "cape"]),
    views=st.integers(1, 2),
    extra=st.integers(0, 3),
    new=st.integers(1, 3),
    kv_heads=st.sampled_from([1, 2, 4]),
    causal=st.booleans(),
    order=st.randoms(use_true_random=False),
)
def test_the_attention_function_matches_the_library_on_random_layouts(name, views, extra, new, kv_heads, causal, order):
    """Any camera-token layout among identity tokens, grouped-query heads, causal or not: the output
    is hrope.multiview_attention's, in transformers' (B, L, heads, d) layout; ``new`` more identity
    tokens decoded over the cache (no mask: causal lower-right) equal the last rows of the full
    causal attention."""
    cameras = random_cameras(B=2, V=views, seed=views)
    L = views * P + extra
    positions = order.sample(range(L), views * P)
    q, _, _ = random_qkv(2, 4, L + new, HEAD_DIM, seed=extra)
    _, k, v = random_qkv(2, kv_heads, L + new, HEAD_DIM, seed=extra + 1)
    inputs = encoding_inputs(name, cameras, GRID, seed=2)
    g = Geometry(name, cameras, GRID, camera_tokens=positions, **inputs)
    out, weights = attention_forward(
        Attention(causal), q[:, :, :L], k[:, :, :L], v[:, :, :L], None, scaling=0.3, hrope_geometry=g
    )
    expected = hrope.multiview_attention(
        q[:, :, :L],
        k[:, :, :L],
        v[:, :, :L],
        encoding=name,
        cameras=cameras,
        grid=GRID,
        camera_tokens=positions,
        scale=0.3,
        is_causal=causal,
        enable_gqa=kv_heads != 4,
        **inputs,
    )
    assert weights is None and out.shape == (2, L, 4, HEAD_DIM) and out.is_contiguous()
    torch.testing.assert_close(out, expected.transpose(1, 2), rtol=0, atol=1e-13)  # measured 0
    decoded, _ = attention_forward(Attention(True), q[:, :, L:], k, v, None, hrope_geometry=g)
    full = hrope.multiview_attention(
        q,
        k,
        v,
        encoding=name,
        cameras=cameras,
        grid=GRID,
        camera_tokens=positions,
        is_causal=True,
        enable_gqa=kv_heads != 4,
        **inputs,
    )
    torch.testing.assert_close(decoded, full[:, :, L:].transpose(1, 2), rtol=0, atol=1e-13)  # measured 1.3e-15


@pytest.mark.parametrize("groups_heads", [True, False])
def test_grouped_heads_equal_repeated_heads_with_or_without_sdpa_grouping(monkeypatch, groups_heads):
    """SDPA groups key / value heads itself (enable_gqa) from torch 2.5 only; the attention function
    repeats them before: either way the output is the attention over explicitly repeated heads,
    in a full forward and when decoding over the cache."""
    import hrope.integrations.transformers as adapter

    monkeypatch.setattr(adapter, "SDPA_GROUPS_HEADS", groups_heads and adapter.SDPA_GROUPS_HEADS)
    cameras = random_cameras(B=2, V=2, seed=3)
    L, new = 2 * P + 1, 2
    positions = list(range(1, L))
    q, _, _ = random_qkv(2, 4, L + new, HEAD_DIM, seed=4)
    _, k, v = random_qkv(2, 2, L + new, HEAD_DIM, seed=5)
    k4, v4 = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    inputs = encoding_inputs("prope", cameras, GRID, seed=2)
    g = Geometry("prope", cameras, GRID, camera_tokens=positions, **inputs)
    out, _ = attention_forward(Attention(True), q[:, :, :L], k[:, :, :L], v[:, :, :L], None, hrope_geometry=g)
    decoded, _ = attention_forward(Attention(True), q[:, :, L:], k, v, None, hrope_geometry=g)
    options = dict(encoding="prope", cameras=cameras, grid=GRID, camera_tokens=positions, is_causal=True)
    expected = hrope.multiview_attention(q[:, :, :L], k4[:, :, :L], v4[:, :, :L], **options)
    full = hrope.multiview_attention(q, k4, v4, **options)
    torch.testing.assert_close(out, expected.transpose(1, 2), rtol=0, atol=1e-13)
    torch.testing.assert_close(decoded, full[:, :, L:].transpose(1, 2), rtol=0, atol=1e-13)


def test_the_geometry_is_active_only_inside_its_block_and_thread():
    cameras = random_cameras(B=1, V=1, seed=7)
    q, k, v = random_qkv(1, 2, P, HEAD_DIM, seed=7)
    outer, inner = Geometry("prope", cameras, GRID), Geometry("rope2d", cameras, GRID)
    found = []
    with outer:
        with inner:
            found.append(attention_forward(Attention(False), q, k, v, None)[0])
        found.append(attention_forward(Attention(False), q, k, v, None)[0])
        other = threading.Thread(
            target=lambda: found.append(
                pytest.raises(hrope.EncodingError, attention_forward, Attention(False), q, k, v, None)
            )
        )
        other.start()
        other.join()
    for got, name in zip(found, ["rope2d", "prope"]):
        expected = hrope.multiview_attention(q, k, v, encoding=name, cameras=cameras, grid=GRID).transpose(1, 2)
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-13)
    assert len(found) == 3, "the other thread saw an active geometry"
    with pytest.raises(hrope.EncodingError, match="hrope_geometry"):
        attention_forward(Attention(False), q, k, v, None)


# --------------------------------------------------------------------------- errors
def errors():
    cameras = random_cameras(B=1, V=1, seed=8)
    q, k, v = random_qkv(1, 2, P + 1, HEAD_DIM, seed=8)
    module = Attention(True)
    first_token_is_text = Geometry("prope", cameras, GRID, camera_tokens=slice(1, None))
    attention_forward(module, q, k, v, None, hrope_geometry=first_token_is_text)
    query_frame = geometry("rayrope", cameras, list(range(P)))
    attention_forward(module, q, k, v, None, hrope_geometry=query_frame)
    yield "no geometry", "needs hrope_geometry=", lambda: attention_forward(module, q, k, v, None)
    yield "not a geometry", "got dict", lambda: attention_forward(module, q, k, v, None, hrope_geometry={})
    yield "cameras", "cameras must be hrope.Cameras", lambda: Geometry("prope", "cams", GRID)
    yield "grid", "grid must be", lambda: Geometry("prope", cameras, (2, 0))
    yield "unknown encoding", "unknown encoding", lambda: Geometry("hrope2", cameras, GRID)
    yield (
        "softcap",
        "takes no softcap",
        lambda: attention_forward(module, q, k, v, None, softcap=30.0, hrope_geometry=first_token_is_text),
    )
    yield (
        "camera tokens among new tokens",
        "new tokens include camera tokens",
        lambda: attention_forward(module, q[:, :, -2:], k, v, None, hrope_geometry=first_token_is_text),
    )
    yield (
        "query-frame decoding",
        "query-frame encodings",
        lambda: attention_forward(module, q[:, :, -1:], k, v, None, hrope_geometry=query_frame),
    )
    yield (
        "camera-token count",
        "camera_tokens gives",
        lambda: attention_forward(
            module, q, k, v, None, hrope_geometry=Geometry("prope", cameras, GRID, camera_tokens=slice(0, 3))
        ),
    )
    yield (
        "sequence length",
        f"(1, heads, {P}, {HEAD_DIM})",
        lambda: attention_forward(module, q, k, v, None, hrope_geometry=Geometry("prope", cameras, GRID)),
    )
    yield (
        "batch",
        "(2, heads",
        lambda: attention_forward(
            module,
            q,
            k,
            v,
            None,
            hrope_geometry=Geometry("prope", random_cameras(B=2, V=1, seed=8), GRID, camera_tokens=slice(1, None)),
        ),
    )
    yield (
        "missing planes",
        "needs planes",
        lambda: attention_forward(
            module, q, k, v, None, hrope_geometry=Geometry("hrope", cameras, GRID, camera_tokens=slice(1, None))
        ),
    )


@pytest.mark.parametrize(("case", "message", "call"), list(errors()), ids=[e[0] for e in errors()])
def test_bad_input_gives_one_line_input_errors(case, message, call):
    with pytest.raises(hrope.InputError) as error:
        call()
    assert message in str(error.value) and "\n" not in str(error.value), str(error.value)


# --------------------------------------------------------------------------- the benchmark
def test_adapter_overhead_benchmark_writes_every_ratio(tmp_path, monkeypatch):
    """A one-repetition run of benchmarks/adapter_overhead.py on a tiny shape: a positive ratio per
    reported pair in JSON and Markdown."""
    import json

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import adapter_overhead

    argv = [
        "--reps",
        "1",
        "--grid",
        "2",
        "--heads",
        "2",
        "--head-dim",
        "16",
        "--adapters",
        "transformers",
        "--out",
        str(tmp_path),
    ]
    results = adapter_overhead.main(argv)
    saved = json.loads((tmp_path / "adapter_overhead.json").read_text())
    assert saved["results"] == results and set(results) == {"transformers"}
    rows = results["transformers"]
    assert len(rows) == 6 and all(r["ratio"] > 0 for r in rows)
    table = (tmp_path / "adapter_overhead.md").read_text()
    assert all(f"| transformers | {r['call']} | {r['relative_to']} |" in table for r in rows)
