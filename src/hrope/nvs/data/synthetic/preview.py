"""Preview synthetic scenes: ``python -m hrope.nvs.data.synthetic.preview OUT.png [--kind room|object|both]``.

Writes a grid with, per scene, one row each of images, inverse depth (turbo colour map) and
camera-frame normals mapped to RGB as (n + 1) / 2.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import torch

from ...running.atomic import save_image
from ..scene import Scene
from .generator import KINDS, make_scene

__all__ = ["preview_grid", "main"]


def preview_grid(scenes: Sequence[Scene]) -> torch.Tensor:
    """An RGB grid ``(3, rows * H, V * W)``: per scene one row each of images, depth and normals."""
    import matplotlib

    colormap = matplotlib.colormaps["turbo"]
    rows = []
    for scene in scenes:
        depth, normals = scene.depth, scene.normals
        if depth is None or normals is None:
            raise ValueError(f"{scene.name}: preview_grid needs scenes with depth and normals")
        rows.append(torch.cat(list(scene.images), -1))
        inverse = torch.where(torch.isfinite(depth), 1.0 / depth, torch.zeros_like(depth))
        inverse = inverse / inverse.amax().clamp_min(1e-6)
        rows.append(torch.as_tensor(colormap(torch.cat(list(inverse), -1).numpy())[..., :3]).permute(2, 0, 1).float())
        rows.append(torch.cat(list((normals + 1) / 2 * (normals.abs().sum(1, keepdim=True) > 0)), -1))
    return torch.cat(rows, -2)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m hrope.nvs.data.synthetic.preview", description=__doc__.split("\n")[0]
    )
    parser.add_argument("out", metavar="OUT.png", help="where to write the grid of views, depth and normals")
    parser.add_argument("--kind", choices=[*KINDS, "both"], default="both")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--scenes", type=int, default=2, help="scenes per kind")
    parser.add_argument("--views", type=int, default=4)
    parser.add_argument("--size", type=int, nargs=2, default=(128, 128), metavar=("H", "W"))
    args = parser.parse_args(argv)
    from PIL import Image

    kinds = list(KINDS) if args.kind == "both" else [args.kind]
    scenes = [
        make_scene(args.seed, i, kind, args.views, tuple(args.size)) for kind in kinds for i in range(args.scenes)
    ]
    grid = (preview_grid(scenes).clamp(0, 1) * 255).round().byte().permute(1, 2, 0).numpy()
    save_image(Image.fromarray(grid), args.out)
    print(f"wrote {args.out}: {len(scenes)} scenes x {args.views} views (rows: images, inverse depth, normals)")


if __name__ == "__main__":
    main()
