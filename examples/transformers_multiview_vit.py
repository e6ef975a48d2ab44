"""A multi-view DINOv2-style ViT from Hugging Face transformers with hrope's attention.

A tiny randomly initialised ``Dinov2Model`` (no download) embeds each of V views as usual (one
cls token + grid_h x grid_w patches per view); the views' tokens are concatenated into one
sequence, so every layer attends across views with the geometric encoding. The cls tokens get the
identity transform (``camera_tokens``), and a zero-initialised linear head predicts each patch's
plane from its embedding (``hrope-lift`` starts as PRoPE). One forward and backward pass::

    python examples/transformers_multiview_vit.py [--views 3] [--encoding hrope-lift]
"""

from __future__ import annotations

import argparse
import math

import torch
from torch import nn
from transformers import Dinov2Config, Dinov2Model

import hrope
from hrope.integrations.transformers import NAME, Geometry


def ring_cameras(batch: int, views: int, image_size: int) -> hrope.Cameras:
    """Cameras on a circle of radius 3 around the origin, looking at it (OpenCV axes)."""
    K = torch.tensor([[1.2 * image_size, 0, image_size / 2], [0, 1.2 * image_size, image_size / 2], [0, 0, 1]])
    poses = []
    for c in range(views):
        a = 2 * math.pi * c / views
        forward = -torch.tensor([math.sin(a), 0.0, math.cos(a)])  # towards the origin
        right = torch.linalg.cross(torch.tensor([0.0, 1.0, 0.0]), forward)
        R = torch.stack([right, torch.linalg.cross(forward, right), forward])  # world-to-camera rows
        E = torch.eye(4)
        E[:3, :3], E[:3, 3] = R, R @ (3.0 * -forward)  # t = -R c, camera centre 3 * -forward
        poses.append(E)
    return hrope.Cameras(
        K.repeat(batch, views, 1, 1), torch.stack(poses).repeat(batch, 1, 1, 1), image_size=(image_size, image_size)
    )


class MultiViewDinov2(nn.Module):
    """``Dinov2Model`` over V views in one sequence: ``[cls, patches]`` per view, view-major."""

    def __init__(self, config: Dinov2Config, encoding: str) -> None:
        super().__init__()
        self.dinov2 = Dinov2Model(config)
        self.dinov2.set_attn_implementation(NAME)
        self.encoding = hrope.get_encoding(encoding)
        self.plane_head = nn.Linear(config.hidden_size, 3)  # m = n / d per patch, zero at init
        nn.init.zeros_(self.plane_head.weight)
        nn.init.zeros_(self.plane_head.bias)

    def forward(self, images: torch.Tensor, cameras: hrope.Cameras) -> torch.Tensor:
        """images ``(B, V, 3, H, W)`` -> hidden states ``(B, V * (1 + P), hidden)``."""
        B, V = images.shape[:2]
        tokens = self.dinov2.embeddings(images.flatten(0, 1)).unflatten(0, (B, V))  # (B, V, 1 + P, hidden)
        patches = tokens[:, :, 1:].flatten(1, 2)
        side = self.dinov2.config.image_size // self.dinov2.config.patch_size
        is_patch = torch.ones(tokens.shape[1:3], dtype=torch.bool)
        is_patch[:, 0] = False  # the cls token of each view: identity
        planes = hrope.Planes.from_m(self.plane_head(patches)) if self.encoding.needs_planes else None
        geometry = Geometry(self.encoding, cameras, (side, side), planes=planes, camera_tokens=is_patch.flatten())
        hidden = self.dinov2.encoder(tokens.flatten(1, 2), hrope_geometry=geometry).last_hidden_state
        return self.dinov2.layernorm(hidden)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--views", type=int, default=3)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--patch", type=int, default=8)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument(
        "--encoding",
        default="hrope-lift",  # planes from the head; no other per-token inputs
        choices=[name for name, cls in hrope.ENCODINGS.items() if not cls.param_names],
    )
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    config = Dinov2Config(
        hidden_size=64,
        num_hidden_layers=args.layers,
        num_attention_heads=2,
        intermediate_size=128,
        image_size=args.image_size,
        patch_size=args.patch,
    )
    model = MultiViewDinov2(config, args.encoding)
    images = torch.rand(args.batch, args.views, 3, args.image_size, args.image_size)
    hidden = model(images, ring_cameras(args.batch, args.views, args.image_size))
    hidden.square().mean().backward()  # a stand-in loss: gradients reach every weight and the plane head
    grads = {"encoder": sum(p.grad.norm() ** 2 for p in model.dinov2.parameters() if p.grad is not None) ** 0.5}
    if model.encoding.needs_planes:
        grads["plane head"] = model.plane_head.weight.grad.norm()
    print(
        f"{args.encoding}: {args.views} views x {hidden.shape[1] // args.views} tokens (cls + patches) -> hidden "
        f"{tuple(hidden.shape)}; gradient norms: " + ", ".join(f"{k} {v:.3e}" for k, v in grads.items())
    )
    return {"hidden": hidden.detach(), "gradient_norms": {k: float(v) for k, v in grads.items()}}


if __name__ == "__main__":
    main()
