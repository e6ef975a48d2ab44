"""``hrope info CAPTURE``: what the loaders read from a scene folder, to check a capture before training.

:func:`capture_summary` gives the facts as a JSON-able dict, :func:`summary_report` as text: the
format (the ``data.kind`` that detects it), the frames and their image files (sizes from the files'
headers: nothing is decoded), the intrinsics in pixels of the images read, the lens models, the
cameras (how far their centres spread, and the point nearest every optical axis with the angles
between each camera's axis and the direction to it: a few degrees for an inward-facing capture whose
axes were read right, near 180 for one read backwards), and what the frames carry besides their
images: object masks, monocular priors (relative depth, normals), depth / normal maps, COLMAP
points. A folder in no known format, or a malformed file, raises the loaders' one-line SceneError.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from .frames import Frame, _intrinsics
from .images import read_image_size
from .loaders import detect_format, scene_frames

__all__ = ["capture_summary", "summary_report"]

_CARRIED = {  # Frame field -> what the report calls it
    "mask": "object masks",
    "depth_prior": "relative depth priors (scale and shift unknown)",
    "normal_prior": "normal priors (camera frame)",
    "depth_map": "depth maps",
    "normal_map": "normal maps",
}


def _where(path: Path, folder: Path) -> str:
    """``path``'s folder relative to the scene ``folder`` (``.`` for the folder itself), with a slash."""
    return os.path.relpath(path.parent, folder).replace(os.sep, "/") + "/"


def _axes(world_to_cam: torch.Tensor) -> dict[str, Any] | None:
    """The point nearest every optical axis (least squares) and the angles to it; None when the axes
    are parallel (or there is one camera)."""
    cam_to_world = torch.linalg.inv(world_to_cam)
    centres, forward = cam_to_world[:, :3, 3], cam_to_world[:, :3, 2]
    projectors = torch.eye(3, dtype=torch.float64) - forward[:, :, None] * forward[:, None, :]
    A, b = projectors.sum(0), (projectors @ centres[:, :, None]).sum(0)[:, 0]
    if torch.linalg.eigvalsh(A)[0] <= 1e-9 * len(centres):
        return None
    point = torch.linalg.solve(A, b)
    to_point = point - centres
    cosine = ((to_point * forward).sum(1) / to_point.norm(dim=1).clamp_min(1e-300)).clamp(-1, 1)
    angles = torch.rad2deg(torch.arccos(cosine))
    return {
        "point": [round(float(x), 4) + 0.0 for x in point],  # + 0.0: no -0.0
        "median_angle_deg": round(float(angles.median()), 3),
        "max_angle_deg": round(float(angles.max()), 3),
        "median_distance": round(float(to_point.norm(dim=1).median()), 4),
    }


def _carried(frames: list[Frame], folder: Path) -> dict[str, Any]:
    """Per optional file of a frame: how many frames have one, and where the first is."""
    facts: dict[str, Any] = {}
    for field in _CARRIED:
        paths = [getattr(frame, field) for frame in frames if getattr(frame, field) is not None]
        facts[field] = {"frames": len(paths), "where": _where(paths[0], folder) + paths[0].name} if paths else None
    points = next((frame.tracks[0] for frame in frames if frame.tracks is not None), None)
    facts["colmap_points"] = _where(points, folder) + points.name if points and points.is_file() else None
    return facts


def capture_summary(path: str | Path, *, image_factor: int | None = None) -> dict[str, Any]:
    """The facts of the scene folder at ``path`` (module doc); ``image_factor`` as in
    :func:`hrope.nvs.data.real.loaders.scene_frames`."""
    path = Path(path)
    frames = scene_frames(path, image_factor=image_factor)
    folder = path.parent if path.is_file() else path  # a transforms.json, or a scene folder
    sizes = [read_image_size(frame.image, frame.label) for frame in frames]
    K = torch.stack([_intrinsics(frame, size) for frame, size in zip(frames, sizes)]).double()
    world_to_cam = torch.stack([frame.world_to_cam for frame in frames]).double()
    centres = torch.linalg.inv(world_to_cam)[:, :3, 3]
    first = frames[0].image
    return {
        "path": str(path),
        "format": "nerfstudio" if path.is_file() else detect_format(folder),
        "frames": len(frames),
        "images": {
            "where": _where(first, folder) if isinstance(first, Path) else "in memory",
            "sizes": sorted({tuple(size) for size in sizes}),
        },
        "intrinsics": {
            name: [round(float(values.min()), 4), round(float(values.max()), 4)]
            for name, values in zip(("fx", "fy", "cx", "cy"), (K[:, 0, 0], K[:, 1, 1], K[:, 0, 2], K[:, 1, 2]))
        },
        "lens": sorted({"pinhole" if frame.distortion is None else frame.distortion.model for frame in frames}),
        "centre_spread": round(float((centres - centres.mean(0)).norm(dim=1).max()), 4),
        "optical_axes": _axes(world_to_cam),
        "carried": _carried(frames, folder),
    }


def _range(values: list[float]) -> str:
    low, high = (f"{value:g}" for value in values)
    return low if low == high else f"{low}..{high}"


def summary_report(facts: dict[str, Any]) -> str:
    """:func:`capture_summary`'s facts as the text ``hrope info CAPTURE`` prints."""
    sizes = ", ".join(f"{h}x{w}" for h, w in facts["images"]["sizes"])
    intrinsics = ", ".join(f"{name} {_range(values)}" for name, values in facts["intrinsics"].items())
    axes = facts["optical_axes"]
    axes_line = (
        "parallel (a forward-facing capture)"
        if axes is None
        else f"nearest common point {tuple(axes['point'])}: {axes['median_angle_deg']:g} deg off it (median; max "
        f"{axes['max_angle_deg']:g}), at median distance {axes['median_distance']:g}"
    )
    lines = [
        f"capture {facts['path']}",
        f"format: {facts['format']}",
        f"frames: {facts['frames']} (images in {facts['images']['where']}, HxW {sizes})",
        f"intrinsics (pixels of the images read): {intrinsics}",
        f"lens: {', '.join(facts['lens'])}",
        f"camera centres: within {facts['centre_spread']:g} of their mean",
        f"optical axes: {axes_line}",
    ]
    carried = facts["carried"]
    for field, name in _CARRIED.items():
        entry = carried[field]
        if entry is not None:
            lines.append(f"{name}: {entry['frames']} of {facts['frames']} frames ({entry['where']}, ...)")
    if carried["colmap_points"] is not None:
        lines.append(f"COLMAP points: {carried['colmap_points']}")
    if all(entry is None for entry in carried.values()):
        lines.append("carried besides the images: nothing (no masks, priors, depth maps or points)")
    return "\n".join(lines) + "\n"
