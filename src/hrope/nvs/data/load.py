"""`load_scene`: detect a scene folder's format and load it; sources of many scenes by kind.

Detected formats, in this order: ``transforms.json`` (nerfstudio / DL3DV / instant-ngp), a COLMAP
text model (``sparse/0``, ``sparse`` or ``cameras.txt`` + ``images.txt`` in the folder), LLFF
``poses_bounds.npy``.
"""

from __future__ import annotations

import logging
from pathlib import Path

from .co3d import CO3DSource
from .colmap import find_colmap_model, read_colmap_frames
from .frames import Frame, frames_to_scene
from .llff import read_llff_frames
from .nerfstudio import read_transforms_json
from .re10k import RealEstate10KSource
from .scene import Scene, SceneError
from .source import SceneSource

__all__ = ["detect_format", "scene_frames", "load_scene", "SceneFolderSource", "SOURCE_KINDS", "make_source"]

logger = logging.getLogger("hrope.nvs.data")

_LOOKED_FOR = ("transforms.json", "sparse/0/cameras.txt + images.txt", "sparse/cameras.txt + images.txt",
               "cameras.txt + images.txt", "poses_bounds.npy")


def detect_format(folder: str | Path) -> str | None:
    """"nerfstudio", "colmap", "llff" or None for a scene folder."""
    folder = Path(folder)
    if (folder / "transforms.json").is_file():
        return "nerfstudio"
    if find_colmap_model(folder) is not None:
        return "colmap"
    if (folder / "poses_bounds.npy").is_file():
        return "llff"
    return None


def scene_frames(path: str | Path) -> list[Frame]:
    """The frames (cameras converted, images not yet decoded) of the scene at ``path``.

    ``path`` is a scene folder (format detected, see the module doc) or a ``transforms.json``.
    """
    path = Path(path)
    if path.is_file() and path.suffix == ".json":
        return read_transforms_json(path)
    if not path.is_dir():
        raise SceneError(f"{path}: no such scene folder")
    kind = detect_format(path)
    if kind is None:
        found = sorted(p.name for p in path.iterdir())[:10]
        raise SceneError(f"{path}: no known scene format; looked for {', '.join(_LOOKED_FOR)} "
                         f"(COLMAP .bin models: convert with 'colmap model_converter --output_type TXT'); "
                         f"the folder contains {found}")
    if kind == "nerfstudio":
        return read_transforms_json(path / "transforms.json")
    return {"colmap": read_colmap_frames, "llff": read_llff_frames}[kind](path)


def load_scene(path: str | Path, image_size: tuple[int, int] | None = None, views: list[int] | None = None) -> Scene:
    """Every view (or ``views``, in that order) of the scene at ``path`` in the project's conventions.

    ``path`` as in :func:`scene_frames`. With ``image_size (H, W)`` views are resized +
    centre-cropped with K updated exactly; otherwise they keep their size (which must agree).
    """
    path = Path(path)
    name = path.parent.name if path.is_file() else path.name
    return frames_to_scene(scene_frames(path), name, image_size, views)


class SceneFolderSource(SceneSource):
    """Every sub-folder of ``root`` in a detectable format (e.g. a DL3DV or LLFF collection; the
    others are counted in a warning), or ``root`` itself when it is one scene; ``options`` as in
    :class:`hrope.nvs.data.source.SceneSource`."""

    def __init__(self, root: str | Path, **options) -> None:
        super().__init__(**options)
        self.root = Path(root)
        if not self.root.is_dir():
            raise SceneError(f"{self.root}: scene folder not found")
        self.folders, ignored = [], []
        if detect_format(self.root):
            self.folders.append(self.root)
        else:
            for folder in sorted(p for p in self.root.iterdir() if p.is_dir()):
                (self.folders if detect_format(folder) else ignored).append(folder)
        if self.folders and ignored:
            logger.warning("%s: %d sub-folder(s) in no known scene format left out: %s", self.root, len(ignored),
                           [p.name for p in ignored[:5]])
        if not self.folders:
            raise SceneError(f"{self.root}: no scene folders; each needs one of {', '.join(_LOOKED_FOR)}")

    def __len__(self) -> int:
        return len(self.folders)

    def scene_name(self, i: int) -> str:
        return self.folders[i].name

    def describe(self, i: int) -> str:
        return f"scene folder {self.folders[i]}"

    def frames(self, i: int) -> list[Frame]:
        return scene_frames(self.folders[i])


SOURCE_KINDS = {"re10k": RealEstate10KSource, "co3d": CO3DSource, "folder": SceneFolderSource,
                "dl3dv": SceneFolderSource, "nerfstudio": SceneFolderSource, "colmap": SceneFolderSource,
                "llff": SceneFolderSource}
"""``--data.kind`` names of the real-data sources; the folder kinds detect each scene's format."""


def make_source(kind: str, root: str | Path, **options) -> SceneSource:
    """The scene source of ``kind`` (a key of :data:`SOURCE_KINDS`) at ``root``; ``options`` go to
    its constructor (``num_views``, ``sampling``, ``image_size``, ...)."""
    if kind not in SOURCE_KINDS:
        raise ValueError(f"unknown data kind {kind!r}; expected one of {sorted(SOURCE_KINDS)}")
    return SOURCE_KINDS[kind](root, **options)
