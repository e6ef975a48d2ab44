"""COLMAP's binary model files (``cameras.bin``, ``images.bin``, ``points3D.bin``): the records as written.

COLMAP's default output. The layout (COLMAP's ``reconstruction_io`` writers and its
``read_write_model.py``), every number little-endian:

- ``cameras.bin``: ``uint64`` count, then per camera ``uint32 CAMERA_ID``, ``int32 MODEL_ID``,
  ``uint64 WIDTH``, ``uint64 HEIGHT`` and the model's PARAMS as ``float64`` (how many: :data:`MODEL_IDS`).
- ``images.bin``: ``uint64`` count, then per image ``uint32 IMAGE_ID``, ``float64 QW QX QY QZ TX TY TZ``,
  ``uint32 CAMERA_ID``, the NAME as UTF-8 bytes ended by a NUL byte, a ``uint64`` count of 2D points
  and per point ``float64 X``, ``float64 Y``, ``int64 POINT3D_ID`` (-1, i.e. ``2^64 - 1``: none).
- ``points3D.bin``: ``uint64`` count, then per point ``int64 POINT3D_ID``, ``float64 X Y Z``,
  ``uint8 R G B``, ``float64 ERROR``, a ``uint64`` track length and per track element ``uint32
  IMAGE_ID``, ``uint32 POINT2D_IDX``.

A file that cannot be read, ends inside a record, holds bytes after its last record, names an
unknown MODEL_ID or a NAME that is not UTF-8 is a one-line :class:`SceneError` naming the file, the
record (0-based) and the field. The values are checked where they become cameras
(:mod:`hrope.nvs.data.real.colmap`) and points (:mod:`hrope.nvs.data.real.colmap_points`).
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ..scene import SceneError

__all__ = ["MODEL_IDS", "CameraRecord", "ImageRecord", "read_cameras_bin", "read_images_bin", "read_points3d_bin"]

MODEL_IDS = {
    0: ("SIMPLE_PINHOLE", 3),
    1: ("PINHOLE", 4),
    2: ("SIMPLE_RADIAL", 4),
    3: ("RADIAL", 5),
    4: ("OPENCV", 8),
    5: ("OPENCV_FISHEYE", 8),
    6: ("FULL_OPENCV", 12),
    7: ("FOV", 5),
    8: ("SIMPLE_RADIAL_FISHEYE", 4),
    9: ("RADIAL_FISHEYE", 5),
    10: ("THIN_PRISM_FISHEYE", 12),
    11: ("RAD_TAN_THIN_PRISM_FISHEYE", 16),
}
"""COLMAP's camera MODEL_ID -> (model name, number of PARAMS)."""

_POINT2D = np.dtype([("x", "<f8"), ("y", "<f8"), ("point3d_id", "<i8")])
_TRACK_ELEMENT = 8  # uint32 IMAGE_ID + uint32 POINT2D_IDX
_POINT_RECORD = 51  # the fewest bytes of a points3D.bin record (an empty track)


class CameraRecord(NamedTuple):
    """One camera of ``cameras.bin``; ``where`` names the file and record."""

    camera_id: int
    model: str
    width: int
    height: int
    params: tuple[float, ...]
    where: str


class ImageRecord(NamedTuple):
    """One image of ``images.bin``: ``pose`` is ``(QW, QX, QY, QZ, TX, TY, TZ)``, ``point3d_ids``
    the POINT3D_ID of each of its 2D points (int64, -1: none)."""

    image_id: int
    pose: tuple[float, ...]
    camera_id: int
    name: str
    point3d_ids: np.ndarray
    where: str


