"""Image metrics (DESIGN.md §7): PSNR, SSIM and (only with local weights) LPIPS.

All take images ``(B, 3, H, W)`` in [0, 1] and return per-image values ``(B,)``; callers average
(the mean of per-image values, LVSM's protocol).

- PSNR: images clamped to [0, 1], ``-10 log10(MSE)`` per image.
- SSIM: standard Gaussian-window SSIM (11x11, sigma 1.5, data range 1) via kornia, averaged over
  the valid (unpadded) window positions and the channels, like scikit-image's
  ``structural_similarity(gaussian_weights=True)``.
- LPIPS (AlexNet, v0.1 heads): needs a LOCAL safetensors file with the torchvision AlexNet
  feature weights (``features.{0,3,6,8,10}.{weight,bias}``) and the LPIPS linear heads
  (``lin{0..4}.model.1.weight``). Without one LPIPS is unavailable (reported as such, never a
  made-up number).
"""

from __future__ import annotations

from pathlib import Path

import kornia
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import InputError

__all__ = ["psnr", "ssim", "LPIPS", "MetricError", "image_metrics"]

SSIM_WINDOW = 11


class MetricError(InputError):
    """Bad metric input or missing weights."""


def _check(pred: Tensor, target: Tensor) -> None:
    if pred.shape != target.shape or pred.ndim != 4 or pred.shape[1] != 3:
        raise MetricError(f"expected two (B, 3, H, W) images, got {tuple(pred.shape)} and {tuple(target.shape)}")


def psnr(pred: Tensor, target: Tensor) -> Tensor:
    """Per-image PSNR ``(B,)`` in dB of images in [0, 1] (inf for identical images)."""
    _check(pred, target)
    mse = (pred.float().clamp(0, 1) - target.float().clamp(0, 1)).square().flatten(1).mean(1)
    return -10.0 * torch.log10(mse)


def ssim(pred: Tensor, target: Tensor) -> Tensor:
    """Per-image SSIM ``(B,)`` (Gaussian 11x11 window, sigma 1.5, data range 1)."""
    _check(pred, target)
    if min(pred.shape[-2:]) < SSIM_WINDOW:
        raise MetricError(f"SSIM needs images of at least {SSIM_WINDOW}x{SSIM_WINDOW}, got {tuple(pred.shape[-2:])}")
    ssim_map = kornia.metrics.ssim(
        pred.float().clamp(0, 1), target.float().clamp(0, 1), SSIM_WINDOW, max_val=1.0, padding="valid"
    )
    return ssim_map.flatten(1).mean(1)


def _unit(x: Tensor) -> Tensor:
    """Features ``(B, C, h, w)`` scaled to unit length over channels."""
    return x / (x.square().sum(1, keepdim=True).sqrt() + 1e-10)


class LPIPS(nn.Module):
    """LPIPS with the AlexNet backbone, weights from a local safetensors file (see module doc)."""

    shift: Tensor
    scale: Tensor

    CHANNELS = (64, 192, 384, 256, 256)
    SHIFT = (-0.030, -0.088, -0.188)
    SCALE = (0.458, 0.448, 0.450)

    def __init__(self, weights: str | Path) -> None:
        super().__init__()
        path = Path(weights)
        if not path.is_file():
            raise MetricError(f"LPIPS weights not found: {path}")
        self.features = nn.ModuleDict(
            {
                "0": nn.Conv2d(3, 64, 11, stride=4, padding=2),
                "3": nn.Conv2d(64, 192, 5, padding=2),
                "6": nn.Conv2d(192, 384, 3, padding=1),
                "8": nn.Conv2d(384, 256, 3, padding=1),
                "10": nn.Conv2d(256, 256, 3, padding=1),
            }
        )
        self.heads = nn.ModuleList(nn.Conv2d(c, 1, 1, bias=False) for c in self.CHANNELS)
        self.register_buffer("shift", torch.tensor(self.SHIFT)[None, :, None, None])
        self.register_buffer("scale", torch.tensor(self.SCALE)[None, :, None, None])
        from safetensors.torch import load_file

        state = load_file(str(path))
        mapped = {}
        for key, value in state.items():
            if key.startswith("features."):
                mapped[key] = value
            elif key.startswith("lin") and key.endswith(".model.1.weight"):
                mapped[f"heads.{key[3 : key.index('.')]}.weight"] = value
        missing = set(self.state_dict()) - set(mapped) - {"shift", "scale"}
        if missing:
            raise MetricError(f"LPIPS weights {path} lack {sorted(missing)}")
        self.load_state_dict(mapped, strict=False)
        self.eval().requires_grad_(False)

    def _taps(self, x: Tensor) -> list[Tensor]:
        x = (x * 2 - 1 - self.shift) / self.scale
        taps = []
        for name, conv in self.features.items():
            if name in ("3", "6"):
                x = F.max_pool2d(x, 3, 2)
            x = F.relu(conv(x))
            taps.append(x)
        return taps

    def forward(self, pred: Tensor, target: Tensor) -> Tensor:
        """Per-image LPIPS ``(B,)`` of images in [0, 1]."""
        _check(pred, target)
        distances = [
            head((_unit(a) - _unit(b)).square()).mean((1, 2, 3))
            for head, a, b in zip(self.heads, self._taps(pred.float()), self._taps(target.float()))
        ]
        return sum(distances[1:], distances[0])


def image_metrics(pred: Tensor, target: Tensor, lpips: LPIPS | None = None) -> dict[str, Tensor]:
    """``{"psnr": (B,), "ssim": (B,)[, "lpips": (B,)]}`` for ``(B, 3, H, W)`` images."""
    out = {"psnr": psnr(pred, target), "ssim": ssim(pred, target)}
    if lpips is not None:
        with torch.no_grad():
            out["lpips"] = lpips(pred, target)
    return out
