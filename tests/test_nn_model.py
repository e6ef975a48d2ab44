"""The LVSM model's ``folded_attention`` switch: same parameters, same outputs and gradients."""

from __future__ import annotations

import pytest
import torch
from _lvsm_helpers import SMALL_MODEL, synthetic_batch

from hrope.nn import MultiviewAttention
from hrope.nvs.model import LVSM, ModelConfig, ModelError

# encodings that fold (prope, gta, cape, hrope-lift), one that does not (hrope), a plain one and a
# query-frame one; learned per-layer planes for hrope-lift (gradients reach the plane heads)
ENCODINGS = ["none", "rope2d", "prope", "gta", "cape", "hrope-lift", "hrope", "rayrope"]


@pytest.fixture(scope="module")
def batch():
    return synthetic_batch(num_scenes=2, num_views=3)


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
