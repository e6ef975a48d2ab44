"""Shared helpers of the model/predictor/training tests: tiny configs and synthetic batches."""

from __future__ import annotations

import torch

from hrope.nvs.data.batch import collate_scenes
from hrope.nvs.data.synthetic import make_scene

torch.set_num_threads(1)  # small ops: one thread is fastest and avoids contention under xdist

IMAGE = 32
SMALL_MODEL = dict(image_size=IMAGE, patch_size=8, dim=48, layers=2, heads=2)


def synthetic_batch(num_scenes: int = 1, num_views: int = 3, num_context: int = 2, seed: int = 0):
    """A SceneBatch of ``num_scenes`` synthetic rooms at 32x32 (first views are the context)."""
    scenes = [make_scene(seed, i, "room", num_views=num_views, image_size=(IMAGE, IMAGE)) for i in range(num_scenes)]
    return collate_scenes(scenes, num_context)


def small_config(**model):
    """A run config (RunConfig) for a 2-layer 32x32 model on a handful of synthetic scenes."""
    from hrope.nvs.config import resolve

    return resolve(
        {
            "model": {**SMALL_MODEL, "preset": None, **model},
            "data": {"num_scenes": 2},
            "train": {
                "steps": 4,
                "batch_size": 1,
                "warmup": 1,
                "log_every": 1,
                "image_every": 2,
                "checkpoint_every": 2,
                "threads": 1,
            },
            "eval": {"num_scenes": 2, "batch_size": 2, "num_grid_scenes": 2},
        }
    )


def random_lpips_weights(path) -> None:
    """A safetensors file in the LPIPS (AlexNet) layout with random values: plumbing tests only."""
    from safetensors.torch import save_file

    generator = torch.Generator().manual_seed(0)
    shapes = {
        "features.0": (64, 3, 11, 11),
        "features.3": (192, 64, 5, 5),
        "features.6": (384, 192, 3, 3),
        "features.8": (256, 384, 3, 3),
        "features.10": (256, 256, 3, 3),
    }
    state = {}
    for name, shape in shapes.items():
        state[f"{name}.weight"] = 0.05 * torch.randn(shape, generator=generator)
        state[f"{name}.bias"] = torch.zeros(shape[0])
    for i, channels in enumerate((64, 192, 384, 256, 256)):
        state[f"lin{i}.model.1.weight"] = torch.rand(1, channels, 1, 1, generator=generator)
    save_file(state, str(path))


VGG_CONVOLUTIONS = {  # torchvision's features: index -> (in, out) channels of each 3x3 convolution
    "vgg16": dict(
        zip(
            (0, 2, 5, 7, 10, 12, 14, 17, 19, 21, 24, 26, 28),
            ((3, 64), (64, 64), (64, 128), (128, 128), (128, 256), (256, 256), (256, 256))
            + ((256, 512), (512, 512), (512, 512), (512, 512), (512, 512), (512, 512)),
        )
    ),
    "vgg19": dict(
        zip(
            (0, 2, 5, 7, 10, 12, 14, 16, 19, 21, 23, 25, 28, 30, 32, 34),
            ((3, 64), (64, 64), (64, 128), (128, 128), (128, 256), (256, 256), (256, 256), (256, 256))
            + ((256, 512),)
            + ((512, 512),) * 7,
        )
    ),
}


def random_vgg_weights(path, layout: str, lpips_heads: bool = False, scale: float = 1.0) -> dict:
    """Random weights in torchvision's ``{layout}.features`` layout (``features.{i}.weight`` / ``.bias``;
    He-scaled times ``scale``), with LPIPS' ``lin{i}.model.1.weight`` heads for VGG-16's taps when
    ``lpips_heads``; written to ``path`` (safetensors, or ``torch.save`` for another suffix) and returned."""
    generator = torch.Generator().manual_seed(1)
    state = {}
    for index, (c_in, c_out) in VGG_CONVOLUTIONS[layout].items():
        std = scale * (2 / (9 * c_in)) ** 0.5
        state[f"features.{index}.weight"] = std * torch.randn(c_out, c_in, 3, 3, generator=generator)
        state[f"features.{index}.bias"] = 0.01 * torch.randn(c_out, generator=generator)
    if lpips_heads:
        for i, channels in enumerate((64, 128, 256, 512, 512)):
            state[f"lin{i}.model.1.weight"] = torch.rand(1, channels, 1, 1, generator=generator)
    if str(path).endswith(".safetensors"):
        from safetensors.torch import save_file

        save_file(state, str(path))
    else:
        torch.save(state, path)
    return state
