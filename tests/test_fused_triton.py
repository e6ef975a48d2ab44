"""The fused Triton transform against dense float64 matrices and banded.banded_product.

Without CUDA the kernel runs in Triton's CPU interpreter: tests/conftest.py sets
TRITON_INTERPRET=1 for the whole session, since it must be set before triton's first import
(triton's own jitted helpers, e.g. tl.sum, are made then), whichever test module imports it first.
"""

from __future__ import annotations

import os
import subprocess
import sys
import types

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import hrope
from hrope.encodings import fused_triton
from hrope.encodings.banded import banded_product, inverse_rope, rope_diagonals
from hrope.encodings.layout import HeadLayout, patch_index_rope_angles
from hrope.encodings.fused_triton import fused_banded_product
from test_banded import dense_transform

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
GRID = (3, 3)
B, HEADS, V = 2, 2, 2
# (head_dim, block, per_token, rope): b = 3 (hrope) and 4 (prope, gta, cape, hrope-lift), identity
# channels (32 with b = 3), no RoPE (cape), RoPE only (rope2d), F = 3 (not a power of two).
LAYOUTS = [
    (24, 3, True, True),
    (32, 3, True, True),
    (24, 4, False, True),
    (32, 4, False, True),
    (24, 3, False, False),
    (32, 4, True, False),
    (24, 0, False, True),
    (32, 0, False, True),
]


def case(head_dim, block, per_token, rope, grid=GRID, heads=HEADS, seed=0):
    """Layout, blocks ``(B, V, 1 or P, b, b)`` near the identity (so D^-1 is well conditioned) or
    None, RoPE angles ``(P, 2, F)`` and x ``(B, heads, V, P, head_dim)``, all float64."""
    g = torch.Generator().manual_seed(seed)
    layout = HeadLayout(head_dim, block=block, rope=rope)
    P = grid[0] * grid[1]
    blocks = None
    if block:
        noise = torch.randn(B, V, P if per_token else 1, block, block, generator=g, dtype=torch.float64)
        blocks = torch.eye(block, dtype=torch.float64) + 0.3 * noise
    angles = patch_index_rope_angles(grid, layout.num_freqs)
    x = torch.randn(B, heads, V, P, head_dim, generator=g, dtype=torch.float64)
    return layout, blocks, angles, x


def dense(layout, blocks, angles, variant):
    """The dense ``(B, V, P, d, d)`` matrix of D, D^T or D^-1 (test_banded's entry-by-entry D)."""
    empty = torch.zeros(B, V, 1, 0, 0, dtype=torch.float64)
    D = dense_transform(layout, empty if blocks is None else blocks, angles, 1.0)
    return {"D": D, "D^T": D.mT, "D^-1": torch.linalg.inv(D)}[variant]


def operands(variant, blocks, tables):
    """The (blocks, rope) arguments of D, D^T and D^-1 as TokenTransform passes them."""
    if variant == "D":
        return blocks, tables
    inv = inverse_rope(tables) if tables is not None else None
    if blocks is None:
        return None, inv
    return (blocks.mT if variant == "D^T" else torch.linalg.inv(blocks)), inv


def apply(D, x):
    return torch.einsum("bvpij,bhvpj->bhvpi", D, x)


def terms(D, x, ulps, dtype):
    """``ulps`` eps of ``dtype`` times |D| |x|: the size of the terms each entry of D x sums, the
    scale of its rounding error (also where D x cancels)."""
    return ulps * torch.finfo(dtype).eps * apply(D.abs(), x.abs())


def assert_within(y, expected, bound):
    err = (y.double() - expected.double()).abs()
    assert (err <= bound).all(), f"worst error {(err / bound).max().item():.2f} of the bound"


def cast(tensors, dtype=None):
    """A tensor, a tuple of tensors or None on DEVICE, in ``dtype`` (default: their own)."""
    if tensors is None or isinstance(tensors, torch.Tensor):
        return None if tensors is None else tensors.to(DEVICE, dtype or tensors.dtype)
    return tuple(cast(t, dtype) for t in tensors)


def fused(x, blocks, num_blocks, rope, **kwargs):
    """fused_banded_product on DEVICE, result back on the CPU."""
    return fused_banded_product(cast(x), cast(blocks), num_blocks, cast(rope), **kwargs).cpu()


