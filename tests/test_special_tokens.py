"""Tokens without cameras, cross-attention and the KV cache: hrope.MixedTokens,
hrope.cross_attention and hrope.KVCache against the dense float64 reference (hrope.reference with
identity tokens) for every relative encoding, the query-frame encodings where they are defined,
the SDPA calls they make, gradients, and their one-line errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import hrope
import hrope.reference
from helpers import RELATIVE, encoding_inputs, random_cameras, random_qkv, random_se3
from hrope.reference import dense_attention, token_matrices, with_identity_tokens

GRID, P, D = (2, 2), 4, 24  # head_dim 24: 3x3 and 4x4 tiles, RoPE, rayrope's 12 coordinates
QUERY_FRAME = [name for name, cls in hrope.ENCODINGS.items() if cls.query_frame]
POSED = [name for name in RELATIVE if hrope.ENCODINGS[name].encodes_pose]
# where the 8 camera tokens of 2 views x 2x2 patches sit among 11 tokens
LAYOUTS = {
    "registers-first": slice(3, 11),
    "text-between-frames": torch.tensor([1, 2, 3, 4, 7, 8, 9, 10]),
    "mask": torch.tensor([1, 1, 1, 1, 0, 1, 1, 1, 1, 0, 0], dtype=torch.bool),
    "unordered": [10, 0, 3, 7, 1, 9, 4, 6],
}
L = 11


def prepared(name, cameras, seed=0, encoding=None):
    inputs = encoding_inputs(name, cameras, GRID, seed=seed)
    enc = encoding or hrope.get_encoding(name)
    return enc.prepare(cameras, GRID, D, planes=inputs["planes"], **inputs["params"]), inputs


def matrices(name, cameras, inputs, camera_tokens=None, length=None):
    """The reference's per-token matrices, identity tokens included."""
    M, _ = token_matrices(name, cameras, GRID, D, inputs["planes"], inputs["params"])
    return M if camera_tokens is None else with_identity_tokens(M, camera_tokens, length)


def fast_and_reference(encoding, q, k, v, cameras, inputs, camera_tokens, **kw):
    args = dict(encoding=encoding, cameras=cameras, grid=GRID, camera_tokens=camera_tokens, **inputs, **kw)
    return hrope.multiview_attention(q, k, v, **args), hrope.reference.multiview_attention(q, k, v, **args)


# --------------------------------------------------------------------------- mixed sequences
@pytest.mark.parametrize("layout", ["registers-first", "unordered"])  # a slice; a gather and scatter
@pytest.mark.parametrize("name", RELATIVE + QUERY_FRAME)
def test_mixed_sequences_match_the_reference(name, layout):
    cameras = random_cameras(B=2, V=2, seed=1)
    q, k, v = random_qkv(2, 2, L, D, seed=1)
    fast, ref = fast_and_reference(
        name, q, k, v, cameras, encoding_inputs(name, cameras, GRID, seed=1), LAYOUTS[layout]
    )
    assert fast.shape == q.shape
    torch.testing.assert_close(fast, ref, rtol=1e-9, atol=1e-9)  # measured worst 1e-13 (rayrope)


@pytest.mark.parametrize("name", ["hrope", "urope", "rayrope"])
@pytest.mark.parametrize("mask", ["causal", "boolean", "additive"])
def test_mixed_sequences_keep_the_callers_mask(name, mask):
    """is_causal is causal over the L positions; attn_mask rows and columns are sequence positions."""
    cameras = random_cameras(B=1, V=2, seed=2)
    q, k, v = random_qkv(1, 2, L, D, seed=2)
    g = torch.Generator().manual_seed(2)
    kw = (
        {"is_causal": True}
        if mask == "causal"
        else {
            "attn_mask": (torch.rand(L, L, generator=g) > 0.4) | torch.eye(L, dtype=torch.bool)
            if mask == "boolean"
            else torch.randn(1, 2, L, L, generator=g, dtype=torch.float64)
        }
    )
    inputs = encoding_inputs(name, cameras, GRID, seed=2)
    fast, ref = fast_and_reference(name, q, k, v, cameras, inputs, LAYOUTS["text-between-frames"], **kw)
    torch.testing.assert_close(fast, ref, rtol=1e-9, atol=1e-9)
    unmasked, _ = fast_and_reference(name, q, k, v, cameras, inputs, LAYOUTS["text-between-frames"])
    assert (fast - unmasked).abs().max() > 1e-3


