"""LVSM's perceptual training loss: L1 distances of VGG-19 features (``train.perceptual_loss: vgg19``).

The loss LVSM (and RayRoPE) train with, after the Crowdsampling-the-Plenoptic-Function loss. It is
not LPIPS: no learned heads, no unit-normalised features. For images in [0, 1]:

- both images go to 0-255 with the ImageNet mean (123.68, 116.779, 103.939) subtracted;
- a VGG-19 whose max pools are average pools (:class:`hrope.nvs.evaluation.vgg.VGGFeatures`)
  gives five feature maps, after relu1_2, relu2_2, relu3_2, relu4_2 and relu5_2 (layers 3, 8,
  13, 22, 31 of torchvision's ``vgg19().features``);
- the loss is ``(e0 + e1 / 2.6 + e2 / 4.8 + e3 / 3.7 + e4 / 5.6 + e5 · 10 / 1.5) / 255``, with e0
  the mean absolute difference of the preprocessed images and e1..e5 those of the feature maps.

The weights are a LOCAL file (``train.vgg19_weights``, safetensors or a ``torch.save`` state dict
read with ``weights_only=True``) in torchvision's layout, ``features.{i}.weight`` / ``.bias`` for the
convolutions up to layer 30 (more entries are ignored). LVSM uses the MatConvNet
``imagenet-vgg-verydeep-19`` weights, whose filters ``(kh, kw, in, out)`` are torchvision's
``(out, in, kh, kw)`` after ``permute(3, 2, 0, 1)``; they expect the 0-255 input above. torchvision's
own ImageNet VGG-19 weights load too but were trained on inputs scaled to unit variance, so with
them the loss has other values than LVSM's.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor, nn

from ..evaluation.metrics import MetricError, load_weights, read_weights
from ..evaluation.vgg import VGGFeatures

__all__ = ["VGGPerceptualLoss"]


class VGGPerceptualLoss(nn.Module):
    """LVSM's VGG-19 perceptual loss (module doc), frozen; ``forward(pred, target)`` of images
    ``(B, 3, H, W)`` in [0, 1] gives the per-image losses ``(B,)`` (their mean is LVSM's loss)."""

    mean: Tensor

    TAPS = (3, 8, 13, 22, 31)
    DIVISORS = (2.6, 4.8, 3.7, 5.6, 1.5 / 10)
    MEAN = (123.68, 116.779, 103.939)
    NAME = "VGG-19 perceptual loss"

    def __init__(self, weights: str | Path) -> None:
        super().__init__()
        self.features = VGGFeatures("vgg19", last=self.TAPS[-1], pool="avg")
        self.register_buffer("mean", torch.tensor(self.MEAN)[None, :, None, None])
        state = read_weights(weights, self.NAME)
        load_weights(self, {k: v for k, v in state.items() if k.startswith("features.")}, weights, self.NAME)
        self.eval().requires_grad_(False)

    def forward(self, pred: Tensor, target: Tensor) -> Tensor:
        if pred.shape != target.shape or pred.ndim != 4 or pred.shape[1] != 3:
            raise MetricError(f"expected two (B, 3, H, W) images, got {tuple(pred.shape)} and {tuple(target.shape)}")
        a, b = pred.float() * 255 - self.mean, target.float() * 255 - self.mean
        loss = (a - b).abs().mean((1, 2, 3))
        taps = zip(self.features.taps(a, self.TAPS), self.features.taps(b, self.TAPS), self.DIVISORS)
        for x, y, divisor in taps:
            loss = loss + (x - y).abs().mean((1, 2, 3)) / divisor
        return loss / 255
