"""Datasets: the `Scene` type, the synthetic generator, real-data loaders and dataset wrappers."""

from .batch import SceneBatch, collate_scenes
from .co3d import CO3DSource, read_frame_annotations
from .colmap import load_colmap, read_colmap_frames
from .dataset import SceneDataset, SyntheticDataset, sample_views
from .frames import Frame, frames_to_scene, read_image, select_frames
from .llff import load_llff, read_llff_frames
from .load import SOURCE_KINDS, SceneFolderSource, detect_format, load_scene, make_source, scene_frames
from .nerfstudio import load_transforms_json, read_transforms_json
from .normalize import normalize_scene
from .re10k import RealEstate10KSource, read_chunk, read_evaluation_index
from .scene import Scene, SceneError, patch_planes
from .source import SceneSource
from .synthetic import SyntheticConfig, make_scene
from .transforms import crop_intrinsics, resize_crop, resize_crop_plan, resize_crop_scene, scale_intrinsics

__all__ = [
    # scenes and batches
    "Scene", "SceneError", "patch_planes", "SceneBatch", "collate_scenes", "normalize_scene",
    # synthetic scenes and dataset wrappers
    "SyntheticConfig", "make_scene", "SceneDataset", "SyntheticDataset", "sample_views",
    # real-data loaders
    "SceneSource", "SceneFolderSource", "SOURCE_KINDS", "make_source", "detect_format", "load_scene",
    "scene_frames", "Frame", "frames_to_scene", "read_image", "select_frames",
    "load_transforms_json", "read_transforms_json", "load_colmap", "read_colmap_frames", "load_llff",
    "read_llff_frames", "RealEstate10KSource", "read_chunk", "read_evaluation_index", "CO3DSource",
    "read_frame_annotations",
    # resize / crop with exact intrinsics
    "crop_intrinsics", "resize_crop", "resize_crop_plan", "resize_crop_scene", "scale_intrinsics",
]
