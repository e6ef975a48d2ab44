"""CO3Dv2 sequences from ``<root>/<category>/frame_annotations.jgz``.

The file is a gzip-compressed JSON list of frame annotations with ``sequence_name``,
``frame_number``, ``image.path`` (relative to ``root``), ``image.size = [H, W]`` (positive whole
numbers) and a ``viewpoint`` in PyTorch3D conventions (``focal_length`` positive):

- extrinsics act on **row vectors**: ``X_p3d = X_world @ R + T``, i.e. ``X_p3d = R^T X_world + T``
  for column vectors; the PyTorch3D camera frame has **+x left, +y up, +z forward**;
- NDC projection ``x_ndc = f_x * X_p3d / Z + p_x`` (same for y), NDC +x left, +y up;
- ``intrinsics_format`` "ndc_isotropic" (NDC unit = half the shorter image side:
  ``s_x = s_y = min(H, W) / 2``) or "ndc_norm_image_bounds" (``s_x = W / 2``, ``s_y = H / 2``).

Conversion (pixel coordinates with the image spanning ``[0, W] x [0, H]``, as PyTorch3D's NDC-to-
screen transform): ``fx = f_x s_x``, ``fy = f_y s_y``, ``cx = W/2 - p_x s_x``, ``cy = H/2 - p_y s_y``;
``F = diag(-1, -1, 1)`` turns PyTorch3D camera axes into OpenCV ones, so
``R_cv = F R^T`` and ``t_cv = F T``. Check: ``u = W/2 - s_x x_ndc = cx + fx (-X_p3d)/Z = cx + fx x_cv/z``.
"""

from __future__ import annotations

import gzip
import json
import logging
import zlib
from collections import defaultdict
from pathlib import Path

import torch

from ....geometry import make_se3
from ...config.fields import one_line
from ..scene import SceneError
from .frames import Frame, number_array, pinhole, positive_number
from .source import SceneSource

__all__ = ["PYTORCH3D_TO_OPENCV", "co3d_frame", "read_frame_annotations", "CO3DSource"]

logger = logging.getLogger("hrope.nvs.data")

PYTORCH3D_TO_OPENCV = torch.diag(torch.tensor([-1.0, -1.0, 1.0], dtype=torch.float64))
"""Maps PyTorch3D camera coordinates (x left, y up, z forward) to OpenCV ones."""


def _tensor(viewpoint: dict, field: str, shape: tuple[int, ...], label: str) -> torch.Tensor:
    if field not in viewpoint:
        raise SceneError(f"{label}: field viewpoint.{field} is missing")
    value = number_array(viewpoint[field], label, f"viewpoint.{field}")
    if value.shape != shape:
        raise SceneError(f"{label}: field viewpoint.{field} must have shape {shape}, got {tuple(value.shape)}")
    return value


def co3d_frame(annotation: dict, root: Path, label: str) -> Frame:
    """One CO3D frame annotation converted to a :class:`Frame` (module docstring)."""
    viewpoint, image = annotation.get("viewpoint"), annotation.get("image")
    path, size = (image.get("path"), image.get("size")) if isinstance(image, dict) else (None, None)
    if not (isinstance(viewpoint, dict) and isinstance(path, str) and isinstance(size, list) and len(size) == 2):
        raise SceneError(f"{label}: fields image.path, image.size=[H, W] and viewpoint are required")
    height, width = (positive_number(v, label, f"image.size {axis}", whole=True) for v, axis in zip(size, "HW"))
    R = _tensor(viewpoint, "R", (3, 3), label)
    T = _tensor(viewpoint, "T", (3,), label)
    focal = _tensor(viewpoint, "focal_length", (2,), label)
    for value, axis in zip(focal.tolist(), "xy"):
        positive_number(value, label, f"viewpoint.focal_length {axis}")
    principal = _tensor(viewpoint, "principal_point", (2,), label)
    convention = viewpoint.get("intrinsics_format", "ndc_norm_image_bounds")
    if convention == "ndc_isotropic":
        scale = torch.full((2,), min(height, width) / 2, dtype=torch.float64)
    elif convention == "ndc_norm_image_bounds":
        scale = torch.tensor([width / 2, height / 2], dtype=torch.float64)
    else:
        raise SceneError(f"{label}: field viewpoint.intrinsics_format {convention!r} is unknown")
    fx, fy = (focal * scale).tolist()
    cx, cy = (torch.tensor([width / 2, height / 2], dtype=torch.float64) - principal * scale).tolist()
    world_to_cam = make_se3(PYTORCH3D_TO_OPENCV @ R.T, PYTORCH3D_TO_OPENCV @ T)
    return Frame(root / path, pinhole(fx, fy, cx, cy), world_to_cam, (height, width), label)


