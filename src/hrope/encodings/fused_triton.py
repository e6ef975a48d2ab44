"""The block-diagonal channel transform D_t as one fused Triton kernel (the GPU twin of
:mod:`hrope.encodings.banded`).

:func:`fused_banded_product` takes exactly :func:`~hrope.encodings.banded.banded_product`'s
arguments, x ``(B, heads, V, P, head_dim)``, ``blocks`` ``(B, V, 1 or P, b, b)`` or None,
``num_blocks`` and the RoPE tables of :func:`~hrope.encodings.banded.rope_diagonals` (or None), and
computes the same ``y = D x``. D^T and D^-1 are therefore the same calls as there: blocks.mT with
:func:`~hrope.encodings.banded.inverse_rope` tables, or the inverse blocks with them. The kernel reads
the blocks through their strides (a transposed view costs nothing, per-view blocks are read with
stride 0 over P) and takes the RoPE sine from the tables' δ = -F diagonal, which holds +sin of
R(θ) or of R(-θ) after ``inverse_rope``: no transpose flag or sign is needed and no copy is made.

Tiling. One program takes a tile of ``BLOCK_T`` tokens of one batch element and loops over a
group of heads. The per-token tables (the b x b block, cos and sin) do not depend on the head, so
they are loaded once per token tile into registers and reused for every head of the group; for
b = 4 and head_dim = 64 they are 48 numbers per token against 128 values of x read and written
per head, so reloading them per head would add ~37 % traffic (from L2 at best). Heads are split
into groups only when B x token tiles alone would leave a GPU's SMs idle
(:func:`_heads_per_program`). Per head the program reads its x tile once and writes y once: the
geometric part ``[0, head_dim - 4F)`` (tiles and identity channels) as
y[c] = Σ_j M[c mod b, j] x[c - c mod b + j] over a ``(tokens, b, channels)`` tensor (b padded to
a power of two and masked, so b = 3 works), and the RoPE part per axis pair a, b = x[c], x[c + F]
as (cos a - sin b, sin a + cos b). Channel ranges are padded to powers of two and masked, as is
the last token tile. x is read through its strides (the (B, N, heads, d).transpose(1, 2) views of
a projection need no copy); y is a new contiguous tensor.

Backend. triton is imported on first use, so importing hrope costs nothing without it. On CPU
tensors the kernel runs in Triton's interpreter, which needs TRITON_INTERPRET=1 set before
triton's first import in the process (its own jitted helpers are made then) and at launch;
:func:`is_available` checks both.

Dtypes. x may be float32, float16, bfloat16 (or float64); blocks and tables any floating dtype
(float32 tables for a half-precision x are more accurate than banded.py's cast to x's dtype).
Every loaded value is converted to the compute dtype (float32; float64 for float64 x) right after
the load, and only the store casts to x's dtype.

What is fused: the forward product and the input gradient (the same kernel on D^T). Not fused:
the block gradient Σ_{heads, tiles} grad_y x^T per block is banded.py's torch einsum
(:func:`~hrope.encodings.banded.block_gradient`); RoPE
tables are constants.

GPU expectation (an estimate, unmeasured on a GPU; the tests run the kernel in Triton's CPU
interpreter and compile it for sm_90). The transform is memory bound. Per token and head,
in units of head_dim values moved: the fused kernel reads x and writes y, 2 (the tables add
48 / (64 x heads per program) for b = 4, head_dim = 64). banded.py's separate passes (each a
kernel launch, each reading and writing its slice of the output) move ~4 for per-view blocks with
RoPE (prope, gta: product, multiply, two RoPE multiply-adds; cape's is one product, 2, nothing to
gain) and ~10-13 for per-token ones (2b + 1 passes: hrope, hrope-lift, the ablations), not
counting their tables, so expect ~2x (per view) and ~5x (per token) faster transforms, at about
the speed of a copy of x. torch.compile of banded_product can merge the elementwise passes into
one kernel but keeps the per-view matrix product separate (~2 passes), so it should land close
to the fused kernel for per-token blocks and ~1.5x behind it per view.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import Tensor

from ..errors import EncodingError
from .banded import RopeTables, TransformProduct

if TYPE_CHECKING:
    import triton
    import triton.language as tl
else:
    triton = tl = None  # imported on first use (_import_triton): importing hrope does not import triton

__all__ = ["is_available", "fused_banded_product"]

BLOCK_T = 32  # tokens per program (untuned)
_PROGRAMS_PER_SM = 4  # split heads into groups until B x tiles x groups reaches this many per SM
_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def is_available() -> bool:
    """Whether the fused kernel can run here: triton installed and a CUDA device or the
    interpreter on (``TRITON_INTERPRET=1`` from before triton's first import; CPU tensors)."""
    return _import_triton() and (torch.cuda.is_available() or _interpreting())


@functools.cache
def _import_triton() -> bool:
    """Import triton into this module's globals (once) and say whether it is installed."""
    global triton, tl
    try:
        import triton
        import triton.language as tl
    except ImportError:  # the fused backend is optional
        return False
    return True


def _interpreting() -> bool:
    """Whether kernels run in triton's CPU interpreter: TRITON_INTERPRET=1 now and already when
    triton was first imported (else its own jitted helpers, such as tl.sum, are compiled-only)."""
    return _import_triton() and triton.knobs.runtime.interpret and not isinstance(tl.sum, triton.runtime.JITFunction)


# A plain function, jitted on first launch by _kernel() (triton is imported on first use).
def _transform_kernel(  # type: ignore[no-untyped-def]  # triton reads the annotations
    x_ptr,
    y_ptr,
    m_ptr,
    cos_ptr,
    sin_ptr,
    num_tokens,
    patches,
    heads,
    heads_per_program,
    sx_b,
    sx_h,
    sx_v,
    sx_p,
    sx_c,
    sm_b,
    sm_v,
    sm_p,
    sm_i,
    sm_j,
    scos_p,
    scos_c,
    ssin_p,
    ssin_c,
    HEAD_DIM: tl.constexpr,
    BLOCK: tl.constexpr,
    TILED: tl.constexpr,
    GEO_END: tl.constexpr,
    F: tl.constexpr,
    COMPUTE: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_J: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_F: tl.constexpr,
):
    """y = D x for BLOCK_T tokens of one batch element and heads [first, first + heads_per_program)."""
    batch = tl.program_id(2).to(tl.int64)
    first_head = tl.program_id(1) * heads_per_program
    last_head = tl.minimum(first_head + heads_per_program, heads)
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    t_ok = t < num_tokens
    view, patch = t // patches, t % patches
    x_tok = batch * sx_b + view * sx_v + patch * sx_p  # (T,)

    # Geometric part: output channel c reads terms j < BLOCK_J at src[j, c] with coefficient coef.
    c = tl.arange(0, BLOCK_G)
    j = tl.arange(0, BLOCK_J)
    in_tile = c < TILED
    row = c % BLOCK
    src = tl.where(in_tile[None, :], (c - row)[None, :] + j[:, None], c[None, :])  # (J, G)
    live = tl.where(in_tile[None, :], j[:, None] < BLOCK, (j[:, None] == 0) & (c[None, :] < GEO_END))
    geo_mask = t_ok[:, None, None] & live[None, :, :]  # (T, J, G)
    if TILED > 0:
        m_tok = batch * sm_b + view * sm_v + patch * sm_p
        m_off = m_tok[:, None, None] + row[None, None, :] * sm_i + j[None, :, None] * sm_j
        coef = tl.load(m_ptr + m_off, mask=geo_mask & in_tile[None, None, :], other=0.0).to(COMPUTE)
        coef = tl.where(in_tile[None, None, :], coef, 1.0)  # identity channels: only j = 0 is live
    else:
        coef = 1.0

    # RoPE part, axes stacked: column axis * 2F + f of the tables pairs channels a = GEO_END + col, a + F.
    axis = tl.arange(0, 2)
    f = tl.arange(0, BLOCK_F)
    col = axis[:, None] * (2 * F) + f[None, :]  # (2, BLOCK_F)
    rope_mask = t_ok[:, None, None] & (f < F)[None, None, :]  # (T, 2, BLOCK_F)
    if F > 0:
        cos = tl.load(cos_ptr + patch[:, None, None] * scos_p + col[None] * scos_c, mask=rope_mask).to(COMPUTE)
        sin = tl.load(sin_ptr + patch[:, None, None] * ssin_p + col[None] * ssin_c, mask=rope_mask).to(COMPUTE)

    for h in range(first_head, last_head):
        x_row = x_ptr + (x_tok + h * sx_h)
        y_row = y_ptr + ((batch * heads + h) * num_tokens + t) * HEAD_DIM
        if GEO_END > 0:
            xg = tl.load(x_row[:, None, None] + src[None] * sx_c, mask=geo_mask, other=0.0).to(COMPUTE)
            y = tl.sum(coef * xg, axis=1)
            tl.store(
                y_row[:, None] + c[None, :], y.to(y_ptr.dtype.element_ty), mask=t_ok[:, None] & (c < GEO_END)[None, :]
            )
        if F > 0:
            a_chan = GEO_END + col[None]
            a = tl.load(x_row[:, None, None] + a_chan * sx_c, mask=rope_mask).to(COMPUTE)
            b = tl.load(x_row[:, None, None] + (a_chan + F) * sx_c, mask=rope_mask).to(COMPUTE)
            out = y_row[:, None, None] + a_chan
            tl.store(out, (cos * a - sin * b).to(y_ptr.dtype.element_ty), mask=rope_mask)
            tl.store(out + F, (sin * a + cos * b).to(y_ptr.dtype.element_ty), mask=rope_mask)


@functools.cache
def _kernel(interpret: bool) -> Any:
    """The kernel jitted on first launch, once per mode (triton.jit reads TRITON_INTERPRET then)."""
    return triton.jit(_transform_kernel)


def _heads_per_program(x: Tensor, tiles: int) -> int:
    """All heads per program (tables loaded once per token tile), split into groups only while
    B x tiles programs would leave SMs idle; all heads in the interpreter (fewest programs)."""
    batch, heads = x.shape[:2]
    if not x.is_cuda or _interpreting():
        return heads
    target = _PROGRAMS_PER_SM * torch.cuda.get_device_properties(x.device).multi_processor_count
    groups = min(heads, -(-target // (batch * tiles)))
    return -(-heads // groups)


def _launch(
    x: Tensor, blocks: Tensor | None, num_blocks: int, rope: RopeTables | None, heads_per_program: int | None
) -> Tensor:
    """y = D x by one kernel launch (no autograd)."""
    B, heads, V, P, head_dim = x.shape
    block = blocks.shape[-1] if blocks is not None and num_blocks else 1
    tiled = num_blocks * block if blocks is not None else 0
    F = rope[0].shape[-1] // 4 if rope is not None else 0
    geo_end = head_dim - 4 * F
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    tiles = triton.cdiv(V * P, BLOCK_T)
    group = heads_per_program or _heads_per_program(x, tiles)
    m = blocks.expand(B, V, P, block, block) if blocks is not None and tiled else x  # x: an unused stand-in pointer
    m_strides = m.stride() if tiled else (0,) * 5
    cos, sin = (rope[0], rope[2]) if rope is not None and F else (x, x)
    cos_strides, sin_strides = (cos.stride(), sin.stride()) if F else ((0, 0), (0, 0))
    _kernel(_interpreting())[(tiles, triton.cdiv(heads, group), B)](
        x,
        y,
        m,
        cos,
        sin,
        V * P,
        P,
        heads,
        group,
        *x.stride(),
        *m_strides,
        *cos_strides,
        *sin_strides,
        HEAD_DIM=head_dim,
        BLOCK=block,
        TILED=tiled,
        GEO_END=geo_end,
        F=F,
        COMPUTE=tl.float64 if x.dtype == torch.float64 else tl.float32,
        BLOCK_T=BLOCK_T,
        BLOCK_J=triton.next_power_of_2(block),
        BLOCK_G=triton.next_power_of_2(max(geo_end, 1)),
        BLOCK_F=triton.next_power_of_2(max(F, 1)),
    )
    return y


def _check(
    x: Tensor, blocks: Tensor | None, num_blocks: int, rope: RopeTables | None, heads_per_program: int | None
) -> None:
    """One-line EncodingErrors for arguments the kernel cannot apply."""
    if not is_available():
        raise EncodingError(
            "fused_banded_product needs triton and a CUDA device (or TRITON_INTERPRET=1 set "
            "before triton's first import, for CPU tensors); use banded_product instead"
        )
    if x.dim() != 5 or x.dtype not in _DTYPES:
        raise EncodingError(
            f"x must be (B, heads, V, P, head_dim) float32/float16/bfloat16/float64, got {tuple(x.shape)} {x.dtype}"
        )
    if not x.is_cuda and not _interpreting():
        raise EncodingError(f"x must be a CUDA tensor (CPU tensors need TRITON_INTERPRET=1), got {x.device}")
    if blocks is None and rope is None:
        raise EncodingError("D without blocks and RoPE is the identity; pass blocks, rope or both")
    B, _, V, P, head_dim = x.shape
    rope_dim = 0
    if rope is not None:
        F = rope[0].shape[-1] // 4
        rope_dim = 4 * F
        shapes = tuple(tuple(t.shape) for t in rope)
        if shapes != ((P, 4 * F), (P, 3 * F), (P, 3 * F)) or not 0 < rope_dim <= head_dim:
            raise EncodingError(
                f"rope must be rope_diagonals tables (P, 4F), (P, 3F), (P, 3F) with P = {P} "
                f"and 4F <= head_dim = {head_dim}, got {shapes}"
            )
    if blocks is not None:
        shape = tuple(blocks.shape)
        if (
            len(shape) != 5
            or shape[:2] != (B, V)
            or shape[2] not in (1, P)
            or shape[3] != shape[4]
            or not 0 <= num_blocks * shape[4] <= head_dim - rope_dim
        ):
            raise EncodingError(
                f"blocks must be (B, V, 1 or P, b, b) = ({B}, {V}, 1 or {P}, b, b) with "
                f"0 <= num_blocks * b <= {head_dim - rope_dim} channels, got {shape} "
                f"and num_blocks = {num_blocks}"
            )
    if any(t.device != x.device or not t.is_floating_point() for t in (blocks, *(rope or ())) if t is not None):
        raise EncodingError(f"blocks and rope must be floating-point tensors on x's device {x.device}")
    if heads_per_program is not None and heads_per_program < 1:
        raise EncodingError(f"heads_per_program must be a positive int or None, got {heads_per_program}")


def fused_banded_product(
    x: Tensor, blocks: Tensor | None, num_blocks: int, rope: RopeTables | None, *, heads_per_program: int | None = None
) -> Tensor:
    """``y = D x`` per token for ``x (B, heads, V, P, head_dim)`` in one Triton kernel pass.

    The arguments are :func:`~hrope.encodings.banded.banded_product`'s (its precomputed
    ``operator`` has no counterpart: the kernel reads blocks and tables directly): D =
    blockdiag(M tiled ``num_blocks`` times, identity, R) for ``blocks`` M ``(B, V, 1 or P, b, b)``
    or None and ``rope`` the tables of R or None. D^T x: ``blocks.mT`` and ``inverse_rope(rope)``;
    D^-1 x: the inverse blocks and ``inverse_rope(rope)``. ``heads_per_program``: heads each
    program loops over (None: :func:`_heads_per_program`). Differentiable in x and ``blocks``.
    Returns a new contiguous tensor in x's dtype.
    """
    _check(x, blocks, num_blocks, rope, heads_per_program)
    cos, plus, minus = rope if rope is not None else (None, None, None)
    product = functools.partial(fused_banded_product, heads_per_program=heads_per_program)
    return cast(
        Tensor,
        TransformProduct.apply(  # type: ignore[no-untyped-call]
            x,
            blocks,
            num_blocks,
            cos,
            plus,
            minus,
            lambda x: _launch(x, blocks, num_blocks, rope, heads_per_program),
            product,
        ),
    )