@pytest.mark.parametrize("name", POSED)
def test_identity_tokens_get_the_identity(name):
    """Other cameras change every logit between camera tokens of different views and none between
    identity tokens; identity tokens pass through apply_q/k/v/o bit for bit."""
    layout = LAYOUTS["text-between-frames"]
    identity = torch.tensor([0, 5, 6])
    q, k, v = random_qkv(1, 2, L, D, seed=3)
    logits, outputs = [], []
    for seed in (3, 4):
        mixed = hrope.MixedTokens(prepared(name, random_cameras(B=1, V=2, seed=seed), seed)[0], layout, L)
        for x, apply in ((q, mixed.apply_q), (k, mixed.apply_k), (v, mixed.apply_v), (v, mixed.apply_o)):
            assert torch.equal(apply(x)[:, :, identity], x[:, :, identity])
        logits.append(mixed.apply_q(q) @ mixed.apply_k(k).mT)
        outputs.append(mixed.attention(q, k, v))
    assert torch.equal(logits[0][..., identity[:, None], identity], logits[1][..., identity[:, None], identity])
    torch.testing.assert_close(
        logits[0][..., identity[:, None], identity],
        (q @ k.mT)[..., identity[:, None], identity],
        rtol=1e-13,
        atol=1e-13,  # measured 0 (the same products)
    )
    view0, view1 = layout[:4], layout[4:]
    assert (logits[0][..., view0[:, None], view1] - logits[1][..., view0[:, None], view1]).abs().min() > 1e-6
    assert (outputs[0][:, :, layout] - outputs[1][:, :, layout]).abs().max() > 1e-3


@pytest.mark.parametrize("name", ["prope", "hrope-lift", "gta"])
def test_identity_tokens_see_absolute_poses(name):
    """A change of world frame leaves logits between camera tokens unchanged but not those between
    a camera token and an identity token (q_i^T D_i k_j: D_i alone is not world-frame invariant)."""
    cameras = random_cameras(B=1, V=2, seed=16)
    moved = cameras.transform_world(random_se3(generator=torch.Generator().manual_seed(16)))
    q, k, _ = random_qkv(1, 2, L, D, seed=16)
    layout, identity = LAYOUTS["text-between-frames"], torch.tensor([0, 5, 6])
    logits = []
    for cams in (cameras, moved):
        t, _ = prepared(name, cams, 16)  # hrope-lift's planes live in each camera's frame: unchanged
        mixed = hrope.MixedTokens(t, layout, L)
        logits.append(mixed.apply_q(q) @ mixed.apply_k(k).mT)
    camera_block = (..., layout[:, None], layout)
    torch.testing.assert_close(logits[0][camera_block], logits[1][camera_block], rtol=1e-9, atol=1e-9)
    to_identity = (..., layout[:, None], identity)
    assert (logits[0][to_identity] - logits[1][to_identity]).abs().max() > 1e-2


@settings(max_examples=20, deadline=None)
@given(
    data=st.data(),
    name=st.sampled_from(["prope", "hrope", "hrope-lift", "cape", "urope"]),
    extra=st.integers(0, 5),
    form=st.sampled_from(["positions", "list", "mask"]),
    is_causal=st.booleans(),
)
def test_any_layout_of_camera_and_identity_tokens(data, name, extra, form, is_causal):
    """Random positions of the camera tokens among 8 + extra tokens, as a tensor of positions (any
    order), a list, or a boolean mask: fast path == reference."""
    length = 8 + extra
    order = data.draw(st.permutations(range(length)))[:8]
    if form == "mask":
        camera_tokens = torch.zeros(length, dtype=torch.bool)
        camera_tokens[order] = True
    else:
        camera_tokens = torch.tensor(order) if form == "positions" else order
    cameras = random_cameras(B=1, V=2, seed=extra)
    q, k, v = random_qkv(1, 2, length, D, seed=extra)
    fast, ref = fast_and_reference(
        name, q, k, v, cameras, encoding_inputs(name, cameras, GRID, seed=extra), camera_tokens, is_causal=is_causal
    )
    torch.testing.assert_close(fast, ref, rtol=1e-9, atol=1e-9)


