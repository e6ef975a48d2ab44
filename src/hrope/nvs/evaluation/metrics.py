"""Image metrics (DESIGN.md §7): PSNR, SSIM, ST-LPIPS (alex) and (only with local weights) LPIPS-Alex / LPIPS-VGG.

All take images ``(B, 3, H, W)`` in [0, 1] and return per-image values ``(B,)``; callers average
(the mean of per-image values, LVSM's protocol).

- PSNR: images clamped to [0, 1], ``-10 log10(MSE)`` per image.
- SSIM: standard Gaussian-window SSIM (11x11, sigma 1.5, data range 1) via kornia, averaged over
  the valid (unpadded) window positions and the channels, like scikit-image's
  ``structural_similarity(gaussian_weights=True)``.
- LPIPS-Alex and LPIPS-VGG (v0.1 heads; ``LPIPS(weights, net)`` with ``net`` ``alex`` or
  ``vgg``, ``eval.lpips_net``): need a LOCAL file (safetensors, or a ``torch.save`` file read with
  ``weights_only=True``) with the torchvision backbone's feature weights (AlexNet:
  ``features.{0,3,6,8,10}.{weight,bias}``; VGG-16: ``features.{0,2,5,...,28}.{weight,bias}``)
  and the LPIPS linear heads (``lin{0..4}.model.1.weight``). Without one LPIPS is unavailable
  (reported as such, never a made-up number). LVSM reports LPIPS-VGG; RayRoPE and PRoPE LPIPS-Alex:
  the two are different numbers, always named (:data:`LPIPS_NAMES`).
- ST-LPIPS (alex): ShiftTolerant-LPIPS (Ghildyal & Liu, ECCV 2022), a perceptual distance of the
  LPIPS form whose AlexNet is made tolerant to small shifts (stride-1 first convolution, blurred
  reflect-padded downsampling). It is NOT LPIPS (different network and weights, different values)
  and is always reported under its own name. Its weights ship inside the ``stlpips-pytorch`` wheel
  (the ``perceptual`` extra), so it works offline: :class:`STLPIPS` is this module's own network
  definition, loaded with ``torch.load(weights_only=True)`` from the package's weights file; none
  of the package's code runs (it imports torchvision, IPython and torchsummary at module level).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import kornia
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...errors import InputError
from ..config.schema import LPIPS_NETS
from .vgg import VGGFeatures

__all__ = [
    "psnr",
    "ssim",
    "LPIPS",
    "LPIPS_NAMES",
    "lpips_name",
    "lpips_label",
    "STLPIPS",
    "ST_LPIPS_NAME",
    "st_lpips_weights",
    "MetricError",
    "image_metrics",
    "read_weights",
    "load_weights",
]

SSIM_WINDOW = 11
ST_LPIPS_NAME = "ST-LPIPS (alex)"
LPIPS_NAMES = dict(zip(LPIPS_NETS, ("LPIPS-Alex", "LPIPS-VGG")))  # eval.lpips_net -> the metric's name
ST_LPIPS_PACKAGE = "stlpips_pytorch"
ST_LPIPS_FILE = ("weights", "vST0.0", "alex_shift_tolerant.pth")


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


def lpips_name(net: str) -> str:
    """The metric's name for an LPIPS backbone (``eval.lpips_net``): ``LPIPS-Alex`` or ``LPIPS-VGG``."""
    if net not in LPIPS_NAMES:
        raise MetricError(f"LPIPS backbone must be one of {', '.join(LPIPS_NAMES)}, got {net!r}")
    return LPIPS_NAMES[net]


def lpips_label(results: list[dict]) -> str:
    """The LPIPS column's name for result dicts (``hrope eval``'s, a protocol's): by their
    ``lpips_net`` (results written before LPIPS-VGG existed: ``alex``); a one-line
    :class:`MetricError` when they mix backbones, whose values are not comparable."""
    nets = sorted({r.get("lpips_net", "alex") for r in results})
    if len(nets) > 1:
        raise MetricError(f"the results score LPIPS with different backbones ({', '.join(nets)}): tabulate them apart")
    return lpips_name(nets[0] if nets else "alex")


def read_weights(path: str | Path, what: str) -> dict[str, Tensor]:
    """The tensors of a local weights file: safetensors (``.safetensors``), else a ``torch.save``
    state dict read with ``weights_only=True``; a one-line :class:`MetricError` naming ``what`` and
    the file otherwise."""
    path = Path(path)
    if not path.is_file():
        raise MetricError(f"{what} weights not found: {path}")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(str(path))
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # safetensors and torch.load raise their own types for bad files
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise MetricError(f"{what} weights {path} cannot be read: {first}") from None
    if not isinstance(state, dict):
        raise MetricError(f"{what} weights {path} hold a {type(state).__name__}, not a state dict")
    return {k: v for k, v in state.items() if isinstance(v, Tensor)}


