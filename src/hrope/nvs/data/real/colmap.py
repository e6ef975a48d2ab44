"""COLMAP models: text (``cameras.txt`` + ``images.txt``) or binary (``cameras.bin`` + ``images.bin``).

``cameras.txt`` lines: ``CAMERA_ID MODEL WIDTH HEIGHT PARAMS...`` with PINHOLE ``fx fy cx cy`` and
SIMPLE_PINHOLE ``f cx cy``; the distorted models SIMPLE_RADIAL, RADIAL, OPENCV, FULL_OPENCV,
OPENCV_FISHEYE, RADIAL_FISHEYE and SIMPLE_RADIAL_FISHEYE (their PARAMS in :data:`_MODELS`) are
undistorted to pinhole images with the same ``fx fy cx cy`` (:mod:`hrope.nvs.data.real.undistort`);
other models (FOV, THIN_PRISM_FISHEYE, ...) are an error naming the line.
``images.txt``: per image a line ``IMAGE_ID QW QX QY QZ TX TY TZ CAMERA_ID NAME``, recognised by
its content, then optionally its POINTS2D line (``x y POINT3D_ID`` triples, possibly empty; kept
unparsed). The ``# Number of cameras/images: N`` header COLMAP writes, when present, must match
what the file holds (a truncated file is an error, never fewer frames); every WIDTH, HEIGHT,
focal length and principal point must be a positive finite number (sizes whole).
``(q, t)`` is already **world-to-camera** with OpenCV axes:
``X_cam = R(q) X_world + t``, ``R(q)`` the rotation of the (normalised) Hamilton quaternion.
COLMAP's pixel convention (centre of the top-left pixel at (0.5, 0.5)) is the project's, so no
shift is applied. Images are ``IMAGE_DIR/NAME``, ordered by NAME; ``IMAGE_DIR`` is ``images/`` next
to the model, else the smallest downsampled ``images_N/`` there is (``image_factor`` N chooses
one), else the scene folder itself; K is rescaled to the decoded size. Images whose file is absent
are skipped with one warning that counts them.

Binary models (COLMAP's default output; :mod:`hrope.nvs.data.real.colmap_binary` reads their
records) hold the same fields and go through the same checks, their errors naming
``file record k`` (0-based) where the text's name ``file:line``; a folder holding both reads the
text model. A model folder is ``.``, ``sparse/0`` or ``sparse``, in that order.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch

from ....geometry import make_se3
from ..scene import Scene, SceneError
from .colmap_binary import read_cameras_bin, read_images_bin
from .frames import Frame, frames_to_scene, image_file_exists, image_folder, pinhole, positive_number, report_missing
from .undistort import Distortion, finite_number, make_distortion

__all__ = [
    "quaternion_to_rotation",
    "ColmapCamera",
    "read_colmap_cameras",
    "ColmapImage",
    "read_colmap_images",
    "model_suffix",
    "find_colmap_model",
    "read_colmap_frames",
    "load_colmap",
]

# model -> its PARAMS in COLMAP's order (f: one focal length for x and y; SIMPLE_RADIAL's k is k1)
_MODELS = {
    "SIMPLE_PINHOLE": ("f", "cx", "cy"),
    "PINHOLE": ("fx", "fy", "cx", "cy"),
    "SIMPLE_RADIAL": ("f", "cx", "cy", "k1"),
    "RADIAL": ("f", "cx", "cy", "k1", "k2"),
    "OPENCV": ("fx", "fy", "cx", "cy", "k1", "k2", "p1", "p2"),
    "FULL_OPENCV": ("fx", "fy", "cx", "cy", "k1", "k2", "p1", "p2", "k3", "k4", "k5", "k6"),
    "OPENCV_FISHEYE": ("fx", "fy", "cx", "cy", "k1", "k2", "k3", "k4"),
    "SIMPLE_RADIAL_FISHEYE": ("f", "cx", "cy", "k1"),
    "RADIAL_FISHEYE": ("f", "cx", "cy", "k1", "k2"),
}
_FISHEYE = {"OPENCV_FISHEYE", "SIMPLE_RADIAL_FISHEYE", "RADIAL_FISHEYE"}


def quaternion_to_rotation(q: torch.Tensor) -> torch.Tensor:
    """Rotation matrices ``(..., 3, 3)`` of quaternions ``(..., 4)`` ordered ``(w, x, y, z)``."""
    w, x, y, z = (q / q.norm(dim=-1, keepdim=True)).unbind(-1)
    rows = [
        [1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
        [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
        [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)],
    ]
    return torch.stack([torch.stack(row, -1) for row in rows], -2)


def _read_model_file(path: Path, what: str) -> tuple[list[tuple[int, str]], int | None]:
    """``(line number, text)`` of every non-comment line (blank lines kept), and the count of
    ``what`` its header declares (COLMAP writes ``# Number of cameras: N``); None without one."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as error:
        raise SceneError(f"{path}: cannot read: {error}") from error
    lines, declared = [], None
    for n, line in enumerate(text.splitlines(), 1):
        if not line.startswith("#"):
            lines.append((n, line.strip()))
        elif match := re.match(rf"#\s*Number of {what}:\s*(\d+)", line):
            declared = int(match[1])
    return lines, declared


def _check_count(path: Path, what: str, declared: int | None, found: int) -> None:
    if declared is not None and declared != found:
        raise SceneError(f"{path}: the header declares {declared} {what}, the file has {found} (truncated or edited?)")


def _floats(tokens: list[str], where: str, field: str) -> list[float]:
    try:
        return [float(token) for token in tokens]
    except ValueError as error:
        raise SceneError(f"{where}: field {field} is not numeric: {' '.join(tokens)!r}") from error


def _integer(token: str, where: str, field: str) -> int:
    try:
        return int(token)
    except ValueError as error:
        raise SceneError(f"{where}: field {field} must be an integer, got {token!r}") from error


class ColmapCamera(NamedTuple):
    """A camera of ``cameras.txt``: ``K`` (3, 3) float64 pixels of an image of ``size`` (H, W), and
    its lens ``distortion`` (None: pinhole)."""

    K: torch.Tensor
    size: tuple[int, int]
    distortion: Distortion | None


def _camera(model: str, width: object, height: object, params: Sequence, where: str) -> ColmapCamera:
    """The camera of one ``cameras`` entry (its PARAMS as numbers or numeric text), its values checked."""
    if model not in _MODELS:
        raise SceneError(f"{where}: camera model {model} is not supported (use one of {sorted(_MODELS)})")
    names = _MODELS[model]
    if len(params) != len(names):
        raise SceneError(f"{where}: {model} needs {len(names)} PARAMS ({', '.join(names)}), got {len(params)}")
    named = dict(zip(names, params))
    focal = ("f", "f") if "f" in named else ("fx", "fy")
    fx, fy, cx, cy = (positive_number(named[name], where, f"PARAMS {name}") for name in (*focal, "cx", "cy"))
    lens = {name: finite_number(value, where, f"PARAMS {name}") for name, value in named.items() if name[0] in "kp"}
    distortion = make_distortion("fisheye" if model in _FISHEYE else "opencv", lens, model, where)
    size = (
        positive_number(height, where, "HEIGHT", whole=True),
        positive_number(width, where, "WIDTH", whole=True),
    )
    return ColmapCamera(pinhole(fx, fy, cx, cy), size, distortion)


def read_colmap_cameras(path: str | Path) -> dict[int, ColmapCamera]:
    """``camera_id -> ColmapCamera`` from ``cameras.txt`` or ``cameras.bin``."""
    path, cameras = Path(path), {}
    if path.suffix == ".bin":
        for record in read_cameras_bin(path):
            cameras[record.camera_id] = _camera(record.model, record.width, record.height, record.params, record.where)
        return cameras
    lines, declared = _read_model_file(path, "cameras")
    for n, line in lines:
        if not line:
            continue
        tokens, where = line.split(), f"{path}:{n}"
        if len(tokens) < 4:
            raise SceneError(f"{where}: expected 'CAMERA_ID MODEL WIDTH HEIGHT PARAMS...', got {line!r}")
        if tokens[1] in _MODELS:
            _floats(tokens[4:], where, "PARAMS")
        cameras[_integer(tokens[0], where, "CAMERA_ID")] = _camera(tokens[1], tokens[2], tokens[3], tokens[4:], where)
    _check_count(path, "cameras", declared, len(cameras))
    return cameras


@dataclass
class ColmapImage:
    """One image of ``images.txt`` / ``images.bin``; ``where`` is ``file:line`` / ``file record k``,
    ``points2d`` its POINTS2D: the line as written (``x y POINT3D_ID`` triples, unparsed; empty when
    the line is empty or absent), or the POINT3D_IDs (int64) of a binary model."""

    image_id: int
    name: str
    world_to_cam: torch.Tensor
    camera_id: int
    where: str
    points2d: str | torch.Tensor = ""


def _parses(kind: type, *tokens: str) -> bool:
    try:
        for token in tokens:
            kind(token)
    except ValueError:
        return False
    return True


def _reads_as_points(tokens: list[str]) -> bool:
    """Whether a line split with ``maxsplit=9`` starts like POINTS2D (``x y POINT3D_ID``, a number as
    tenth token) rather than like an image line (whose tenth token starts the NAME)."""
    tenth = tokens[9].split(maxsplit=1)[:1] if len(tokens) == 10 else []
    return len(tokens) >= 3 and _parses(float, tokens[0], tokens[1], *tenth) and _parses(int, tokens[2])


def _pose(values: list[float], where: str) -> torch.Tensor:
    """World-to-camera ``(4, 4)`` of ``QW QX QY QZ TX TY TZ``."""
    pose = torch.tensor(values, dtype=torch.float64)
    if pose[:4].norm() == 0:
        raise SceneError(f"{where}: field QW QX QY QZ is a zero quaternion")
    return make_se3(quaternion_to_rotation(pose[:4]), pose[4:])


def _parse_image(tokens: list[str], where: str) -> ColmapImage:
    if len(tokens) < 10:
        raise SceneError(f"{where}: expected 'IMAGE_ID QW QX QY QZ TX TY TZ CAMERA_ID NAME', got {' '.join(tokens)!r}")
    world_to_cam = _pose(_floats(tokens[1:8], where, "QW QX QY QZ TX TY TZ"), where)
    return ColmapImage(
        _integer(tokens[0], where, "IMAGE_ID"), tokens[9], world_to_cam, _integer(tokens[8], where, "CAMERA_ID"), where
    )


def _binary_images(path: Path) -> list[ColmapImage]:
    images: list[ColmapImage] = []
    seen: dict[int, int] = {}  # image id: its record
    for k, record in enumerate(read_images_bin(path)):
        if record.image_id in seen:
            raise SceneError(
                f"{record.where}: field IMAGE_ID {record.image_id} repeats that of record {seen[record.image_id]}"
            )
        seen[record.image_id] = k
        world_to_cam = _pose(list(record.pose), record.where)
        ids = torch.from_numpy(record.point3d_ids)
        images.append(ColmapImage(record.image_id, record.name, world_to_cam, record.camera_id, record.where, ids))
    return sorted(images, key=lambda image: image.name)


def read_colmap_images(path: str | Path) -> list[ColmapImage]:
    """The images of ``images.txt`` or ``images.bin``, by name.

    An image line is recognised by its content; the POINTS2D line after it is optional (empty,
    missing, or ``x y POINT3D_ID`` triples), so a missing one loses no frame.
    """
    path = Path(path)
    if path.suffix == ".bin":
        return _binary_images(path)
    lines, declared = _read_model_file(path, "images")
    images: list[ColmapImage] = []
    seen: dict[int, int] = {}  # image id: its line number
    previous: ColmapImage | None = None  # the image whose POINTS2D line may come next
    for n, line in lines:
        tokens = line.split(maxsplit=9)
        if previous is not None and (not tokens or _reads_as_points(tokens)):
            previous.points2d, previous = line, None
        elif tokens:
            previous = _parse_image(tokens, f"{path}:{n}")
            if previous.image_id in seen:
                raise SceneError(
                    f"{previous.where}: field IMAGE_ID {previous.image_id} repeats that of line "
                    f"{seen[previous.image_id]}"
                )
            seen[previous.image_id] = n
            images.append(previous)
    _check_count(path, "images", declared, len(images))
    return sorted(images, key=lambda image: image.name)


def model_suffix(model: Path) -> str | None:
    """``".txt"`` when ``model`` holds ``cameras.txt`` + ``images.txt``, else ``".bin"`` when it holds
    ``cameras.bin`` + ``images.bin``, else None."""
    for suffix in (".txt", ".bin"):
        if (model / f"cameras{suffix}").is_file() and (model / f"images{suffix}").is_file():
            return suffix
    return None


def find_colmap_model(folder: str | Path) -> Path | None:
    """The folder holding a COLMAP text or binary model (:func:`model_suffix`): ``folder``,
    ``folder/sparse/0`` or ``folder/sparse``; None when there is none."""
    folder = Path(folder)
    return next((c for c in (folder, folder / "sparse" / "0", folder / "sparse") if model_suffix(c)), None)


def read_colmap_frames(
    folder: str | Path, image_dir: str | Path | None = None, image_factor: int | None = None
) -> list[Frame]:
    """Frames of the COLMAP text or binary model in ``folder`` (:func:`find_colmap_model`), by image name.

    Images are read from ``image_dir``; by default from :func:`hrope.nvs.data.real.frames.image_folder`
    of ``folder`` (``images_{image_factor}/``; without a factor ``images/``, else the smallest
    ``images_N/``, else ``folder``). Listed images whose file is absent are skipped (one warning).
    """
    folder = Path(folder)
    model = find_colmap_model(folder)
    suffix = None if model is None else model_suffix(model)
    if model is None or suffix is None:
        raise SceneError(
            f"{folder}: no COLMAP model (cameras.txt + images.txt, or cameras.bin + images.bin, in ., sparse/0 "
            "or sparse)"
        )
    if image_dir is None:
        image_dir = image_folder(folder, image_factor, fallback=folder)
    cameras = read_colmap_cameras(model / f"cameras{suffix}")
    images = read_colmap_images(model / f"images{suffix}")
    frames, missing = [], []
    for image in images:
        if image.camera_id not in cameras:
            raise SceneError(f"{image.where}: field CAMERA_ID {image.camera_id} is not in {model / f'cameras{suffix}'}")
        camera, path = cameras[image.camera_id], Path(image_dir) / image.name
        if not image_file_exists(path):
            missing.append(path)
            continue
        frames.append(
            Frame(
                path,
                camera.K,
                image.world_to_cam,
                camera.size,
                image.where,
                tracks=(model / f"points3D{suffix}", image.points2d),
                distortion=camera.distortion,
            )
        )
    report_missing(str(model / f"images{suffix}"), missing, len(images))
    return frames


def load_colmap(
    folder: str | Path,
    image_size: tuple[int, int] | None = None,
    views: list[int] | None = None,
    image_dir: str | Path | None = None,
    image_factor: int | None = None,
) -> Scene:
    """A :class:`Scene` from a COLMAP text or binary model (:func:`read_colmap_frames`)."""
    return frames_to_scene(read_colmap_frames(folder, image_dir, image_factor), Path(folder).name, image_size, views)
