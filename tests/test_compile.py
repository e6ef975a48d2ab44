"""torch.compile(fullgraph=True): multiview_attention, the prepared transforms and the LVSM model
trace as one graph each (a graph break raises), forward and backward, and compute what eager does.

Most checks use the ``aot_eager`` backend (Dynamo's graph capture and AOT autograd, no code
generation: the graph-break check without a C++ compile); one test compiles with the default
CPU backend (inductor) for real. Tiny shapes; each compile takes seconds, so all are marked slow.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from _lvsm_helpers import SMALL_MODEL, synthetic_batch

import hrope
from hrope.testing import encoding_inputs, random_cameras, random_qkv
from hrope.nvs.model import LVSM, ModelConfig

pytestmark = pytest.mark.slow

GRID, VIEWS, HEADS, HEAD_DIM = (2, 2), 2, 2, 24
N = VIEWS * GRID[0] * GRID[1]


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test compiles from scratch (no recompile limit reached across parametrisations)."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def inputs(name: str, seed: int = 0):
    cameras = random_cameras(B=1, V=VIEWS, seed=seed, dtype=torch.float32)
    q, k, v = random_qkv(1, HEADS, N, HEAD_DIM, seed=seed, dtype=torch.float32)
    return cameras, encoding_inputs(name, cameras, GRID, seed=seed + 1, dtype=torch.float32), (q, k, v)


# per-view tiles, per-token params with value checks and a generic inverse, a query-frame encoding (one SDPA
# call per query view); hrope-lift and hrope's planes go through the tests below
@pytest.mark.parametrize("name", ["prope", "hrope-full", "rayrope"])
def test_multiview_attention_is_one_graph_forward_and_backward(name):
    cameras, extra, (q, k, v) = inputs(name)

    def attend(q, k, v):
        return hrope.multiview_attention(q, k, v, encoding=name, cameras=cameras, grid=GRID, **extra)

    compiled = torch.compile(attend, fullgraph=True, backend="aot_eager")
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    out = compiled(*leaves)
    out.square().sum().backward()
    eager_leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    expected = attend(*eager_leaves)
    expected.square().sum().backward()
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-6)
    for leaf, eager_leaf in zip(leaves, eager_leaves):
        torch.testing.assert_close(leaf.grad, eager_leaf.grad, rtol=0, atol=1e-5)


@pytest.mark.parametrize("qk_norm", [False, True], ids=["plain", "qk_norm"])
def test_folded_module_with_the_rope_in_place_is_one_graph(qk_norm):
    """hrope.nn's folded prope module: the per-view weights and the in-place RoPE (an autograd
    Function that writes its input) trace as one graph, forward and backward, equal to eager."""
    import hrope.nn

    cameras = random_cameras(B=1, V=VIEWS, dtype=torch.float32)
    torch.manual_seed(0)
    module = hrope.nn.MultiviewAttention(HEADS * HEAD_DIM, HEADS, "prope", fold=True, qk_norm=qk_norm)
    x = torch.randn(1, N, HEADS * HEAD_DIM)
    outputs = []
    for run in (torch.compile(module, fullgraph=True, backend="aot_eager"), module):
        leaf = x.clone().requires_grad_()
        out = run(leaf, cameras, GRID)
        out.square().sum().backward()
        outputs.append((out, leaf.grad))
    (out, grad), (expected, expected_grad) = outputs
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(grad, expected_grad, rtol=0, atol=1e-5)


def test_prepare_and_apply_compile_with_gradients_to_the_planes():
    """prepare (from plane vectors that need gradients, as learned planes do) and apply_q / k / v / o
    around SDPA in one graph; a transform prepared outside is applied in a compiled function too."""
    cameras, _, (q, k, v) = inputs("hrope-lift")
    m = 0.1 * torch.randn(1, N, 3, generator=torch.Generator().manual_seed(0))
    encoding = hrope.get_encoding("hrope-lift")

    def prepare_and_attend(m, q, k, v):
        t = encoding.prepare(cameras, GRID, HEAD_DIM, planes=hrope.Planes.from_m(m))
        return t.apply_o(F.scaled_dot_product_attention(t.apply_q(q), t.apply_k(k), t.apply_v(v)))

    compiled = torch.compile(prepare_and_attend, fullgraph=True, backend="aot_eager")
    planes, eager_planes = m.clone().requires_grad_(), m.clone().requires_grad_()
    out, expected = compiled(planes, q, k, v), prepare_and_attend(eager_planes, q, k, v)
    out.sum().backward()
    expected.sum().backward()
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(planes.grad, eager_planes.grad, rtol=0, atol=1e-5)

    prepared = encoding.prepare(cameras, GRID, HEAD_DIM, planes=hrope.Planes.from_m(m))
    apply_prepared = torch.compile(lambda q, k, v: prepared.attention(q, k, v), fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(apply_prepared(q, k, v), prepared.attention(q, k, v), rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    "name, options",
    [("hrope-lift", {}), ("rayrope", {})],
    ids=["hrope-lift-learned", "rayrope-learned"],
)
def test_the_lvsm_model_is_one_graph_for_a_training_step(name, options):
    torch.manual_seed(0)
    model = LVSM(ModelConfig(**SMALL_MODEL, encoding=name, **options))
    with torch.no_grad():  # non-zero plane heads: the predicted values reach the encoding
        for parameter in model.parameters():
            parameter.add_(0.01 * torch.randn_like(parameter))
    batch = synthetic_batch()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    compiled(batch).images.square().mean().backward()
    grads = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    expected = model(batch).images
    expected.square().mean().backward()
    torch.testing.assert_close(compiled(batch).images, expected, rtol=0, atol=1e-6)
    assert grads.keys() == {k for k, p in model.named_parameters() if p.grad is not None}
    for key, p in model.named_parameters():
        if p.grad is not None:
            torch.testing.assert_close(grads[key], p.grad, rtol=1e-4, atol=1e-7, msg=key)


def test_the_default_cpu_backend_compiles_and_matches_eager():
    """Inductor (C++ code generation) on prope: the fused kernels agree with eager to float32 rounding."""
    cameras, _, (q, k, v) = inputs("prope", seed=3)

    def attend(q, k, v):
        return hrope.multiview_attention(q, k, v, encoding="prope", cameras=cameras, grid=GRID)

    out = torch.compile(attend, fullgraph=True)(q, k, v)
    torch.testing.assert_close(out, attend(q, k, v), rtol=0, atol=1e-5)