def load_weights(module: nn.Module, state: dict[str, Tensor], path: str | Path, what: str) -> None:
    """Every parameter of ``module`` from ``state`` (other entries ignored), or a one-line
    :class:`MetricError` naming the missing and mis-shaped ones."""
    own = {name: p.shape for name, p in module.named_parameters()}
    missing = sorted(set(own) - set(state))
    shapes = sorted(
        f"{k} {tuple(state[k].shape)}" for k, shape in own.items() if k in state and state[k].shape != shape
    )
    problems = [
        f"{verb} {', '.join(keys[:3])}{' ...' if len(keys) > 3 else ''}"
        for verb, keys in (("lack", missing), ("have mis-shaped", shapes))
        if keys
    ]
    if problems:
        raise MetricError(f"{what} weights {path} {'; '.join(problems)}")
    module.load_state_dict({name: state[name] for name in own}, strict=False)


class LPIPS(nn.Module):
    """LPIPS (v0.1 heads) with the AlexNet (``net="alex"``, LPIPS-Alex) or VGG-16 (``"vgg"``,
    LPIPS-VGG) backbone, weights from a local file (see module doc); :attr:`name` says which."""

    shift: Tensor
    scale: Tensor

    CHANNELS = {"alex": (64, 192, 384, 256, 256), "vgg": (64, 128, 256, 512, 512)}
    BACKBONES = {"alex": "alexnet", "vgg": "vgg16"}  # the results' lpips_backbone
    VGG_TAPS = (3, 8, 15, 22, 29)  # relu1_2, relu2_2, relu3_3, relu4_3, relu5_3 of torchvision's vgg16 features
    SHIFT = (-0.030, -0.088, -0.188)
    SCALE = (0.458, 0.448, 0.450)

    def __init__(self, weights: str | Path, net: str = "alex") -> None:
        super().__init__()
        self.net, self.name = net, lpips_name(net)
        if net == "alex":
            self.features: nn.ModuleDict | VGGFeatures = nn.ModuleDict(
                {
                    "0": nn.Conv2d(3, 64, 11, stride=4, padding=2),
                    "3": nn.Conv2d(64, 192, 5, padding=2),
                    "6": nn.Conv2d(192, 384, 3, padding=1),
                    "8": nn.Conv2d(384, 256, 3, padding=1),
                    "10": nn.Conv2d(256, 256, 3, padding=1),
                }
            )
        else:
            self.features = VGGFeatures("vgg16", last=self.VGG_TAPS[-1])
        self.heads = nn.ModuleList(nn.Conv2d(c, 1, 1, bias=False) for c in self.CHANNELS[net])
        self.register_buffer("shift", torch.tensor(self.SHIFT)[None, :, None, None])
        self.register_buffer("scale", torch.tensor(self.SCALE)[None, :, None, None])
        mapped = {}
        for key, value in read_weights(weights, self.name).items():
            if key.startswith("features."):
                mapped[key] = value
            elif key.startswith("lin") and key.endswith(".model.1.weight"):
                mapped[f"heads.{key[3 : key.index('.')]}.weight"] = value
        load_weights(self, mapped, weights, self.name)
        self.eval().requires_grad_(False)

    def _taps(self, x: Tensor) -> list[Tensor]:
        x = (x * 2 - 1 - self.shift) / self.scale
        if isinstance(self.features, VGGFeatures):
            return self.features.taps(x, self.VGG_TAPS)
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
        return _head_distance(self.heads, self._taps(pred.float()), self._taps(target.float()))


def _head_distance(heads: nn.ModuleList, taps_a: list[Tensor], taps_b: list[Tensor]) -> Tensor:
    """The LPIPS form ``(B,)``: per tap, unit-normalised feature differences squared, weighted over
    channels by the tap's 1x1 head and averaged over positions; summed over taps."""
    distances = [head((_unit(a) - _unit(b)).square()).mean((1, 2, 3)) for head, a, b in zip(heads, taps_a, taps_b)]
    return sum(distances[1:], distances[0])


def st_lpips_weights() -> Path | None:
    """The ST-LPIPS (alex) weights file inside the installed ``stlpips-pytorch`` package (found
    without importing it), or None when the package is not installed."""
    spec = importlib.util.find_spec(ST_LPIPS_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))).joinpath(*ST_LPIPS_FILE)
    return path if path.is_file() else None


def _blur_pool(x: Tensor, blur: Tensor) -> Tensor:
    """Anti-aliased stride-2 downsampling: reflect-pad by 2, then the per-channel ``blur`` (C, 1, 3, 3)."""
    return F.conv2d(F.pad(x, (2, 2, 2, 2), mode="reflect"), blur, stride=2, groups=x.shape[1])


