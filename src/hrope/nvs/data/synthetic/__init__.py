"""The synthetic generator: procedural scenes of textured planar quads with exact geometry.

Layers, each importing only those before it: :mod:`.config` (:class:`SyntheticConfig`, every
range drawn from), :mod:`.textures` (procedural and photographic mip-mapped textures),
:mod:`.render` (exact homography rendering of quads), :mod:`.layouts` (room and object quads),
:mod:`.trajectories` (camera paths and intrinsics), :mod:`.generator` (:func:`make_scene`) and
:mod:`.preview` (``python -m hrope.nvs.data.synthetic.preview``). Random draws come from
:class:`hrope.nvs.data.rng.Rng` streams keyed by ``(seed, index)``.
"""

from .config import SyntheticConfig
from .generator import KINDS, default_frames, make_scene, scene_setup, texture_size_for

__all__ = ["SyntheticConfig", "KINDS", "make_scene", "scene_setup", "default_frames", "texture_size_for"]
