"""`load_scene`: detect a scene folder's format and load it; sources of many scenes by kind.

Detected formats, in this order: ``transforms.json`` (nerfstudio / DL3DV / instant-ngp), a COLMAP
text model (``sparse/0``, ``sparse`` or ``cameras.txt`` + ``images.txt`` in the folder), LLFF
``poses_bounds.npy``, Objaverse renderings (``000.npy`` + ``000.png``, ...: Zero123 / EscherNet).
Every reader picks the image folder (``images/`` or the downsampled ``images_N/``; ``image_factor``
chooses), skips listed frames whose image is absent with one warning, and attaches each frame's
lens model, which decoding removes unless ``undistort=False``.
"""

from __future__ import annotations

import logging
from pathlib import Path

from ...config import ConfigError
from ..scene import Scene, SceneError
from .co3d import CO3DSource
from .colmap import find_colmap_model, read_colmap_frames
from .frames import Frame, frames_to_scene
from .image_cache import ImageCache, default_cache_dir
from .llff import read_llff_frames
from .nerfstudio import read_transforms_json
from .objaverse import read_objaverse_frames
from .re10k import RealEstate10KSource
from .source import SceneSource
from .undistort import without_distortion

__all__ = ["detect_format", "scene_frames", "load_scene", "SceneFolderSource", "SOURCE_KINDS", "make_source",
           "source_options"]

logger = logging.getLogger("hrope.nvs.data")

_LOOKED_FOR = ("transforms.json", "sparse/0/cameras.txt + images.txt", "sparse/cameras.txt + images.txt",
               "cameras.txt + images.txt", "poses_bounds.npy", "000.npy + 000.png (Objaverse renderings)")
_FRAMES_KEPT = 64  # scenes whose frames a SceneFolderSource keeps (files are parsed once, not at every step)


def detect_format(folder: str | Path) -> str | None:
    """"nerfstudio", "colmap", "llff", "objaverse" or None for a scene folder."""
    folder = Path(folder)
    if (folder / "transforms.json").is_file():
        return "nerfstudio"
    if find_colmap_model(folder) is not None:
        return "colmap"
    if (folder / "poses_bounds.npy").is_file():
        return "llff"
    if (folder / "000.npy").is_file():
        return "objaverse"
    return None


def scene_frames(path: str | Path, *, image_factor: int | None = None, undistort: bool = True) -> list[Frame]:
    """The frames (cameras converted, images not yet decoded) of the scene at ``path``.

    ``path`` is a scene folder (format detected, see the module doc) or a ``transforms.json``.
    ``image_factor`` N reads ``images_N/`` (``images/`` for 1; default: ``images/`` if present, else
    the smallest ``images_N/``). ``undistort=False`` drops the lens models with a warning.
    """
    path = Path(path)
    kind = "nerfstudio" if path.is_file() and path.suffix == ".json" else None
    if kind is None and not path.is_dir():
        raise SceneError(f"{path}: no such scene folder")
    kind = kind or detect_format(path)
    if kind is None:
        found = sorted(p.name for p in path.iterdir())[:10]
        raise SceneError(f"{path}: no known scene format; looked for {', '.join(_LOOKED_FOR)} "
                         f"(COLMAP .bin models: convert with 'colmap model_converter --output_type TXT'); "
                         f"the folder contains {found}")
    if kind == "objaverse" and image_factor is not None:
        raise SceneError(f"{path}: image_factor picks an images_N/ folder; Objaverse renderings have none")
    if kind == "nerfstudio":
        frames = read_transforms_json(path if path.is_file() else path / "transforms.json", image_factor)
    elif kind == "colmap":
        frames = read_colmap_frames(path, image_factor=image_factor)
    elif kind == "llff":
        frames = read_llff_frames(path, image_factor)
    else:
        frames = read_objaverse_frames(path)
    return frames if undistort else without_distortion(frames, str(path))