class STLPIPS(nn.Module):
    """ST-LPIPS with the shift-tolerant AlexNet (see module doc), weights from ``stlpips-pytorch``.

    ``weights``: the package's ``alex_shift_tolerant.pth`` (default: found in the installed
    package). Images ``(B, 3, H, W)`` in [0, 1], at least :attr:`MIN_SIZE` pixels a side.
    """

    shift: Tensor
    scale: Tensor
    blur0: Tensor
    blur1: Tensor
    blur2: Tensor

    CHANNELS = (64, 192, 384, 256, 256)
    MIN_SIZE = 24
    # this module's parameter -> the key in the package's state dict
    KEYS = {
        "shift": "scaling_layer.shift",
        "scale": "scaling_layer.scale",
        "blur0": "net.slice1.1.filt",
        "blur1": "net.slice2.4.filt",
        "blur2": "net.slice3.8.filt",
        **{
            f"convs.{i}.{p}": f"net.{key}.{p}"
            for i, key in enumerate(("slice1.0", "slice2.5", "slice3.9", "slice4.11", "slice5.13"))
            for p in ("weight", "bias")
        },
        **{f"heads.{i}.weight": f"lin{i}.model.1.weight" for i in range(5)},
    }

    def __init__(self, weights: str | Path | None = None) -> None:
        super().__init__()
        path = Path(weights) if weights is not None else st_lpips_weights()
        if path is None:
            raise MetricError(f"{ST_LPIPS_NAME} needs the stlpips-pytorch package: pip install 'hrope[perceptual]'")
        if not path.is_file():
            raise MetricError(f"{ST_LPIPS_NAME} weights not found: {path}")
        self.convs = nn.ModuleList(
            [
                nn.Conv2d(3, 64, 11, padding=2),
                nn.Conv2d(64, 192, 5, padding=2),
                nn.Conv2d(192, 384, 3, padding=1),
                nn.Conv2d(384, 256, 3, padding=1),
                nn.Conv2d(256, 256, 3, padding=1),
            ]
        )
        for i, channels in enumerate((64, 64, 192)):  # the fixed [1, 2, 1] x [1, 2, 1] / 16 filters, per channel
            self.register_buffer(f"blur{i}", torch.empty(channels, 1, 3, 3))
        self.heads = nn.ModuleList(nn.Conv2d(c, 1, 1, bias=False) for c in self.CHANNELS)
        self.register_buffer("shift", torch.empty(1, 3, 1, 1))
        self.register_buffer("scale", torch.empty(1, 3, 1, 1))
        state = torch.load(path, map_location="cpu", weights_only=True)
        missing = sorted(key for key in self.KEYS.values() if key not in state)
        if missing:
            raise MetricError(f"{ST_LPIPS_NAME} weights {path} lack {missing}")
        self.load_state_dict({name: state[key] for name, key in self.KEYS.items()})
        self.eval().requires_grad_(False)

    def _taps(self, x: Tensor) -> list[Tensor]:
        x = (x * 2 - 1 - self.shift) / self.scale
        conv1, conv2, conv3, conv4, conv5 = self.convs
        t1 = F.relu(_blur_pool(conv1(x), self.blur0))
        t2 = F.relu(conv2(_blur_pool(F.max_pool2d(t1, 3, 1), self.blur1)))
        t3 = F.relu(conv3(_blur_pool(F.max_pool2d(t2, 3, 1), self.blur2)))
        t4 = F.relu(conv4(t3))
        return [t1, t2, t3, t4, F.relu(conv5(t4))]

    def forward(self, pred: Tensor, target: Tensor) -> Tensor:
        """Per-image ST-LPIPS ``(B,)`` of images in [0, 1] (0 for identical images)."""
        _check(pred, target)
        if min(pred.shape[-2:]) < self.MIN_SIZE:
            size = self.MIN_SIZE
            raise MetricError(f"{ST_LPIPS_NAME} needs images of at least {size}x{size}, got {tuple(pred.shape[-2:])}")
        return _head_distance(self.heads, self._taps(pred.float()), self._taps(target.float()))


def image_metrics(
    pred: Tensor, target: Tensor, lpips: LPIPS | None = None, st_lpips: STLPIPS | None = None
) -> dict[str, Tensor]:
    """``{"psnr": (B,), "ssim": (B,)[, "lpips": (B,)][, "st_lpips": (B,)]}`` for ``(B, 3, H, W)``
    images (LPIPS with ``lpips``, ST-LPIPS with ``st_lpips``)."""
    out = {"psnr": psnr(pred, target), "ssim": ssim(pred, target)}
    with torch.no_grad():
        if lpips is not None:
            out["lpips"] = lpips(pred, target)
        if st_lpips is not None:
            out["st_lpips"] = st_lpips(pred, target)
    return out