@pytest.mark.parametrize("variant", ["D", "D^T", "D^-1"])
@pytest.mark.parametrize("head_dim, block, per_token, rope", LAYOUTS)
def test_forward_matches_dense_and_banded(head_dim, block, per_token, rope, variant):
    """D x, D^T x, D^-1 x in float64 and float32 against the dense float64 product, and float32
    against banded_product (the same arithmetic in another order)."""
    layout, blocks, angles, x = case(head_dim, block, per_token, rope)
    blocks_v, rope_v = operands(variant, blocks, rope_diagonals(angles) if rope else None)
    D = dense(layout, blocks, angles, variant)
    expected = apply(D, x)
    # measured worst 3.7 eps of the terms (float64, D^-1: linalg.inv of D vs of the blocks), 1.6
    # (float32 vs dense), 1.7 (float32 vs banded); bounds 512 eps (1.1e-13, float64) and 16 eps (float32)
    assert_within(fused(x, blocks_v, layout.num_blocks, rope_v), expected, terms(D, x, 512, torch.float64))
    blocks32, rope32 = cast(blocks_v, torch.float32), cast(rope_v, torch.float32)
    y32 = fused(x.float(), blocks32, layout.num_blocks, rope32)
    assert y32.dtype == torch.float32
    assert_within(y32, expected, terms(D, x, 16, torch.float32))
    banded = banded_product(cast(x, torch.float32), blocks32, layout.num_blocks, rope32).cpu()
    assert_within(y32, banded, terms(D, x, 16, torch.float32))


@pytest.mark.parametrize("dtype, ulps", [(torch.float16, 0.5), (torch.bfloat16, 1.0)])
@pytest.mark.parametrize("head_dim, block, per_token, rope", [(32, 3, True, True), (24, 4, False, True)])
def test_half_precision_is_one_rounding_of_the_exact_product(head_dim, block, per_token, rope, dtype, ulps):
    """x and blocks in a half dtype, computed in float32 and rounded once at the store: within
    ``ulps`` eps |y| of the exact product of the rounded inputs (plus the float32 arithmetic, 4 eps32
    of the terms). Round to nearest gives eps / 2; the interpreter's float32 -> bfloat16 store
    truncates (measured: always toward zero, 42 % of the entries one ulp from torch's rounding),
    hence a full eps for bfloat16. Measured worst: 0.49 (float16), 0.96 (bfloat16) of the bound."""
    layout, blocks, angles, x = case(head_dim, block, per_token, rope)
    x_h, blocks_h = x.to(dtype), blocks.to(dtype)
    y = fused(x_h, blocks_h, layout.num_blocks, cast(rope_diagonals(angles), torch.float32))
    assert y.dtype == dtype
    D = dense(layout, blocks_h.double(), angles, "D")
    exact = apply(D, x_h.double())
    assert_within(y, exact, ulps * torch.finfo(dtype).eps * exact.abs() + terms(D, x_h.double(), 4, torch.float32))
    assert not torch.equal(y.double(), exact)  # the rounding is there to see (not a float64 result)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("variant", ["D", "D^T", "D^-1"])
@pytest.mark.parametrize("head_dim, block, per_token", [(32, 3, True), (24, 4, False)])
def test_gradients_match_autograd_of_the_dense_product(head_dim, block, per_token, variant, dtype):
    """grad_x (the kernel on the transposed operator) and grad_blocks (the einsum) of <w, D x>,
    also through blocks.mT and linalg.inv, equal autograd of the dense float64 product."""
    layout, blocks, angles, x = case(head_dim, block, per_token, True)
    tables = rope_diagonals(angles)
    w = torch.randn(x.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)

    def grads(product, x, blocks):
        x, blocks = x.clone().requires_grad_(), blocks.clone().requires_grad_()
        (product(x, blocks) * w.to(x.dtype)).sum().backward()
        return x.grad, blocks.grad

    def fused_product(x, blocks):
        blocks_v, rope_v = operands(variant, blocks.to(DEVICE), cast(tables, dtype))
        return fused_banded_product(x.to(DEVICE), blocks_v, layout.num_blocks, rope_v).cpu()

    gx, gb = grads(fused_product, x.to(dtype), blocks.to(dtype))
    ex, eb = grads(lambda x, blocks: apply(dense(layout, blocks, angles, variant), x), x, blocks)
    assert gx.dtype == gb.dtype == dtype
    # measured worst, in eps x the largest |gradient| (up to 31 for x, 277 for the blocks of D^-1):
    # 1.1 / 1.9 (float64, x / blocks), 1.2 / 5.1 (float32; linalg.inv in float32 for D^-1)
    for got, expected in ((gx, ex), (gb, eb)):
        tol = (1e-13 if dtype == torch.float64 else 1e-5) * expected.abs().max().item()
        torch.testing.assert_close(got.double(), expected, rtol=0, atol=tol)