def read_frame_annotations(path: str | Path) -> dict[str, list[dict]]:
    """``sequence_name -> frame annotations sorted by frame_number`` from a ``.jgz`` file."""
    path = Path(path)
    try:
        with gzip.open(path, "rt") as file:
            annotations = json.load(file)
    except (OSError, EOFError, ValueError, zlib.error) as error:  # zlib.error: a corrupt stream
        raise SceneError(f"{path}: cannot read gzip JSON: {one_line(error)}") from error
    if not isinstance(annotations, list):
        raise SceneError(f"{path}: expected a JSON list of frame annotations")
    sequences = defaultdict(list)
    for i, annotation in enumerate(annotations):
        if not (
            isinstance(annotation, dict)
            and "sequence_name" in annotation
            and type(annotation.get("frame_number")) is int
        ):
            raise SceneError(f"{path}: entry {i} needs fields sequence_name and frame_number (an integer)")
        sequences[str(annotation["sequence_name"])].append(annotation)
    return {name: sorted(frames, key=lambda a: a["frame_number"]) for name, frames in sequences.items()}


def _warn_missing(root: Path, what: str, requested: list[str], found: set[str]) -> None:
    missing = sorted(set(requested) - found)
    if missing:
        logger.warning(
            "%s: %d of the %d requested %s not found (or unreadable): %s",
            root,
            len(missing),
            len(set(requested)),
            what,
            missing[:5],
        )


class CO3DSource(SceneSource):
    """CO3Dv2 sequences under ``root`` (one scene per sequence, categories sorted, then names).

    ``options`` (``num_views``, ``sampling``, ``max_span``, ``image_size``, ``skip_errors``) work
    as in :class:`hrope.nvs.data.real.source.SceneSource`: e.g. ``num_views=8, sampling="even"`` gives
    fixed evenly spaced views per sequence, ``sampling="random"`` fresh ones at each access.
    Unreadable annotation files are skipped with a counted warning; ``categories`` and
    ``sequences`` optionally restrict to those names (requested names not found are counted in a
    warning).
    """

    def __init__(
        self, root: str | Path, *, categories: list[str] | None = None, sequences: list[str] | None = None, **options
    ) -> None:
        super().__init__(**options)
        self.root = Path(root)
        if not self.root.is_dir():
            raise SceneError(f"{self.root}: CO3D root folder not found")
        files = sorted(self.root.glob("*/frame_annotations.jgz"))
        if categories is not None:
            files = [f for f in files if f.parent.name in set(categories)]
            _warn_missing(self.root, "categories", categories, {f.parent.name for f in files})
        self.sequences: list[tuple[str, Path, list[dict]]] = []
        broken = 0
        for path in files:
            try:
                by_name = read_frame_annotations(path)
            except SceneError as error:
                broken += 1
                logger.warning("skipping %s (%d annotation file(s) skipped so far): %s", path, broken, error)
                continue
            self.sequences += [
                (name, path, by_name[name]) for name in sorted(by_name) if sequences is None or name in sequences
            ]
        if sequences is not None:
            _warn_missing(self.root, "sequences", sequences, {name for name, _, _ in self.sequences})
        if not self.sequences:
            raise SceneError(f"{self.root}: no CO3D sequences (looked for */frame_annotations.jgz)")

    def __len__(self) -> int:
        return len(self.sequences)

    def scene_name(self, i: int) -> str:
        return self.sequences[i][0]

    def describe(self, i: int) -> str:
        name, path, _ = self.sequences[i]
        return f"CO3D sequence {name!r} ({path})"

    def frames(self, i: int) -> list[Frame]:
        name, path, annotations = self.sequences[i]
        return [
            co3d_frame(a, self.root, f"{path} sequence {name!r} frame_number {a['frame_number']}") for a in annotations
        ]