def load_scene(path: str | Path, image_size: tuple[int, int] | None = None, views: list[int] | None = None, *,
               image_factor: int | None = None, undistort: bool = True, cache_dir: str | Path | None = None,
               workers: int = 0) -> Scene:
    """Every view (or ``views``, in that order) of the scene at ``path`` in the project's conventions.

    ``path``, ``image_factor`` and ``undistort`` as in :func:`scene_frames`. With ``image_size (H, W)``
    views are resized + centre-cropped with K updated exactly; otherwise they keep their size (which
    must agree). ``cache_dir``: an :class:`hrope.nvs.data.real.image_cache.ImageCache` folder for the
    decoded views; ``workers`` threads decode them (:func:`hrope.nvs.data.real.frames.frames_to_scene`).
    """
    path = Path(path)
    name = path.parent.name if path.is_file() else path.name
    frames = scene_frames(path, image_factor=image_factor, undistort=undistort)
    cache = None if cache_dir is None else ImageCache(cache_dir)
    return frames_to_scene(frames, name, image_size, views, cache=cache, workers=workers)


class SceneFolderSource(SceneSource):
    """Every sub-folder of ``root`` in a detectable format (e.g. a DL3DV or LLFF collection; the
    others are counted in a warning), or ``root`` itself when it is one scene. ``image_factor`` and
    ``undistort`` as in :func:`scene_frames`; ``options`` as in :class:`hrope.nvs.data.real.source.SceneSource`.
    Each scene's files are parsed once (the last 64 scenes' frames are kept)."""

    def __init__(self, root: str | Path, *, image_factor: int | None = None, undistort: bool = True,
                 **options) -> None:
        super().__init__(**options)
        self.root = Path(root)
        self.image_factor, self.undistort = image_factor, undistort
        self._frames: dict[int, list[Frame]] = {}
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
        if i not in self._frames:
            if len(self._frames) >= _FRAMES_KEPT:
                del self._frames[next(iter(self._frames))]  # the oldest
            self._frames[i] = scene_frames(self.folders[i], image_factor=self.image_factor, undistort=self.undistort)
        return self._frames[i]


SOURCE_KINDS = {"re10k": RealEstate10KSource, "co3d": CO3DSource, "folder": SceneFolderSource,
                "dl3dv": SceneFolderSource, "nerfstudio": SceneFolderSource, "colmap": SceneFolderSource,
                "llff": SceneFolderSource, "objaverse": SceneFolderSource}
"""``--data.kind`` names of the real-data sources; the folder kinds detect each scene's format."""


def make_source(kind: str, root: str | Path, **options) -> SceneSource:
    """The scene source of ``kind`` (a key of :data:`SOURCE_KINDS`) at ``root``; ``options`` go to
    its constructor (``num_views``, ``sampling``, ``image_size``, ...)."""
    if kind not in SOURCE_KINDS:
        raise ValueError(f"unknown data kind {kind!r}; expected one of {sorted(SOURCE_KINDS)}")
    return SOURCE_KINDS[kind](root, **options)


def source_options(data: dict) -> dict:
    """:func:`make_source` options of a run config's ``data`` section: the disk cache of decoded views
    (``data.cache`` on: in ``data.cache_dir``, by default :func:`default_cache_dir`), decoding
    threads (``data.workers``), and for the folder kinds ``data.image_factor`` and ``data.undistort``."""
    options = {"cache_dir": (data["cache_dir"] or default_cache_dir()) if data["cache"] else None,
               "workers": data["workers"]}
    if SOURCE_KINDS[data["kind"]] is SceneFolderSource:
        return {**options, "image_factor": data["image_factor"], "undistort": data["undistort"]}
    if data["image_factor"] is not None:
        folders = sorted(kind for kind, source in SOURCE_KINDS.items() if source is SceneFolderSource)
        raise ConfigError(f"data.image_factor is for the scene-folder kinds ({', '.join(folders)}), not "
                          f"{data['kind']!r}; set it to null")
    return options