class _Bytes:
    """A model file's bytes read front to back; every read names the record and field it is for."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self.data = path.read_bytes()
        except OSError as error:
            raise SceneError(f"{path}: cannot read: {error}") from error
        self.offset = 0

    def _need(self, size: int, what: str) -> int:
        start = self.offset
        if start + size > len(self.data):
            raise SceneError(
                f"{self.path}: the file ends inside {what} ({len(self.data)} bytes; {size} needed from byte "
                f"{start}): truncated?"
            )
        self.offset += size
        return start

    def numbers(self, layout: str, what: str) -> tuple:
        layout = "<" + layout
        return struct.unpack_from(layout, self.data, self._need(struct.calcsize(layout), what))

    def array(self, dtype: np.dtype, count: int, what: str) -> np.ndarray:
        start = self._need(count * dtype.itemsize, what)
        return np.frombuffer(self.data, dtype=dtype, count=count, offset=start)

    def name(self, what: str) -> str:
        end = self.data.find(b"\0", self.offset)
        if end < 0:
            raise SceneError(f"{self.path}: the file ends inside {what} (no NUL byte ends it): truncated?")
        raw = self.data[self.offset : end]
        self.offset = end + 1
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise SceneError(f"{self.path}: {what} is not UTF-8 text: {raw[:40]!r}") from error

    def count(self, what: str) -> int:
        return self.numbers("Q", f"the count of {what}")[0]

    def finish(self, count: int, what: str) -> None:
        if self.offset != len(self.data):
            raise SceneError(
                f"{self.path}: {len(self.data) - self.offset} bytes follow the last of its {count} {what} "
                "(a count edited, or not a COLMAP model?)"
            )


def read_cameras_bin(path: str | Path) -> list[CameraRecord]:
    """The cameras of a ``cameras.bin`` file, in file order (module doc)."""
    file = _Bytes(Path(path))
    records = []
    for k in range(file.count("cameras")):
        where = f"{file.path} record {k}"
        camera_id, model_id, width, height = file.numbers("IiQQ", f"record {k} (CAMERA_ID MODEL_ID WIDTH HEIGHT)")
        if model_id not in MODEL_IDS:
            raise SceneError(
                f"{where}: field MODEL_ID {model_id} is no COLMAP camera model (known: 0 to {len(MODEL_IDS) - 1})"
            )
        model, count = MODEL_IDS[model_id]
        params = file.numbers(f"{count}d", f"record {k} (the {count} PARAMS of {model})")
        records.append(CameraRecord(camera_id, model, width, height, params, where))
    file.finish(len(records), "cameras")
    return records


def read_images_bin(path: str | Path) -> list[ImageRecord]:
    """The images of an ``images.bin`` file, in file order (module doc)."""
    file = _Bytes(Path(path))
    records = []
    for k in range(file.count("images")):
        image_id, *pose, camera_id = file.numbers("I7dI", f"record {k} (IMAGE_ID QW QX QY QZ TX TY TZ CAMERA_ID)")
        name = file.name(f"record {k} (NAME)")
        count = file.numbers("Q", f"record {k} (the count of POINTS2D)")[0]
        points = file.array(_POINT2D, count, f"record {k} (its {count} POINTS2D)")
        where = f"{file.path} record {k}"
        records.append(ImageRecord(image_id, tuple(pose), camera_id, name, points["point3d_id"].copy(), where))
    file.finish(len(records), "images")
    return records


def read_points3d_bin(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """``(POINT3D_IDs (M,) int64, X Y Z (M, 3) float64)`` of a ``points3D.bin`` file, in file order
    (colours, errors and tracks are skipped)."""
    file = _Bytes(Path(path))
    count = file.count("points")
    ids = np.zeros(min(count, len(file.data) // _POINT_RECORD), dtype=np.int64)  # a count beyond the file fails
    xyz = np.zeros((len(ids), 3), dtype=np.float64)
    for k in range(count):
        point_id, *point = file.numbers("q3d3Bd", f"record {k} (POINT3D_ID X Y Z R G B ERROR)")[:4]
        track = file.numbers("Q", f"record {k} (its track length)")[0]
        file.array(np.dtype(np.uint8), track * _TRACK_ELEMENT, f"record {k} (its track of {track} elements)")
        ids[k], xyz[k] = point_id, point
    file.finish(count, "points")
    return ids[:count], xyz[:count]
