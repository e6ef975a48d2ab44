"""Real-data loaders: each format's files converted at the boundary into the project's conventions.

Layers, each importing only those before it: :mod:`.undistort` (lens models) and
:mod:`.image_cache` (decoded views on disk); :mod:`.frames` (:class:`~.frames.Frame`, one posed
image, and its decoding into a :class:`hrope.nvs.data.Scene`); the format readers
:mod:`.nerfstudio`, :mod:`.colmap` (+ :mod:`.colmap_binary`, the binary files' records, and
:mod:`.colmap_points`, SfM points), :mod:`.llff`, :mod:`.objaverse`, :mod:`.idr` (IDR / NeuS /
MonoSDF ``cameras.npz``) and :mod:`.stereo` (rectified stereo pairs cut into posed scenes);
:mod:`.view_maps` (object masks and monocular priors) and :mod:`.depth_maps` (a scene's depth from
points or maps); :mod:`.source` (:class:`~.source.SceneSource`, a collection of scenes) and the
collections :mod:`.re10k` and :mod:`.co3d`; :mod:`.loaders`, the registry of loaders (detection,
:func:`~.loaders.load_scene`, :func:`~.loaders.make_source`); :mod:`.summary` (``hrope info
CAPTURE``). The public names are exported by :mod:`hrope.nvs.data`.
"""