def test_second_derivatives_match_the_dense_product():
    """The backward is itself differentiable: d/d blocks of <v, d<w, D x>/dx> as for dense D."""
    layout, blocks, angles, x = case(24, 4, True, True)
    tables = rope_diagonals(angles)
    g = torch.Generator().manual_seed(2)
    w, v = torch.randn(2, *x.shape, generator=g, dtype=torch.float64)

    def second(product):
        xr, br = x.clone().requires_grad_(), blocks.clone().requires_grad_()
        (gx,) = torch.autograd.grad((product(xr, br) * w).sum(), xr, create_graph=True)
        return torch.autograd.grad((gx * v).sum(), br)[0]

    got = second(
        lambda x, b: fused_banded_product(
            x.to(DEVICE), b.to(DEVICE), layout.num_blocks, cast(tables, torch.float64)
        ).cpu()
    )
    expected = second(lambda x, b: apply(dense(layout, b, angles, "D"), x))
    assert got.abs().max() > 1
    # measured worst 0.42 eps (9.3e-17) of the largest entry (9.5)
    tol = 1e-13 * expected.abs().max().item()
    torch.testing.assert_close(got, expected, rtol=0, atol=tol)


def test_strided_inputs_give_the_same_bits():
    """x and the incoming gradient as transposed views of (B, N, heads, d) projections, or as the
    first P patches of a larger tensor (views and patches not mergeable into one token stride),
    are read through their strides: output and both gradients equal those of contiguous copies."""
    layout, blocks, angles, _ = case(32, 4, True, True)
    tables = cast(rope_diagonals(angles), torch.float32)
    g = torch.Generator().manual_seed(3)
    projected = torch.randn(2, B, V * 9, HEADS, 32, generator=g).to(DEVICE)  # (x, grad), each (B, N, heads, d)
    transposed = [t.transpose(1, 2).unflatten(2, (V, 9)) for t in projected]
    padded = torch.randn(2, B, HEADS, V, 10, 32, generator=g).to(DEVICE)[..., :9, :]
    for views in (transposed, list(padded)):
        assert not views[0].is_contiguous()
        results = []
        for x, grad in (views, [t.contiguous() for t in views]):
            x, blocks_f = x.detach().requires_grad_(), cast(blocks, torch.float32).requires_grad_()
            y = fused_banded_product(x, blocks_f, layout.num_blocks, tables)
            y.backward(grad)
            results.append((y, x.grad, blocks_f.grad))
        for a, b in zip(*results):
            assert torch.equal(a, b)


def test_token_tiles_and_head_groups():
    """More tokens than one tile (40 = 32 + a ragged 8) and heads split into groups of 2 over 3
    heads (a ragged last group) give the dense result and the same bits as all heads per program."""
    layout, blocks, angles, x = case(24, 3, True, True, grid=(4, 5), heads=3)
    tables = rope_diagonals(angles)
    assert V * 20 > fused_triton.BLOCK_T
    grouped = fused(x, blocks, layout.num_blocks, tables, heads_per_program=2)
    single = fused(x, blocks, layout.num_blocks, tables, heads_per_program=1)
    whole = fused(x, blocks, layout.num_blocks, tables, heads_per_program=3)
    D = dense_transform(layout, blocks, angles, 1.0)
    assert_within(whole, apply(D, x), terms(D, x, 512, torch.float64))  # measured worst 1.04
    assert torch.equal(grouped, whole) and torch.equal(single, whole)


