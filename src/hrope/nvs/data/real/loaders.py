"""The loader registry: one :class:`Loader` per ``data.kind``; detection, `load_scene` and `make_source` read it.

Scene-folder formats, detected in this order: ``transforms.json`` (nerfstudio / DL3DV / instant-ngp), a
COLMAP text or binary model (``cameras.txt`` + ``images.txt`` or ``cameras.bin`` + ``images.bin`` in
``sparse/0``, ``sparse`` or the folder), LLFF ``poses_bounds.npy`` (with object masks in ``masks_N/``
when present), Objaverse renderings (``000.npy`` + ``000.png``, ...: Zero123 / EscherNet), IDR / NeuS /
MonoSDF ``cameras.npz`` (``cameras_sphere.npz``; MonoSDF's monocular priors beside the images).
Every reader picks the image folder (``images/`` or the downsampled ``images_N/``; ``image_factor``
chooses), skips listed frames whose image is absent with one warning, and attaches each frame's
lens model, which decoding removes unless ``undistort=False``, and its optional object mask and
priors, read with ``masks=True`` / ``priors=True``. Each format's name is also a kind of
many scenes (a :class:`SceneFolderSource`, which detects every scene's format), as are ``folder`` and
``dl3dv``; ``re10k`` and ``co3d`` have sources of their own. Adding a loader is one :data:`LOADERS` entry.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..scene import Scene, SceneError
from .co3d import CO3DSource
from .colmap import find_colmap_model, read_colmap_frames
from .depth_maps import load_frames
from .frames import Frame, drop_repeated_frames
from .idr import find_camera_file, read_idr_frames
from .image_cache import ImageCache
from .llff import read_llff_frames
from .nerfstudio import read_transforms_json
from .objaverse import read_objaverse_frames
from .re10k import RealEstate10KSource
from .source import SceneSource
from .undistort import without_distortion

__all__ = ["Loader", "LOADERS", "detect_format", "scene_frames", "load_scene", "SceneFolderSource", "make_source"]

logger = logging.getLogger("hrope.nvs.data")

_FRAMES_KEPT = 64  # scenes whose frames a SceneFolderSource keeps (files are parsed once, not at every step)


@dataclass(frozen=True)
class Loader:
    """One ``data.kind``: how its scenes are found and read.

    Args:
        name: the ``data.kind``.
        source: the class of its collections of scenes, ``source(root, **options)`` (a :class:`SceneSource`).
        detect: for a scene-folder format, ``detect(folder) -> bool``: whether ``folder`` is one scene in it.
        read_frames: with ``detect``, ``read_frames(path, image_factor) -> list[Frame]`` of that scene.
        looks_for: with ``detect``, what it looks for, as the errors of a folder in no known format list it.
        evaluation_index: whether ``source`` takes an ``evaluation_index`` (``data.eval_index``).
    """

    name: str
    source: Callable[..., SceneSource]
    detect: Callable[[Path], bool] | None = None
    read_frames: Callable[[Path, int | None], list[Frame]] | None = None
    looks_for: tuple[str, ...] = ()
    evaluation_index: bool = False

    @property
    def scene_folders(self) -> bool:
        """Whether the kind is a folder of scene folders (which take ``image_factor``, ``undistort``, ``depth``)."""
        return self.source is SceneFolderSource


def _transforms_json(path: Path, image_factor: int | None) -> list[Frame]:
    return read_transforms_json(path if path.is_file() else path / "transforms.json", image_factor)


def _objaverse(path: Path, image_factor: int | None) -> list[Frame]:
    if image_factor is not None:
        raise SceneError(f"{path}: image_factor picks an images_N/ folder; Objaverse renderings have none")
    return read_objaverse_frames(path)


def _detected(folder: Path) -> Loader | None:
    return next((loader for loader in LOADERS.values() if loader.detect and loader.detect(folder)), None)


def detect_format(folder: str | Path) -> str | None:
    """The name of the scene-folder format of ``folder`` (the first :data:`LOADERS` entry that detects
    it: "nerfstudio", "colmap", "llff", "objaverse" or "idr"), or None."""
    loader = _detected(Path(folder))
    return None if loader is None else loader.name


def _looked_for() -> str:
    return ", ".join(item for loader in LOADERS.values() for item in loader.looks_for)


def scene_frames(path: str | Path, *, image_factor: int | None = None, undistort: bool = True) -> list[Frame]:
    """The frames (cameras converted, images not yet decoded) of the scene at ``path``.

    ``path`` is a scene folder (format detected, see the module doc) or a ``transforms.json``.
    ``image_factor`` N reads ``images_N/`` (``images/`` for 1; default: ``images/`` if present, else
    the smallest ``images_N/``). ``undistort=False`` drops the lens models with a warning. Frames that
    repeat an earlier frame's image and camera are left out with a warning
    (:func:`~hrope.nvs.data.real.frames.drop_repeated_frames`).
    """
    path = Path(path)
    loader = LOADERS["nerfstudio"] if path.is_file() and path.suffix == ".json" else None
    if loader is None and not path.is_dir():
        raise SceneError(f"{path}: no such scene folder")
    loader = loader or _detected(path)
    if loader is None or loader.read_frames is None:
        found = sorted(p.name for p in path.iterdir())[:10]
        raise SceneError(f"{path}: no known scene format; looked for {_looked_for()}; the folder contains {found}")
    frames = drop_repeated_frames(loader.read_frames(path, image_factor), str(path))
    return frames if undistort else without_distortion(frames, str(path))


def load_scene(
    path: str | Path,
    image_size: tuple[int, int] | None = None,
    views: list[int] | None = None,
    *,
    image_factor: int | None = None,
    undistort: bool = True,
    cache_dir: str | Path | None = None,
    workers: int = 0,
    masks: bool = False,
    priors: bool = False,
) -> Scene:
    """Every view (or ``views``, in that order) of the scene at ``path`` in the project's conventions.

    ``path``, ``image_factor`` and ``undistort`` as in :func:`scene_frames`. With ``image_size (H, W)``
    views are resized + centre-cropped with K updated exactly; otherwise they keep their size (which
    must agree). ``cache_dir``: an :class:`hrope.nvs.data.real.image_cache.ImageCache` folder for the
    decoded views; ``workers`` threads decode them (:func:`hrope.nvs.data.real.frames.frames_to_scene`).
    ``masks`` / ``priors``: also read the capture's object masks (``Scene.masks``) / monocular priors
    (``Scene.relative_depth``, ``Scene.normals``; :mod:`hrope.nvs.data.real.view_maps`).
    """
    path = Path(path)
    name = path.parent.name if path.is_file() else path.name
    frames = scene_frames(path, image_factor=image_factor, undistort=undistort)
    cache = None if cache_dir is None else ImageCache(cache_dir)
    return load_frames(frames, name, image_size, views, masks=masks, priors=priors, cache=cache, workers=workers)


class SceneFolderSource(SceneSource):
    """Every sub-folder of ``root`` in a detectable format (e.g. a DL3DV or LLFF collection; the
    others are counted in a warning), or ``root`` itself when it is one scene. ``image_factor`` and
    ``undistort`` as in :func:`scene_frames`; ``options`` as in :class:`hrope.nvs.data.real.source.SceneSource`.
    Each scene's files are parsed once (the last 64 scenes' frames are kept)."""

    def __init__(self, root: str | Path, *, image_factor: int | None = None, undistort: bool = True, **options) -> None:
        super().__init__(**options)
        self.root = Path(root)
        self.image_factor, self.undistort = image_factor, undistort
        self._frames: dict[int, list[Frame]] = {}
        if not self.root.is_dir():
            raise SceneError(f"{self.root}: scene folder not found")
        self.folders: list[Path] = []
        ignored: list[Path] = []
        if detect_format(self.root):
            self.folders.append(self.root)
        else:
            for folder in sorted(p for p in self.root.iterdir() if p.is_dir()):
                (self.folders if detect_format(folder) else ignored).append(folder)
        if self.folders and ignored:
            logger.warning(
                "%s: %d sub-folder(s) in no known scene format left out: %s",
                self.root,
                len(ignored),
                [p.name for p in ignored[:5]],
            )
        if not self.folders:
            raise SceneError(f"{self.root}: no scene folders; each needs one of {_looked_for()}")

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


LOADERS: dict[str, Loader] = {
    loader.name: loader
    for loader in (
        Loader(
            "nerfstudio",
            SceneFolderSource,
            detect=lambda folder: (folder / "transforms.json").is_file(),
            read_frames=_transforms_json,
            looks_for=("transforms.json",),
        ),
        Loader(
            "colmap",
            SceneFolderSource,
            detect=lambda folder: find_colmap_model(folder) is not None,
            read_frames=lambda path, image_factor: read_colmap_frames(path, image_factor=image_factor),
            looks_for=("cameras.txt + images.txt or cameras.bin + images.bin (in sparse/0, sparse or the folder)",),
        ),
        Loader(
            "llff",
            SceneFolderSource,
            detect=lambda folder: (folder / "poses_bounds.npy").is_file(),
            read_frames=read_llff_frames,
            looks_for=("poses_bounds.npy",),
        ),
        Loader(
            "objaverse",
            SceneFolderSource,
            detect=lambda folder: (folder / "000.npy").is_file(),
            read_frames=_objaverse,
            looks_for=("000.npy + 000.png (Objaverse renderings)",),
        ),
        Loader(
            "idr",
            SceneFolderSource,
            detect=lambda folder: find_camera_file(folder) is not None,
            read_frames=read_idr_frames,
            looks_for=("cameras.npz or cameras_sphere.npz (IDR, NeuS, MonoSDF)",),
        ),
        Loader("folder", SceneFolderSource),
        Loader("dl3dv", SceneFolderSource),
        Loader("re10k", RealEstate10KSource, evaluation_index=True),
        Loader("co3d", CO3DSource),
    )
}
"""Every real ``data.kind`` by name; the scene-folder formats first, in the order they are detected."""


def make_source(kind: str, root: str | Path, **options) -> SceneSource:
    """The scene source of ``kind`` (a key of :data:`LOADERS`) at ``root``; ``options`` go to
    its constructor (``num_views``, ``sampling``, ``image_size``, ...)."""
    if kind not in LOADERS:
        raise ValueError(f"unknown data kind {kind!r}; expected one of {sorted(LOADERS)}")
    return LOADERS[kind].source(root, **options)
