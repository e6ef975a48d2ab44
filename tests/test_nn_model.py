"""The LVSM model's attention layers (hrope.nn.MultiviewAttention): unfolded by default, op for op
the plain math around the encoding's prepared transform; the ``folded_attention`` switch: same
parameters, same outputs and gradients to float rounding."""

from __future__ import annotations

import pytest
import torch
from _lvsm_helpers import SMALL_MODEL, synthetic_batch

from hrope.nn import MultiviewAttention
from hrope.nvs.model import LVSM, ModelConfig, ModelError
from hrope.nvs.sources import encoding_inputs

# encodings that fold (prope, gta, cape, hrope-lift), one that does not (hrope), a plain one and a
# query-frame one; learned per-layer planes for hrope-lift (gradients reach the plane heads)
ENCODINGS = ["none", "rope2d", "prope", "gta", "cape", "hrope-lift", "hrope", "rayrope"]


@pytest.fixture(scope="module")
def batch():
    return synthetic_batch(num_scenes=2, num_views=3)


def layer_calls(model: LVSM, batch) -> tuple[list[tuple], list[dict]]:
    """``(attention module, input x, factors, output)`` of every block's attention in one forward
    pass, and the pass's per-token values (per layer, or one entry for static sources)."""
    calls: list[tuple] = []

    def record(module, args, kwargs, out):
        calls.append((module, args[0], kwargs["factors"], out))

    hooks = [block.attn.register_forward_hook(record, with_kwargs=True) for block in model.blocks]
    try:
        parameters = model(batch).parameters
    finally:
        for hook in hooks:
            hook.remove()
    return calls, parameters


def plain_attention(attention, x, prepared, heads: int):
    """``out(attention of prepared(q_norm(q), k_norm(k), v))`` on ``q, k, v = qkv(x)`` split into
    heads: the LVSM attention layer written out."""
    B, N, D = x.shape
    q, k, v = attention.qkv(x).reshape(B, N, 3, heads, D // heads).permute(2, 0, 3, 1, 4)
    out = prepared.attention(attention.q_norm(q), attention.k_norm(k), v)
    return attention.out(out.transpose(1, 2).reshape(B, N, D))


@pytest.mark.parametrize("qk_norm", [True, False], ids=["qk_norm", "plain"])
@pytest.mark.parametrize(
    "encoding", ["none", "rope2d", "prope", "gta", "cape", "hrope-lift", "urope", "rayrope", "hrope-lift per_head"]
)
def test_the_default_layer_is_the_plain_math(encoding, qk_norm, batch):
    """Unfolded (the default), every block's attention equals the layer written out around the
    encoding prepared afresh from the folded cameras and that layer's values, bit for bit, forward
    and gradients (to x and the layer's weights): no fold, no RoPE in place."""
    name, _, per_head = encoding.partition(" ")
    options = {"predictor_options": {"per_head": True}} if per_head else {}
    torch.manual_seed(0)
    model = LVSM(ModelConfig(**SMALL_MODEL, encoding=name, qk_norm=qk_norm, **options))
    with torch.no_grad():  # away from the zero-initialised plane heads and the unit RMS gains
        for parameter in model.parameters():
            parameter.add_(0.02 * torch.randn_like(parameter))
    calls, parameters = layer_calls(model, batch)
    cameras, grid, heads = model.fold_cameras(batch.cameras, 2), model.config.grid, model.config.heads
    head_dim = model.config.dim // heads
    assert len(calls) == model.config.layers
    for layer, (attention, x, factors, out) in enumerate(calls):
        assert not factors.folds and factors.rope_dim == 0
        values = parameters[min(layer, len(parameters) - 1)] if parameters else {}
        prepare = model.encoding.prepare
        if per_head:  # one transform per head, each from its own values (a heads axis after N)
            inputs = [encoding_inputs({key: value[:, :, h] for key, value in values.items()}) for h in range(heads)]
            prepared = _PerHead([prepare(cameras, grid, head_dim, planes=p, **q) for p, q in inputs])
        else:
            planes, params = encoding_inputs(values)
            prepared = prepare(cameras, grid, head_dim, planes=planes, **params)
        expected = plain_attention(attention, x, prepared, heads)
        weights = torch.linspace(-1, 1, out.numel()).view_as(out)
        wrt = [x, *attention.parameters()]
        grads = [torch.autograd.grad((y * weights).sum(), wrt, retain_graph=True) for y in (out, expected)]
        assert torch.equal(out, expected), layer
        for got, want in zip(*grads, strict=True):
            assert torch.equal(got, want), layer


class _PerHead:
    """Per-head transforms, one SDPA call per head, as one ``attention`` over ``(B, heads, N, d)``."""

    def __init__(self, transforms) -> None:
        self.transforms = transforms

    def attention(self, q, k, v):
        return torch.cat([t.attention(q[:, [h]], k[:, [h]], v[:, [h]]) for h, t in enumerate(self.transforms)], 1)


def pair(encoding: str, **options) -> tuple[LVSM, LVSM]:
    torch.manual_seed(0)
    plain = LVSM(ModelConfig(**SMALL_MODEL, encoding=encoding, **options))
    torch.manual_seed(0)
    folded = LVSM(ModelConfig(**SMALL_MODEL, encoding=encoding, folded_attention=True, **options))
    return plain, folded


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_folded_attention_switch_equals_the_plain_model(encoding, batch):
    plain, folded = pair(encoding)
    assert list(plain.state_dict()) == list(folded.state_dict())  # same names, order and (seeded) values
    for (name, a), b in zip(plain.state_dict().items(), folded.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    assert all(isinstance(block.attn, MultiviewAttention) for block in folded.blocks)
    outputs = []
    for model in (plain, folded):
        out = model(batch)
        (out.images - batch.images[:, 2:]).square().mean().backward()
        outputs.append((out.images, {n: p.grad for n, p in model.named_parameters()}))
    (images, grads), (images_folded, grads_folded) = outputs
    # measured: images differ by <= 6e-8, gradients by <= 7.4e-7 of their largest entry (float32);
    # 15x margins
    torch.testing.assert_close(images_folded, images, atol=1e-6, rtol=0)
    for name, grad in grads.items():
        scale = grad.abs().max().item()
        torch.testing.assert_close(grads_folded[name], grad, atol=1e-5 * scale, rtol=0, msg=name)


def test_folded_attention_refuses_per_head_parameters():
    with pytest.raises(ModelError, match="per_head"):
        LVSM(
            ModelConfig(
                **SMALL_MODEL,
                encoding="hrope-lift",
                folded_attention=True,
                predictor_options={"per_head": True},
            )
        )