def test_gradients_match_the_reference():
    """Gradients w.r.t. q, k, v and learned planes through identity tokens, under a causal mask."""
    cameras = random_cameras(B=1, V=2, seed=5)
    layout = LAYOUTS["text-between-frames"]
    inputs = encoding_inputs("hrope-lift", cameras, GRID, seed=5)
    m = inputs["planes"].m(cameras, GRID).detach()
    grads = []
    for attention in (hrope.multiview_attention, hrope.reference.multiview_attention):
        leaves = [x.clone().requires_grad_() for x in (*random_qkv(1, 2, L, D, seed=5), m)]
        out = attention(
            *leaves[:3],
            encoding="hrope-lift",
            cameras=cameras,
            grid=GRID,
            planes=hrope.Planes.from_m(leaves[3]),
            camera_tokens=layout,
            is_causal=True,
        )
        (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).reshape(out.shape)).sum().backward()
        grads.append([x.grad for x in leaves])
    for fast, ref in zip(*grads):
        assert fast.abs().max() > 0
        torch.testing.assert_close(fast, ref, rtol=1e-9, atol=1e-9)


def test_query_frame_recompute_and_fold_options_give_the_same_mixed_attention():
    cameras = random_cameras(B=1, V=2, seed=6)
    layout = LAYOUTS["unordered"]
    results = []
    for encoding in (
        hrope.get_encoding("rayrope"),
        hrope.get_encoding("rayrope", recompute=True),
        hrope.get_encoding("rayrope", execution="fold"),
    ):
        mixed = hrope.MixedTokens(prepared("rayrope", cameras, 6, encoding)[0], layout, L)
        leaves = [x.clone().requires_grad_() for x in random_qkv(1, 2, L, D, seed=6)]
        out = mixed.attention(*leaves)
        out.square().sum().backward()
        results.append([out] + [x.grad for x in leaves])
    for other in results[1:]:
        for a, b in zip(results[0], other):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_fused_triton_backend_on_mixed_tokens():
    cameras = random_cameras(B=1, V=2, seed=7)
    q, k, v = random_qkv(1, 2, L, D, seed=7)
    encoding = hrope.get_encoding("hrope-lift").use_backend("triton")
    inputs = encoding_inputs("hrope-lift", cameras, GRID, seed=7)
    for layout in ("registers-first", "unordered"):
        fast, ref = fast_and_reference(encoding, q, k, v, cameras, inputs, LAYOUTS[layout])
        torch.testing.assert_close(fast, ref, rtol=1e-9, atol=1e-9)


def test_one_plain_sdpa_call_without_added_masks(monkeypatch):
    """Mixed self-attention and cross-attention: one SDPA call with the caller's options only (flash
    and memory-efficient kernels stay eligible); a cached chunk of several causal tokens gets SDPA's
    lower-right causal bias, a single new token no mask."""
    calls = []
    sdpa = F.scaled_dot_product_attention

    def counting(*args, **kwargs):
        calls.append(kwargs)
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", counting)
    cameras = random_cameras(B=1, V=2, seed=8)
    t, _ = prepared("prope", cameras)
    q, k, v = random_qkv(1, 2, L, D, seed=8)
    hrope.MixedTokens(t, LAYOUTS["unordered"], L).attention(q, k, v, is_causal=True)
    hrope.cross_attention(q, k, v, query=hrope.MixedTokens(t, LAYOUTS["mask"], L), key=None)
    assert calls == [{"is_causal": True}, {}]
    calls.clear()
    cache = hrope.KVCache()
    for chunk in (slice(0, 3), slice(3, 10), slice(10, 11)):
        cache.attention(q[:, :, chunk], k[:, :, chunk], v[:, :, chunk], is_causal=True)
    assert [type(c["attn_mask"]).__name__ for c in calls] == ["NoneType", "CausalBias", "NoneType"]
    assert [c["is_causal"] for c in calls] == [True, False, False]