@settings(max_examples=15, deadline=None)
@given(
    head_dim=st.integers(8, 40),
    block=st.sampled_from([0, 2, 3, 4]),
    per_token=st.booleans(),
    rope=st.booleans(),
    variant=st.sampled_from(["D", "D^T", "D^-1"]),
    seed=st.integers(0, 100),
)
def test_any_head_dim_matches_banded(head_dim, block, per_token, rope, variant, seed):
    """Any head_dim (masks for ranges that are not powers of two) and layout: fused == banded."""
    assume(block or rope)  # else D is the identity (rejected, see test_bad_inputs)
    layout, blocks, angles, x = case(head_dim, block, per_token, rope, heads=1, seed=seed)
    blocks_v, rope_v = operands(variant, blocks, rope_diagonals(angles) if rope else None)
    expected = banded_product(x, blocks_v, layout.num_blocks, rope_v)
    D = dense(layout, blocks, angles, variant)
    # measured worst 1.8 eps over all head_dim 8..40 (step 3) and layouts
    assert_within(fused(x, blocks_v, layout.num_blocks, rope_v), expected, terms(D, x, 512, torch.float64))


def test_bad_inputs_raise_one_line_encoding_errors():
    layout, blocks, angles, x = case(32, 4, True, True)
    x, blocks, tables = cast(x), cast(blocks), cast(rope_diagonals(angles))
    bad = [
        ((x[0], blocks, 4, tables), "x must be"),
        ((x.long(), blocks, 4, tables), "x must be"),
        ((x, None, 0, None), "identity"),
        ((x, blocks[:, :1], 4, tables), "blocks must be"),
        ((x, blocks[..., :3], 4, tables), "blocks must be"),
        ((x, blocks, 5, tables), "num_blocks"),
        ((x, blocks, 4, tuple(t[:4] for t in tables)), "rope must be"),
        ((x, blocks.long(), 4, tables), "floating-point"),
    ]
    for args, match in bad:
        with pytest.raises(hrope.InputError, match=match) as info:
            fused_banded_product(*args)
        assert isinstance(info.value, hrope.EncodingError) and "\n" not in str(info.value)
    with pytest.raises(hrope.EncodingError, match="heads_per_program"):
        fused_banded_product(x, blocks, 4, tables, heads_per_program=0)


def test_availability_follows_the_interpreter_setting(monkeypatch):
    assert fused_triton.is_available()
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert fused_triton.is_available() == torch.cuda.is_available()
    if not torch.cuda.is_available():
        layout, blocks, angles, x = case(24, 4, False, True)
        with pytest.raises(hrope.EncodingError, match="needs triton and a CUDA device"):
            fused_banded_product(x, blocks, layout.num_blocks, rope_diagonals(angles))


def test_kernel_compiles_for_a_gpu(tmp_path):
    """The interpreter accepts code a GPU compile would reject: compile the kernel to an sm_90
    cubin (no GPU needed) for bfloat16 x and float32 tables with every branch live (tiles of b = 3,
    identity channels, RoPE with F = 5). In a fresh process: this one imported triton for the
    interpreter."""
    script = """
import inspect, triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from hrope.encodings import fused_triton
from hrope.encodings.fused_triton import BLOCK_T, _transform_kernel
assert fused_triton._import_triton() and not fused_triton._interpreting()
pointers = {"x_ptr": "*bf16", "y_ptr": "*bf16", "m_ptr": "*fp32", "cos_ptr": "*fp32", "sin_ptr": "*fp32"}
constants = dict(HEAD_DIM=40, BLOCK=3, TILED=18, GEO_END=20, F=5, COMPUTE=tl.float32, BLOCK_T=BLOCK_T,
                 BLOCK_J=4, BLOCK_G=32, BLOCK_F=8)
names = inspect.signature(_transform_kernel).parameters
signature = {n: pointers.get(n, "constexpr" if n in constants else "i32") for n in names}
compiled = triton.compile(ASTSource(triton.jit(_transform_kernel), signature, constants),
                          target=GPUTarget("cuda", 90, 32))
print(len(compiled.asm["cubin"]))
"""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(tmp_path), TRITON_DEFAULT_FP_FUSION="1")  # compile for real, no cache left
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout.split()[-1]) > 0


RELATIVE = [name for name, cls in hrope.ENCODINGS.items() if not cls.query_frame]


