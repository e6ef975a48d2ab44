"""Datasets: the `Scene` type shared by the synthetic generator and the real-data loaders."""

from .scene import Scene, SceneError

__all__ = ["Scene", "SceneError"]