# --------------------------------------------------------------------------- cross-attention
@pytest.mark.parametrize("name", RELATIVE)
def test_cross_attention_between_two_token_sets(name):
    """Queries: 2 registers + one view (its own cameras); keys: two other views with a text token
    between them; and a side without cameras (None)."""
    q_cams, k_cams = random_cameras(B=2, V=1, seed=9), random_cameras(B=2, V=2, seed=10)
    (tq, q_inputs), (tk, k_inputs) = prepared(name, q_cams, 9), prepared(name, k_cams, 10)
    q_layout, k_layout = slice(2, 6), [0, 1, 2, 3, 5, 6, 7, 8]
    query, key = hrope.MixedTokens(tq, q_layout, 6), hrope.MixedTokens(tk, k_layout, 9)
    q = random_qkv(2, 2, 6, D, seed=9)[0]
    _, k, v = random_qkv(2, 1, 9, D, seed=10)  # grouped-query attention: one key/value head
    D_q, D_k = matrices(name, q_cams, q_inputs, q_layout, 6), matrices(name, k_cams, k_inputs, k_layout, 9)
    eye_k = torch.eye(D, dtype=torch.float64).expand(2, 9, D, D)
    values = hrope.ENCODINGS[name].transform_values
    for q_side, k_side, M_k in ((query, key, D_k), (query, None, eye_k)):
        out = hrope.cross_attention(q, k, v, query=q_side, key=k_side, enable_gqa=True, scale=0.4)
        ref = dense_attention(q, k, v, D_q, M_k, transform_values=values, enable_gqa=True, scale=0.4)
        torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-9)
    out = hrope.cross_attention(q, k, v, query=None, key=key, enable_gqa=True)
    ref = dense_attention(
        q, k, v, torch.eye(D, dtype=torch.float64).expand(2, 6, D, D), D_k, enable_gqa=True, transform_values=values
    )
    torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("name", RELATIVE)
def test_cross_attention_of_selected_views_is_masked_self_attention(name):
    """One transform prepared over all three views, split by select_views into a query side (view 2)
    and a key side (views 0, 1): the rows of view 2 of self-attention masked to views 0 and 1."""
    cameras = random_cameras(B=1, V=3, seed=11)
    t, inputs = prepared(name, cameras, 11)
    q, k, v = random_qkv(1, 2, 12, D, seed=11)
    out = hrope.cross_attention(
        q[:, :, 8:], k[:, :, :8], v[:, :, :8], query=t.select_views([2]), key=t.select_views([0, 1])
    )
    mask = torch.zeros(12, 12, dtype=torch.bool)
    mask[:, :8] = True
    full = hrope.multiview_attention(q, k, v, encoding=name, cameras=cameras, grid=GRID, attn_mask=mask, **inputs)
    torch.testing.assert_close(out, full[:, :, 8:], rtol=1e-10, atol=1e-10)


def test_select_views_is_preparing_those_views():
    cameras = random_cameras(B=1, V=3, seed=12)
    x = random_qkv(1, 2, 8, D, seed=12)[0]
    for name in ("prope", "hrope-lift"):  # per-view and per-token blocks
        t, inputs = prepared(name, cameras, 12)
        planes, tokens = inputs["planes"], [*range(8, 12), *range(4)]  # views 2 and 0
        alone_planes = None if planes is None else hrope.Planes.from_m(planes.m(cameras, GRID)[:, tokens])
        alone = hrope.get_encoding(name).prepare(cameras.select_views([2, 0]), GRID, D, planes=alone_planes)
        selected = t.select_views([2, 0])
        for apply in ("apply_q", "apply_k", "apply_v", "apply_o"):
            torch.testing.assert_close(getattr(selected, apply)(x), getattr(alone, apply)(x), rtol=1e-12, atol=1e-12)


# --------------------------------------------------------------------------- KV cache
def chunks(t):
    """(tokens, transform) of each chunk of a 14-token sequence: 3 text tokens; a register and view 0;
    view 1; two single text tokens. Camera tokens sit at positions 4-7 and 8-11."""
    return [
        (3, None),
        (5, hrope.MixedTokens(t.select_views([0]), slice(1, 5), 5)),
        (4, t.select_views([1])),
        (1, None),
        (1, None),
    ]


