"""Datasets: the `Scene` type, the synthetic generator, real-data loaders and dataset wrappers.

Three levels, imports pointing down only: the shared pieces (:mod:`.scene`, the `Scene` type;
:mod:`.transforms`, resize and crop with exact intrinsics; :mod:`.normalize`; :mod:`.batch`;
:mod:`.rng`, keyed random streams); the two floors on them, :mod:`.synthetic` (the generator) and
:mod:`.real` (the loaders), which never import each other; and :mod:`.dataset`, the dataset
wrappers over either.
"""

from .batch import SceneBatch, collate_scenes
from .dataset import SceneDataset, SyntheticDataset, sample_views
from .normalize import normalize_scene
from .real.co3d import CO3DSource, read_frame_annotations
from .real.colmap import load_colmap, read_colmap_frames
from .real.frames import Frame, frames_to_scene, read_image, select_frames
from .real.llff import load_llff, read_llff_frames
from .real.loaders import LOADERS, Loader, SceneFolderSource, detect_format, load_scene, make_source, scene_frames
from .real.nerfstudio import load_transforms_json, read_transforms_json
from .real.re10k import RealEstate10KSource, read_chunk, read_evaluation_index
from .real.source import SceneSource
from .real.stereo import StereoPair, StereoWindow, read_middlebury, stereo_windows, window_scene
from .scene import Scene, SceneError, patch_planes
from .synthetic import SyntheticConfig, make_scene
from .transforms import crop_intrinsics, resize_crop, resize_crop_plan, resize_crop_scene, scale_intrinsics

__all__ = [
    # scenes and batches
    "Scene",
    "SceneError",
    "patch_planes",
    "SceneBatch",
    "collate_scenes",
    "normalize_scene",
    # synthetic scenes and dataset wrappers
    "SyntheticConfig",
    "make_scene",
    "SceneDataset",
    "SyntheticDataset",
    "sample_views",
    # real-data loaders
    "SceneSource",
    "SceneFolderSource",
    "Loader",
    "LOADERS",
    "make_source",
    "detect_format",
    "load_scene",
    "scene_frames",
    "Frame",
    "frames_to_scene",
    "read_image",
    "select_frames",
    "load_transforms_json",
    "read_transforms_json",
    "load_colmap",
    "read_colmap_frames",
    "load_llff",
    "read_llff_frames",
    "RealEstate10KSource",
    "read_chunk",
    "read_evaluation_index",
    "CO3DSource",
    "read_frame_annotations",
    "StereoPair",
    "StereoWindow",
    "read_middlebury",
    "stereo_windows",
    "window_scene",
    # resize / crop with exact intrinsics
    "crop_intrinsics",
    "resize_crop",
    "resize_crop_plan",
    "resize_crop_scene",
    "scale_intrinsics",
]
