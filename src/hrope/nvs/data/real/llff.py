"""LLFF scenes (``poses_bounds.npy`` + ``images`` / ``images_N`` folders).

``poses_bounds.npy`` is ``(N, 17)``: a row-major ``3 x 5`` matrix ``[c0 c1 c2 | t | hwf]`` then the
near/far depth bounds (unused here). ``[c0 c1 c2]`` is the **camera-to-world** rotation whose
columns are the camera's **down, right, backward** axes in world coordinates, ``t`` the camera
centre, ``hwf = (H, W, focal)`` in pixels of the full-resolution images.

Conversion to OpenCV (x right, y down, z forward): ``cam_to_world = [c1, c0, -c2 | t]``, then
``world_to_cam = inverse``. ``K = [[f, 0, W/2], [0, f, H/2], [0, 0, 1]]`` for ``(H, W)``, rescaled
to the size of the images actually read (downsampled folders are often rounded). Every row's
``H``, ``W`` (whole) and ``focal`` must be positive finite numbers. Image files are the
``.jpg/.jpeg/.png`` files of one image folder sorted by name, one per row: ``images_N/`` for
``image_factor`` N (``images/`` for 1; LLFF's ``factor``), by default ``images/`` when it exists,
else the smallest ``images_N/`` present (the scenes as commonly downloaded ship only
``images_8/``, or ``images_4/`` and ``images_8/``).

Object masks (NeRD's real captures ship them): a ``masks_N/`` folder beside the ``images_N/`` read
(``masks/`` beside ``images/``) holds one mask image per image, matched by file stem, with or
without a ``_mask`` suffix (``IMG_0001.jpg`` <-> ``IMG_0001.png`` or ``IMG_0001_mask.png``, both
found in NeRD's captures); each frame then carries its mask (``Frame.mask``, read with
``masks=True``: :mod:`hrope.nvs.data.real.view_maps`). An image without its mask, or with two, is an
error naming the folder.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ....geometry import invert_se3
from ..scene import Scene, SceneError
from .frames import Frame, frames_to_scene, image_folder, positive_number

__all__ = ["read_llff_poses", "read_llff_frames", "load_llff"]

_IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png"}


def read_llff_poses(path: str | Path) -> tuple[torch.Tensor, torch.Tensor, tuple[int, int]]:
    """``(K (N, 3, 3), world_to_cam (N, 4, 4), (H, W))`` in float64 from ``poses_bounds.npy``."""
    path = Path(path)
    try:
        array = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as error:
        raise SceneError(f"{path}: cannot read: {error}") from error
    if not isinstance(array, np.ndarray) or array.dtype.kind not in "iuf":
        raise SceneError(f"{path}: expected a numeric .npy array, got {getattr(array, 'dtype', type(array).__name__)}")
    if array.ndim != 2 or array.shape[1] != 17 or len(array) == 0:
        raise SceneError(f"{path}: expected an (N, 17) array, got shape {array.shape}")
    poses = torch.from_numpy(array[:, :15].astype(np.float64)).reshape(-1, 3, 5)
    for i, hwf in enumerate(poses[:, :, 4].tolist()):
        for value, field, whole in zip(hwf, ("hwf H", "hwf W", "hwf focal"), (True, True, False)):
            positive_number(value, f"{path} row {i}", field, whole=whole)
    height, width, focal = poses[:, :, 4].unbind(-1)
    if not (height == height[0]).all() or not (width == width[0]).all():
        raise SceneError(f"{path}: field hwf has different image sizes across rows")
    cam_to_world = torch.zeros(len(poses), 4, 4, dtype=torch.float64)
    cam_to_world[:, :3, 0] = poses[:, :, 1]
    cam_to_world[:, :3, 1] = poses[:, :, 0]
    cam_to_world[:, :3, 2] = -poses[:, :, 2]
    cam_to_world[:, :3, 3] = poses[:, :, 3]
    cam_to_world[:, 3, 3] = 1.0
    K = torch.zeros(len(poses), 3, 3, dtype=torch.float64)
    K[:, 0, 0] = K[:, 1, 1] = focal
    K[:, 0, 2], K[:, 1, 2], K[:, 2, 2] = width / 2, height / 2, 1.0
    return K, invert_se3(cam_to_world), (int(height[0]), int(width[0]))


def read_llff_frames(folder: str | Path, image_factor: int | None = None) -> list[Frame]:
    """Frames of an LLFF folder; images from :func:`hrope.nvs.data.real.frames.image_folder` (module doc)."""
    folder = Path(folder)
    K, world_to_cam, size = read_llff_poses(folder / "poses_bounds.npy")
    image_dir = image_folder(folder, image_factor)
    files = sorted(p for p in image_dir.iterdir() if p.suffix.lower() in _IMAGE_SUFFIXES)
    if len(files) != len(K):
        raise SceneError(f"{image_dir}: {len(files)} images but poses_bounds.npy has {len(K)} rows")
    masks = _masks(files, folder / image_dir.name.replace("images", "masks", 1))
    return [
        Frame(file, K[i], world_to_cam[i], size, f"{folder / 'poses_bounds.npy'} row {i} ({file.name})", mask=mask)
        for i, (file, mask) in enumerate(zip(files, masks))
    ]


def _masks(files: list[Path], mask_dir: Path) -> list[Path | None]:
    """The mask of each image file in ``mask_dir``, matched by stem (module doc); all None without the folder."""
    if not mask_dir.is_dir():
        return [None] * len(files)
    by_stem: dict[str, list[Path]] = {}
    for path in sorted(p for p in mask_dir.iterdir() if p.suffix.lower() in _IMAGE_SUFFIXES):
        by_stem.setdefault(path.stem, []).append(path)
    masks = []
    for file in files:
        found = by_stem.get(file.stem, []) + by_stem.get(f"{file.stem}_mask", [])
        if len(found) > 1:
            raise SceneError(
                f"{mask_dir}: {len(found)} masks for image {file.name}: {', '.join(p.name for p in found)}"
            )
        masks.append(found[0] if found else None)
    missing = [file.name for file, mask in zip(files, masks) if mask is None]
    if missing:
        raise SceneError(
            f"{mask_dir}: no mask for {len(missing)} of {len(files)} images (first: {missing[0]}; masks are "
            "matched by file stem, with or without a _mask suffix)"
        )
    return masks


def load_llff(
    folder: str | Path,
    image_size: tuple[int, int] | None = None,
    views: list[int] | None = None,
    image_factor: int | None = None,
) -> Scene:
    """A :class:`Scene` from an LLFF folder (:func:`read_llff_frames`)."""
    return frames_to_scene(read_llff_frames(folder, image_factor), Path(folder).name, image_size, views)