@pytest.mark.parametrize("is_causal", [False, True], ids=["block-causal", "causal"])
@pytest.mark.parametrize("name", RELATIVE)
def test_kv_cache_equals_attention_over_the_whole_sequence(name, is_causal):
    """Chunk by chunk through the cache == the reference over all 14 tokens with the causal mask
    (is_causal) or the block-causal one (each chunk sees itself and every earlier chunk)."""
    cameras = random_cameras(B=2, V=2, seed=13)
    t, inputs = prepared(name, cameras, 13)
    q, k, v = random_qkv(2, 2, 14, D, seed=13)
    cache, outs, start, chunk_of = hrope.KVCache(), [], 0, []
    for size, transform in chunks(t):
        rows = slice(start, start + size)
        outs.append(cache.attention(q[:, :, rows], k[:, :, rows], v[:, :, rows], transform, is_causal=is_causal))
        chunk_of += [len(outs)] * size
        start += size
    assert len(cache) == 14 and cache.keys.shape == k.shape
    chunk_of = torch.tensor(chunk_of)
    mask = torch.ones(14, 14, dtype=torch.bool).tril() if is_causal else chunk_of[:, None] >= chunk_of[None, :]
    M = matrices(name, cameras, inputs, list(range(4, 12)), 14)
    ref = dense_attention(q, k, v, M, M, transform_values=hrope.ENCODINGS[name].transform_values, attn_mask=mask)
    torch.testing.assert_close(torch.cat(outs, 2), ref, rtol=1e-9, atol=1e-9)


def test_kv_cache_with_grouped_heads_and_a_callers_mask():
    cameras = random_cameras(B=1, V=2, seed=14)
    t, inputs = prepared("hrope", cameras, 14)
    q = random_qkv(1, 4, 8, D, seed=14)[0]
    _, k, v = random_qkv(1, 2, 8, D, seed=14)
    view = torch.arange(8) // 4
    mask = (torch.rand(8, 8, generator=torch.Generator().manual_seed(14)) > 0.5) | torch.eye(8, dtype=torch.bool)
    mask &= view[:, None] >= view[None, :]  # a cache never sees later chunks
    cache, outs = hrope.KVCache(), []
    for view, rows in enumerate((slice(0, 4), slice(4, 8))):
        outs.append(
            cache.attention(
                q[:, :, rows],
                k[:, :, rows],
                v[:, :, rows],
                t.select_views([view]),
                attn_mask=mask[rows, : rows.stop],
                enable_gqa=True,
            )
        )
    M = matrices("hrope", cameras, inputs)
    ref = dense_attention(q, k, v, M, M, attn_mask=mask, enable_gqa=True)
    torch.testing.assert_close(torch.cat(outs, 2), ref, rtol=1e-9, atol=1e-9)


# --------------------------------------------------------------------------- errors
def transforms():
    cameras = random_cameras(B=1, V=2, seed=15)
    return prepared("prope", cameras)[0], prepared("urope", cameras)[0], prepared("cape", cameras)[0]


