"""hrope.nn: the attention modules equal Linear -> hrope.multiview_attention -> Linear (and the
float64 reference), forward and gradients, for every encoding; the per_view facts hold."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import hrope
import hrope.reference
from hrope.encodings import ENCODINGS, EncodingError, get_encoding
from hrope.nn import MultiviewAttention, MultiviewCrossAttention, factorize
from hrope.testing import encoding_inputs, random_cameras

torch.set_num_threads(1)
B, V, GRID, DIM, HEADS = 2, 3, (2, 3), 64, 2
N = V * GRID[0] * GRID[1]
RELATIVE = [name for name, cls in ENCODINGS.items() if not cls.query_frame]
FOLDING = [name for name, cls in ENCODINGS.items() if cls.per_view is not None]


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


def module(name, dtype, qk_norm=False, cls=MultiviewAttention, **options):
    """A module with random weights and biases (non-trivial RMS gains with ``qk_norm``), folding
    (the fast path under test) unless ``fold`` says otherwise (the modules' default does not fold)."""
    options.setdefault("fold", True)
    torch.manual_seed(0)
    m = cls(DIM, HEADS, name, qkv_bias=True, out_bias=True, qk_norm=qk_norm, **options).to(dtype)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(1.0 + 0.3 * torch.randn_like(p) if p.ndim == 1 and qk_norm else 0.3 * torch.randn_like(p))
    return m


def inputs(name, dtype, seed=0, length=N):
    cameras = random_cameras(B, V, seed=seed, dtype=dtype)
    geometry = encoding_inputs(name, cameras, GRID, seed=seed, dtype=dtype)
    x = torch.randn(B, length, DIM, dtype=dtype, generator=torch.Generator().manual_seed(seed))
    return x, cameras, geometry["planes"], geometry["params"]


def unfused(m, x, cameras, planes, params, attention=hrope.multiview_attention, **kwargs):
    """Linear -> attention -> Linear with the module's own weights."""
    L, d = x.shape[1], m.head_dim
    q, k, v = m.qkv(x).reshape(B, L, 3, HEADS, d).permute(2, 0, 3, 1, 4)
    q, k = m.q_norm(q), m.k_norm(k)
    o = attention(q, k, v, encoding=m.encoding, cameras=cameras, grid=GRID, planes=planes, params=params, **kwargs)
    return m.out(o.transpose(1, 2).reshape(B, L, HEADS * d).to(x.dtype))


@pytest.fixture(params=["rotary", "banded"])
def rotary(request, monkeypatch):
    """Both ways of applying the RoPE left per token by a folding module: rotated in place (float32
    and float64) and the banded passes (bfloat16, float16, tokens without cameras), forced here."""
    if request.param == "banded":
        monkeypatch.setattr(hrope.nn.Factors, "rotary", lambda self, dtype: False)
    return request.param


@pytest.mark.parametrize("qk_norm", [False, True], ids=["plain", "qk_norm"])
@pytest.mark.parametrize("name", list(ENCODINGS))
def test_module_equals_linear_attention_linear(name, qk_norm, rotary):
    # of the largest output entry: measured <= 4.9e-15 (float64) and <= 1.2e-5 (float32, 2.7e-6 with
    # MKL's default kernels); 20x and 8x margins
    for dtype, tolerance in ((torch.float64, 1e-13), (torch.float32, 1e-4)):
        m = module(name, dtype, qk_norm)
        x, cameras, planes, params = inputs(name, dtype)
        out = m(x, cameras, GRID, planes=planes, params=params)
        assert out.shape == x.shape and out.dtype == dtype
        assert relative_error(out, unfused(m, x, cameras, planes, params)) <= tolerance


def geometry_with_gradients(name, cameras, planes, params):
    """Planes as m = n / d and float params that require gradients (fresh leaves)."""
    if planes is not None:
        planes = hrope.Planes.from_m(planes.m(cameras, GRID, torch.float64).detach().requires_grad_())
    params = {key: value.detach().clone().requires_grad_(value.is_floating_point()) for key, value in params.items()}
    leaves = ([planes.m(cameras, GRID, torch.float64)] if planes is not None else []) + list(params.values())
    return planes, params, [t for t in leaves if t.requires_grad]


@pytest.mark.parametrize("qk_norm", [False, True], ids=["plain", "qk_norm"])
@pytest.mark.parametrize("name", RELATIVE)
def test_gradients_equal_the_unfused_path(name, qk_norm, rotary):
    """float64: gradients to x, every weight (the RMS gains with ``qk_norm``), the planes / params
    and learnable encoding options."""
    options = {"learnable_translation_scale": True} if name == "gta" else {}
    encoding = get_encoding(name, **options)
    m = module(encoding, torch.float64, qk_norm)
    x, cameras, planes, params = inputs(name, torch.float64)
    x.requires_grad_()
    planes, params, leaves = geometry_with_gradients(name, cameras, planes, params)
    wrt = [x, *m.parameters(), *leaves]
    assert name != "gta" or any(p is encoding.translation_scale for p in m.parameters())
    grads = []
    for path in (m(x, cameras, GRID, planes=planes, params=params), unfused(m, x, cameras, planes, params)):
        grads.append(torch.autograd.grad(path.square().sum(), wrt, allow_unused=True))
    for got, want in zip(*grads, strict=True):
        assert (got is None) == (want is None)
        if want is not None:
            assert relative_error(got, want) <= 1e-12  # measured <= 3.9e-14; 25x margin


@pytest.mark.parametrize("name", RELATIVE)
def test_module_equals_the_float64_reference(name):
    m64 = module(name, torch.float64)
    x, cameras, planes, params = inputs(name, torch.float64)
    reference = unfused(m64, x, cameras, planes, params, attention=hrope.reference.multiview_attention)
    out64 = m64(x, cameras, GRID, planes=planes, params=params)
    assert relative_error(out64, reference) <= 3e-13  # measured <= 1.1e-14; 25x margin
    m32 = copy.deepcopy(m64).float()  # the same weights and inputs, rounded to float32
    planes32 = None if planes is None else hrope.Planes.from_m(planes.m(cameras, GRID, torch.float64).float())
    params32 = {key: value.float() if value.is_floating_point() else value for key, value in params.items()}
    out32 = m32(x.float(), cameras.to(dtype=torch.float32), GRID, planes=planes32, params=params32)
    assert relative_error(out32.double(), reference) <= 5e-5  # float32 rounding: measured <= 5.4e-6; 10x margin


@pytest.mark.parametrize("name", ["prope", "hrope-lift", "cape", "rope2d", "rayrope"])
@pytest.mark.parametrize("layout", ["registers", "interleaved"])
def test_tokens_without_cameras(name, layout):
    """Identity tokens (registers first, or camera tokens scattered in any order) as MixedTokens."""
    L = N + 4
    if layout == "registers":
        camera_tokens: slice | list[int] = slice(4, None)
    else:
        camera_tokens = torch.randperm(L, generator=torch.Generator().manual_seed(1))[:N].tolist()
    m = module(name, torch.float64)
    x, cameras, planes, params = inputs(name, torch.float64, length=L)
    out = m(x, cameras, GRID, planes=planes, params=params, camera_tokens=camera_tokens)
    want = unfused(m, x, cameras, planes, params, camera_tokens=camera_tokens)
    assert relative_error(out, want) <= 1e-13  # measured <= 7e-15; 15x margin


@pytest.mark.parametrize("qk_norm", [False, True], ids=["plain", "qk_norm"])
@pytest.mark.parametrize("query_name, key_name", [("prope", "hrope-lift"), ("hrope-lift", None), (None, "gta")])
def test_cross_attention_equals_linear_cross_attention_linear(query_name, key_name, qk_norm):
    names = [n for n in (query_name, key_name) if n is not None]
    m = module(names[0], torch.float64, qk_norm, cls=MultiviewCrossAttention, context_dim=48)
    cameras = random_cameras(B, V + 2, dtype=torch.float64)
    sides = {
        "query": (query_name, [0, 1, 2], torch.randn(B, N, DIM, dtype=torch.float64)),
        "key": (key_name, [3, 4], torch.randn(B, 2 * 6, 48, dtype=torch.float64)),
    }
    factors, prepared = {}, {}
    for side, (name, views, _) in sides.items():
        if name is None:
            factors[side] = prepared[side] = None
            continue
        view_cameras = hrope.Cameras(cameras.K[:, views], cameras.world_to_cam[:, views], cameras.image_size)
        geometry = encoding_inputs(name, view_cameras, GRID, dtype=torch.float64)
        factors[side] = factorize(name, view_cameras, GRID, m.head_dim, **geometry)
        prepared[side] = get_encoding(name).prepare(
            view_cameras, GRID, m.head_dim, planes=geometry["planes"], **geometry["params"]
        )
    x, context = sides["query"][2], sides["key"][2]
    out = m(x, context, query=factors["query"], key=factors["key"])
    q = m.q(x).reshape(B, -1, HEADS, m.head_dim).transpose(1, 2)
    k, v = m.kv(context).reshape(B, -1, 2, HEADS, m.head_dim).permute(2, 0, 3, 1, 4)
    o = hrope.cross_attention(m.q_norm(q), m.k_norm(k), v, query=prepared["query"], key=prepared["key"])
    want = m.out(o.transpose(1, 2).reshape(B, -1, DIM))
    assert relative_error(out, want) <= 1e-13  # measured <= 7e-15; 15x margin


@pytest.mark.parametrize("name", RELATIVE)
def test_per_view_facts_match_the_blocks(name):
    """ "blocks": the prepared blocks are per view; "left": D_t = G_c A_t with A_t = I - ĉ_c u_t^T
    (ĉ = E^-1 e4 the camera centre, u = E^T (m, 0)); nothing else has per-view blocks."""
    encoding = get_encoding(name)
    cameras = random_cameras(B, V, dtype=torch.float64)
    geometry = encoding_inputs(name, cameras, GRID, dtype=torch.float64)
    blocks = encoding.prepare(cameras, GRID, 32, planes=geometry["planes"], **geometry["params"]).geometric_blocks()
    per_view_blocks = blocks is not None and blocks[0].shape[2] == 1
    assert (encoding.per_view == "blocks") == per_view_blocks
    if encoding.per_view != "left":
        return
    G, G_inv = encoding.view_factor(cameras)
    D, D_inv = blocks
    A = G_inv[:, :, None] @ D
    E = cameras.world_to_cam
    centre = torch.linalg.inv(E)[..., :, 3]  # (B, V, 4)
    m = geometry["planes"].m(cameras, GRID, torch.float64).reshape(B, V, -1, 3)
    u = (E.mT[:, :, None] @ F.pad(m, (0, 1))[..., None])[..., 0]  # (B, V, P, 4)
    rank_one = torch.eye(4, dtype=torch.float64) - centre[:, :, None, :, None] * u[..., None, :]
    torch.testing.assert_close(A, rank_one, atol=1e-12, rtol=0)
    torch.testing.assert_close(D_inv @ G[:, :, None] @ A, torch.eye(4, dtype=torch.float64).expand_as(A))


@pytest.mark.parametrize("name", ["prope", "rope2d"])
def test_tokens_in_any_memory_layout(name, rotary):
    """A non-contiguous x (tokens strided, as after a transpose) gives what its contiguous copy gives."""
    m = module(name, torch.float64)
    x, cameras, planes, params = inputs(name, torch.float64)
    strided = x.transpose(1, 2).contiguous().transpose(1, 2)
    assert not strided.is_contiguous()
    out = m(strided, cameras, GRID, planes=planes, params=params)
    assert relative_error(out, m(x, cameras, GRID, planes=planes, params=params)) <= 1e-13  # measured <= 3.1e-15


@pytest.mark.parametrize("qk_norm", [False, True], ids=["plain", "qk_norm"])
@pytest.mark.parametrize("name", [*FOLDING, "rope2d"])
def test_folding_is_opt_in(name, qk_norm, monkeypatch):
    """The modules and factorize do not fold unless asked (fold=True), on any device: the default
    module runs Linear -> hrope.multiview_attention -> Linear op for op (the same bits), never the
    fold or the in-place RoPE; the folded module agrees to float rounding."""
    x, cameras, planes, params = inputs(name, torch.float64)
    folded = module(name, torch.float64, qk_norm)(x, cameras, GRID, planes=planes, params=params)

    def refuse(*args, **kwargs):
        raise AssertionError("a fast path ran by default")

    monkeypatch.setattr(hrope.nn.attention, "fold_rows", refuse)
    monkeypatch.setattr(hrope.nn.attention, "rotate_", refuse)
    default = factorize(name, cameras, GRID, 32, planes=planes, params=params)
    assert not default.folds and default.rope_dim == 0
    torch.manual_seed(0)
    assert MultiviewAttention(DIM, HEADS, name).fold is False
    assert MultiviewCrossAttention(DIM, HEADS, name).fold is False
    m = module(name, torch.float64, qk_norm, fold=False)
    for dtype in (torch.float64, torch.float32):
        m, x, cameras = m.to(dtype), x.to(dtype), cameras.to(dtype=dtype)
        planes = None if planes is None else hrope.Planes.from_m(planes.m(cameras, GRID, dtype))
        params = {key: value.to(dtype) if value.is_floating_point() else value for key, value in params.items()}
        out = m(x, cameras, GRID, planes=planes, params=params)
        assert torch.equal(out, unfused(m, x, cameras, planes, params))
        if dtype == torch.float64:
            assert relative_error(out, folded) <= 1e-13  # measured <= 4.9e-15; 20x margin


@pytest.mark.parametrize("name", RELATIVE)
def test_rotary_where_only_rope_is_left(name):
    """The in-place RoPE is used exactly where the rest per token is the RoPE alone (per-view
    blocks folded, or RoPE only: not cape, whose rest is nothing), every token has a camera and
    the dtype has a complex twin."""
    x, cameras, planes, params = inputs(name, torch.float64)
    factors = factorize(name, cameras, GRID, 32, planes=planes, params=params, fold=True)
    rope_only = name in ("rope2d", "prope", "gta")
    assert factors.rotary(torch.float32) == factors.rotary(torch.float64) == rope_only
    assert not factors.rotary(torch.bfloat16) and not factors.rotary(torch.float16)
    mixed = factorize(
        name, cameras, GRID, 32, planes=planes, params=params, camera_tokens=slice(1, None), length=N + 1, fold=True
    )
    assert not mixed.rotary(torch.float64)


def test_folding_is_declared_for_the_per_view_encodings():
    assert FOLDING == ["prope", "gta", "cape", "hrope-lift"]
    assert not any(ENCODINGS[name].query_frame for name in FOLDING)


def test_clear_errors():
    x, cameras, _, _ = inputs("prope", torch.float32)
    with pytest.raises(EncodingError, match="factors"):
        MultiviewAttention(DIM, HEADS, None)(x, cameras, GRID)
    with pytest.raises(EncodingError, match="cameras and grid"):
        MultiviewAttention(DIM, HEADS, "prope")(x)
    with pytest.raises(EncodingError, match="camera_tokens"):
        MultiviewAttention(DIM, HEADS, "prope")(torch.cat([x, x[:, :1]], 1), cameras, GRID)
    with pytest.raises(EncodingError, match="split into"):
        MultiviewAttention(63, HEADS)
    cross = MultiviewCrossAttention(DIM, HEADS, "rayrope")
    factors = cross.factorize(cameras, GRID, params=inputs("rayrope", torch.float32)[3])
    with pytest.raises(EncodingError, match="query-frame"):
        cross(x, x, query=factors, key=None)
