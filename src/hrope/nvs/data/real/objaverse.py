"""Objaverse object renderings in the Zero123 / EscherNet layout: one folder per object.

Layout (Zero123's ``objaverse-rendering/scripts/blender_script.py``; EscherNet trains on the same
``views_release`` renderings): ``000.png, 001.png, ...`` (512x512 RGBA, transparent background)
with ``000.npy, 001.npy, ...``, each a 3x4 float matrix ``[R | t]`` written by that script's
``get_3x4_RT_matrix_from_blender``: ``R`` is the transpose of the Blender camera's world rotation
and ``t = -R @ location``, i.e. **world-to-camera in Blender camera axes** (x right, y up, z
backward; the script's Blender-to-OpenCV rotation is commented out, so none is applied). A 4x4
matrix with the bottom row ``0 0 0 1`` is accepted too.

Intrinsics are not stored: the script renders with a 35 mm lens on a 32 mm sensor at 512x512, so
``fx = fy = 35 / 32 * 512 = 560`` and ``cx = cy = 256`` (a 49.1 degree field of view; EscherNet's
dataset uses these numbers), rescaled to the PNGs' actual size. The object is scaled to a unit
bounding box centred at the world origin, and every camera tracks the origin from 1.5 to 2.2 units.

Conversion: ``world_to_cam = diag(1, -1, -1) @ [R | t]`` (Blender to OpenCV camera axes); images are
composited over white, as both projects do. Convention check: every camera must have the world
origin (the object's centre) in front of it, else a :class:`SceneError` (matrices already in
OpenCV axes, or camera-to-world ones, fail it); an origin that projects outside a view logs a
warning. Camera files without their PNG are skipped with one warning that counts them.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch

from ..scene import SceneError
from .frames import Frame, image_file_exists, pinhole, report_missing
from .images import WHITE

__all__ = ["ZERO123_SIZE", "ZERO123_FOCAL", "BLENDER_TO_OPENCV", "read_objaverse_frames"]

logger = logging.getLogger("hrope.nvs.data")

ZERO123_SIZE = 512
ZERO123_FOCAL = 35 / 32 * ZERO123_SIZE  # 560 pixels
BLENDER_TO_OPENCV = torch.diag(torch.tensor([1.0, -1.0, -1.0, 1.0], dtype=torch.float64))
"""Left-multiplying a world-to-camera matrix in Blender camera axes by this gives the OpenCV one."""


def _read_matrix(path: Path) -> torch.Tensor:
    """The ``(4, 4)`` float64 matrix of a ``3x4`` (or ``4x4``) ``.npy`` camera file."""
    try:
        array = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as error:
        raise SceneError(f"{path}: cannot read: {error}") from error
    if not isinstance(array, np.ndarray) or array.dtype.kind not in "iuf" or array.shape not in ((3, 4), (4, 4)):
        raise SceneError(
            f"{path}: expected a numeric 3x4 [R | t] matrix, got {getattr(array, 'dtype', '?')} "
            f"{getattr(array, 'shape', '')}"
        )
    matrix = torch.eye(4, dtype=torch.float64)
    matrix[:3] = torch.from_numpy(array[:3].astype(np.float64))
    if not torch.isfinite(matrix).all() or (len(array) == 4 and array[3].tolist() != [0, 0, 0, 1]):
        raise SceneError(
            f"{path}: expected a finite 3x4 [R | t] matrix (a 4x4 one ending in 0 0 0 1), got {array.tolist()}"
        )
    return matrix


def _check_convention(frames: list[Frame], folder: Path) -> None:
    """Every camera must see the world origin (the object's centre) in front of it (module doc)."""
    behind, outside = [], []
    for frame in frames:
        centre = frame.world_to_cam[:3, 3]  # the origin in camera coordinates
        if centre[2] <= 0:
            behind.append(frame.label)
            continue
        u, v = (frame.K @ centre / centre[2])[:2].tolist()
        if not (0 <= u <= ZERO123_SIZE and 0 <= v <= ZERO123_SIZE):
            outside.append(frame.label)
    if behind:
        raise SceneError(
            f"{folder}: {len(behind)} of {len(frames)} cameras have the object centre behind them (first: "
            f"{behind[0]}); expected Zero123's world-to-camera [R | t] in Blender camera axes (x right, "
            f"y up, z backward), not OpenCV axes or camera-to-world"
        )
    if outside:
        logger.warning(
            "%s: the object centre projects outside %d of %d views (first: %s); Zero123 renderings always look at it",
            folder,
            len(outside),
            len(frames),
            outside[0],
        )


def read_objaverse_frames(folder: str | Path) -> list[Frame]:
    """Frames of a Zero123 / EscherNet object folder, ordered by view number (module doc)."""
    folder = Path(folder)
    cameras = sorted((p for p in folder.glob("*.npy") if p.stem.isdecimal()), key=lambda p: int(p.stem))
    if not cameras:
        raise SceneError(f"{folder}: no camera files 000.npy, 001.npy, ... (Zero123 / EscherNet renderings)")
    K = pinhole(ZERO123_FOCAL, ZERO123_FOCAL, ZERO123_SIZE / 2, ZERO123_SIZE / 2)
    frames, missing = [], []
    for path in cameras:
        image = path.with_suffix(".png")
        if not image_file_exists(image):
            missing.append(image)
            continue
        world_to_cam = BLENDER_TO_OPENCV @ _read_matrix(path)
        frames.append(Frame(image, K, world_to_cam, (ZERO123_SIZE, ZERO123_SIZE), str(path), background=WHITE))
    report_missing(str(folder), missing, len(cameras))
    _check_convention(frames, folder)
    return frames