@pytest.mark.parametrize("name", RELATIVE)
def test_every_relative_encoding_attends_the_same_through_the_fused_backend(name):
    """``use_backend("triton")`` changes how D is applied, not what attention computes: outputs and
    the gradients of q, k, v and of the plane / per-token inputs equal the banded path's (float64)."""
    from hrope.testing import encoding_inputs, random_cameras, random_qkv

    grid = (2, 3)
    cameras = random_cameras(B=2, V=2, image_size=(16, 24), seed=1)
    results = {}
    for backend in ("torch", "triton"):
        inputs = encoding_inputs(name, cameras, grid, seed=1)
        leaves = list(inputs["params"].values())
        if inputs["planes"] is not None:
            leaves += [inputs["planes"].normal, inputs["planes"].depth]
        for leaf in leaves:
            leaf.requires_grad_()
        q, k, v = (x.requires_grad_() for x in random_qkv(2, 2, 12, 32, seed=2))
        encoding = hrope.get_encoding(name).use_backend(backend)
        out = hrope.multiview_attention(q, k, v, encoding=encoding, cameras=cameras, grid=grid, **inputs)
        grads = torch.autograd.grad(
            (out * torch.linspace(-1, 1, out.numel()).view_as(out).double()).sum(), [q, k, v, *leaves]
        )
        results[backend] = (out, grads)
    (out_t, grads_t), (out_f, grads_f) = results["torch"], results["triton"]
    torch.testing.assert_close(out_f, out_t, rtol=0, atol=3e-13)  # measured at most 2.8e-14 (hrope-pf)
    for got, expected in zip(grads_f, grads_t):  # measured at most 1.5e-14 of the largest entry
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-13 * float(expected.abs().max()))


def test_the_model_option_selects_the_backend():
    """``model.transform_backend`` reaches the encoding; "triton" trains the same model as "torch"."""
    from hrope.nvs.config import resolve
    from hrope.nvs.data.batch import collate_scenes
    from hrope.nvs.data.synthetic import make_scene
    from hrope.nvs.model import build_model

    batch = collate_scenes([make_scene(0, 0, "room", num_views=3, image_size=(32, 32))], 2)
    images = {}
    for backend in ("torch", "triton"):
        torch.manual_seed(0)
        model = build_model(
            resolve(
                {
                    "model": {
                        "preset": "tiny",
                        "image_size": 32,
                        "layers": 1,
                        "encoding": "hrope-lift",
                        "transform_backend": backend,
                    }
                }
            )
        )
        assert model.encoding.backend == backend
        images[backend] = model(batch).images
    torch.testing.assert_close(images["triton"], images["torch"], rtol=1e-5, atol=1e-6)
    with pytest.raises(hrope.EncodingError, match="backend must be one of torch, auto"):
        hrope.get_encoding("urope").use_backend("triton")


def test_nothing_selects_the_fused_kernel_by_default(monkeypatch):
    """The kernel is opt-in (``use_backend("triton")``, or ``"auto"`` on CUDA): every encoding, the
    transforms they prepare, hrope.nn's factors (folded or not) and the LVSM model's config default
    to the banded passes, even for a CUDA tensor with triton at hand."""
    from _lvsm_helpers import SMALL_MODEL

    import hrope.nn
    from hrope.nvs.model import LVSM, ModelConfig
    from hrope.testing import random_cameras

    monkeypatch.setattr(fused_triton, "is_available", lambda: True)
    on_cuda = types.SimpleNamespace(is_cuda=True)  # all the backend choice reads of a tensor
    assert all(hrope.get_encoding(name).backend == "torch" for name in hrope.ENCODINGS)
    cameras = random_cameras(B=1, V=2, seed=0)
    for fold in (False, True):
        factors = hrope.nn.factorize("prope", cameras, GRID, 32, fold=fold)
        for transform in (factors.full, factors.residual) if fold else (factors.full,):
            assert transform.backend == "torch" and not transform._fused(on_cuda)
    assert ModelConfig(**SMALL_MODEL).transform_backend == "torch"
    assert LVSM(ModelConfig(**SMALL_MODEL, encoding="prope")).encoding.backend == "torch"
    assert hrope.get_encoding("prope").use_backend("auto").prepare(cameras, GRID, 32)._fused(on_cuda)  # can fail
