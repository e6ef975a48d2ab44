"""Resize + centre-crop: the updated intrinsics describe the resampled pixels exactly.

An image whose channels hold each pixel centre's own coordinates (x = j + 0.5, y = i + 0.5) is
resampled; a linear ramp survives bilinear interpolation exactly away from the borders (and
antialiased shrinking nearly so), so each output pixel states which source point it shows. The ray through that output
pixel under the new K must hit the same source point under the old K.
"""

from __future__ import annotations

import pytest
import torch

import hrope
from hrope.nvs.data.scene import Scene
from hrope.nvs.data.transforms import resize_crop, resize_crop_plan, resize_crop_scene


def coordinate_image(size):
    h, w = size
    y, x = torch.meshgrid(
        torch.arange(h, dtype=torch.float64) + 0.5, torch.arange(w, dtype=torch.float64) + 0.5, indexing="ij"
    )
    return torch.stack([x, y, torch.zeros_like(x)])[None]


def random_K(size, seed):
    g = torch.Generator().manual_seed(seed)
    h, w = size
    u = torch.rand(4, generator=g, dtype=torch.float64)
    return torch.tensor(
        [[w * (0.6 + u[0]), 0, w * (0.4 + 0.2 * u[2])], [0, h * (0.6 + u[1]), h * (0.4 + 0.2 * u[3])], [0, 0, 1]],
        dtype=torch.float64,
    )[None]


@pytest.mark.parametrize(
    "source, target",
    [((48, 64), (20, 20)), ((12, 16), (20, 20)), ((48, 64), (24, 48)), ((45, 65), (25, 35)), ((60, 40), (23, 20))],
)
def test_resize_crop_intrinsics_are_exact(source, target):
    K = random_K(source, seed=sum(source) + sum(target))
    image, K_new = resize_crop(coordinate_image(source), K, target)
    assert tuple(image.shape[-2:]) == target
    (Hr, Wr), _, _ = resize_crop_plan(source, target)
    margin = int(2 * max(source[0] / Hr, source[1] / Wr)) + 2  # where the filter is not truncated
    h, w = target
    y, x = torch.meshgrid(
        torch.arange(h, dtype=torch.float64) + 0.5, torch.arange(w, dtype=torch.float64) + 0.5, indexing="ij"
    )
    # normalised camera ray of each output pixel centre, then its pixel in the source image
    ray_x = (x - K_new[0, 0, 2]) / K_new[0, 0, 0]
    ray_y = (y - K_new[0, 1, 2]) / K_new[0, 1, 1]
    src_x, src_y = K[0, 0, 0] * ray_x + K[0, 0, 2], K[0, 1, 1] * ray_y + K[0, 1, 2]
    inside = (src_x > margin) & (src_x < source[1] - margin) & (src_y > margin) & (src_y < source[0] - margin)
    assert inside.sum() >= 4
    # plain bilinear (enlarging) is exact; the antialiasing filter used when shrinking is a
    # triangle sampled at the source pixels, whose discrete first moment is not exactly zero,
    # which moves content by under a tenth of a source pixel (a half-pixel error would be 0.5)
    atol = 1e-9 if Hr >= source[0] and Wr >= source[1] else 0.1  # PIL shows the same 0.075 px
    torch.testing.assert_close(image[0, 0][inside], src_x[inside], atol=atol, rtol=0)
    torch.testing.assert_close(image[0, 1][inside], src_y[inside], atol=atol, rtol=0)


def test_resize_crop_plan_covers_target_and_centres_crop():
    assert resize_crop_plan((360, 640), (256, 256)) == ((256, 455), 0, 99)
    assert resize_crop_plan((100, 50), (20, 20)) == ((40, 20), 10, 0)
    assert resize_crop_plan((8, 8), (8, 8)) == ((8, 8), 0, 0)


def test_resize_crop_scene_resamples_geometry_nearest():
    size, target = (12, 16), (6, 6)
    K = random_K(size, 7)
    world_to_cam = torch.eye(4, dtype=torch.float64)[None, None]
    ramp = coordinate_image(size)[0]
    scene = Scene(
        images=torch.rand(1, 3, *size),
        cameras=hrope.Cameras(K[None], world_to_cam, size),
        depth=ramp[0][None].float(),
        normals=ramp[None].float(),
    )
    out = resize_crop_scene(scene, target)
    assert out.image_size == target and out.cameras.image_size == target and out.depth.shape == (1, *target)
    K_new = out.cameras.K[0, 0]
    x = torch.arange(target[1], dtype=torch.float64) + 0.5
    src_x = K[0, 0, 0] * (x - K_new[0, 2]) / K_new[0, 0] + K[0, 0, 2]
    # nearest neighbour: the value of the source pixel containing the mapped point
    assert (out.depth[0, 0].double() - src_x).abs().max() <= 0.5 + 1e-5
    assert torch.equal(out.normals[:, 0], out.depth)
    assert resize_crop_scene(scene, size) is scene
