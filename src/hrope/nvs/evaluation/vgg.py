"""The convolutional part of VGG-16 / VGG-19 in plain torch, laid out as torchvision's ``features``.

:class:`VGGFeatures` is an ``nn.Sequential`` numbered like torchvision's ``vgg16().features`` /
``vgg19().features`` (3x3 convolutions with padding 1, each followed by a ReLU, and 2x2 pools of
stride 2), so a torchvision state dict of the features (``{i}.weight`` / ``{i}.bias``, or with the
``features.`` prefix of the whole network's) loads as it is. It serves LPIPS-VGG (VGG-16, max
pools) and LVSM's perceptual loss (VGG-19, average pools). No weights ship and nothing is
downloaded: the callers load a local file.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn

__all__ = ["LAYOUTS", "VGGFeatures"]

# torchvision's configurations "D" (vgg16) and "E" (vgg19): output channels of each convolution, "M" a pool
LAYOUTS: dict[str, tuple[int | str, ...]] = {
    "vgg16": (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"),
    "vgg19": (64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M", 512, 512, 512, 512, "M"),
}


class VGGFeatures(nn.Sequential):
    """Layers ``0..last`` of torchvision's ``features`` of ``layout`` (:data:`LAYOUTS`); ``pool``:
    ``max`` (torchvision's) or ``avg`` (2x2 average pools in their place). Images ``(B, 3, H, W)``
    as the weights expect them (the caller normalises)."""

    def __init__(self, layout: str, last: int, pool: str = "max") -> None:
        if layout not in LAYOUTS or pool not in ("max", "avg"):
            raise ValueError(f"layout must be one of {sorted(LAYOUTS)} and pool max or avg, got {layout!r}, {pool!r}")
        layers: list[nn.Module] = []
        channels = 3
        for entry in LAYOUTS[layout]:
            if entry == "M":
                layers.append(nn.MaxPool2d(2, 2) if pool == "max" else nn.AvgPool2d(2, 2))
            else:
                layers += [nn.Conv2d(channels, int(entry), 3, padding=1), nn.ReLU()]
                channels = int(entry)
        if not 0 <= last < len(layers):
            raise ValueError(f"last must be a layer index of {layout}'s features (0..{len(layers) - 1}), got {last}")
        super().__init__(*layers[: last + 1])

    def taps(self, x: Tensor, layers: Sequence[int]) -> list[Tensor]:
        """The outputs of the layers with the indices ``layers`` (increasing), one forward pass."""
        out = []
        for index, layer in enumerate(self):
            x = layer(x)
            if index in layers:
                out.append(x)
        return out