def bad_calls():
    """(call, message fragment) for every bad input."""
    prope, urope, cape = transforms()
    mixed = hrope.MixedTokens(prope, slice(3, 11), L)
    x = random_qkv(1, 2, L, D)[0]
    cache = hrope.KVCache()
    cache.append(x[:, :, :3], x[:, :, :3])
    cameras = random_cameras(B=1, V=2, seed=15)
    return {
        "out of range": (lambda: hrope.MixedTokens(prope, [0, 1, 2, 3, 4, 5, 6, 11], L), "position 11 is outside"),
        "negative": (lambda: hrope.MixedTokens(prope, torch.tensor([-1, 1, 2, 3, 4, 5, 6, 7]), L), "position -1"),
        "duplicate": (lambda: hrope.MixedTokens(prope, [0, 1, 2, 3, 4, 5, 6, 6], L), "position 6 is given twice"),
        "too few": (lambda: hrope.MixedTokens(prope, slice(4, 11), L), "gives 7 positions, but the transform has 8"),
        "mask length": (lambda: hrope.MixedTokens(prope, torch.ones(12, dtype=torch.bool), L), "sequence length 11"),
        "float positions": (lambda: hrope.MixedTokens(prope, torch.arange(8.0), L), "camera_tokens must be"),
        "per-sample layout": (lambda: hrope.MixedTokens(prope, torch.arange(8).expand(2, 8), L), "whole batch"),
        "not positions": (lambda: hrope.MixedTokens(prope, 3.5, L), "got float"),
        "short sequence": (lambda: hrope.MixedTokens(prope, slice(None), 7), "at least the 8 camera tokens"),
        "not prepared": (lambda: hrope.MixedTokens(hrope.get_encoding("prope"), slice(3, 11), L), "prepared transform"),
        "wrong length": (lambda: mixed.apply_q(x[:, :, :10]), "(1, heads, 11, 24)"),
        "wrong batch": (lambda: mixed.attention(*(x.expand(2, -1, -1, -1),) * 3), "(1, heads, 11, 24)"),
        "count vs cameras": (
            lambda: hrope.multiview_attention(
                x, x, x, encoding="prope", cameras=cameras, grid=GRID, camera_tokens=slice(0, 9)
            ),
            "gives 9 positions",
        ),
        "query-frame keys": (lambda: hrope.MixedTokens(urope, slice(3, 11), L).apply_k(x), "per query view"),
        "mask and causal": (
            lambda: mixed.attention(x, x, x, is_causal=True, attn_mask=torch.ones(L, L, dtype=bool)),
            "not both",
        ),
        "cross query-frame": (lambda: hrope.cross_attention(x, x, x, query=urope, key=prope), "query-frame"),
        "cross batch": (
            lambda: hrope.cross_attention(x, x, x, query=mixed, key=prepared("prope", random_cameras(B=2, V=2))[0]),
            "(batch, head_dim)",
        ),
        "cross values": (lambda: hrope.cross_attention(x, x, x, query=prope, key=cape), "transform_values"),
        "cross not a transform": (lambda: hrope.cross_attention(x, x, x, query="prope", key=None), "got str"),
        "cache query-frame": (
            lambda: hrope.KVCache().attention(x[:, :, :8], x[:, :, :8], x[:, :, :8], urope),
            "query-frame",
        ),
        "cache heads": (lambda: cache.append(x[:, :1], x[:, :1]), "must match the cache's"),
        "cache dtype": (lambda: cache.append(x.float(), x.float()), "must match the cache's"),
        "cache k v": (lambda: cache.append(x, x[:, :, :3]), "k and v must share one shape"),
        "cache q length": (lambda: cache.attention(x[:, :, :2], x[:, :, :3], x[:, :, :3]), "new chunk's L tokens"),
        "cache mask": (
            lambda: cache.attention(
                x[:, :, :2], x[:, :, :2], x[:, :, :2], attn_mask=torch.ones(2, 4, dtype=torch.bool)
            ),
            "(2, 5)",
        ),
        "select views": (lambda: prope.select_views([0, 2]), "view indices in [0, 2)"),
    }


@pytest.mark.parametrize("case", list(bad_calls()))
def test_bad_inputs_raise_one_line_encoding_errors(case):
    call, fragment = bad_calls()[case]
    with pytest.raises(hrope.EncodingError) as info:
        call()
    assert isinstance(info.value, hrope.InputError)
    message = str(info.value)
    assert fragment in message and "\n" not in message, message


def test_a_refused_chunk_leaves_the_cache_unchanged():
    t = transforms()[0]
    x = random_qkv(1, 2, 8, D)[0]
    cache = hrope.KVCache()
    cache.attention(x[:, :, :4], x[:, :, :4], x[:, :, :4], t.select_views([0]))
    keys = cache.keys
    for bad in (
        lambda: cache.attention(x[:, :, :4], x[:, :, :3], x[:, :, :3], t.select_views([1])),
        lambda: cache.attention(x[:, :, 4:], x[:, :, 4:], x[:, :, 4:], t),
    ):
        with pytest.raises(hrope.EncodingError):
            bad()
        assert cache.keys is keys and len(cache) == 4
