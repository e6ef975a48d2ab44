"""The paper's evaluation protocols: standard, views, zoom, extrapolate, baseline.

Public API::

    run_protocol(model_or_checkpoint, protocol, dataset_config=None, *, num_scenes=None,
                 device="cpu", batch_size=None, lpips_weights=None, **options) -> dict

(:func:`hrope.nvs.evaluation.protocol_report.write_results` writes the tables and plots of the results.)

``model_or_checkpoint`` is an :class:`hrope.nvs.model.LVSM` or a checkpoint file / run folder (its
saved config gives the data settings). ``dataset_config`` overrides keys of the ``data`` config
section (e.g. ``{"kind": "re10k", "root": ..., "eval_index": ...}``; with a bare model it is
applied to the defaults). ``options``: ``factors`` (the protocol's axis values, see
:data:`DEFAULT_FACTORS`) and, for ``zoom``, ``zoom_all=False``.

Every protocol starts from one **base plan** per held-out scene, in frame indices of the scene's
video: a context pair ``first < last`` (``gap = last - first`` frames) and 3 targets evenly
spaced strictly between them (RE10K: the evaluation index's context and targets when
``data.eval_index`` is given). Synthetic scenes are 200-frame virtual videos with the kind's
context gap range (rooms 25–100 frames, objects 15–60); real videos use ``data.context_gap`` (any
gap by default). The pair is placed with room for the protocol's largest excursion; a scene whose
video is too short for every point is skipped (``num_skipped``). Per point:

- ``standard``: the base plan (2 context + 3 targets).
- ``views`` (N in 2, 4, 8): the pair plus N - 2 context frames evenly spaced between them (moved
  to the nearest free frame so that no context frame is a target); same targets.
- ``zoom`` (f in 1..5): the base plan; each target image is its centre crop of ``1/f`` of each side
  resized back to full size, with ``fx, fy`` scaled by f about the image centre
  (``c' = f (c - size/2) + size/2``); ``zoom_all=True`` zooms the context views too.
- ``extrapolate`` (a in 0.25, 0.5, 1): the pair; 2 targets ``round(a * gap)`` frames (at least 1)
  before ``first`` and after ``last``.
- ``baseline`` (s in 1, 1.5, 2, 3): the pair widened to ``first - e, last + e`` with
  ``e = round((s - 1) * gap / 2)`` (s times the frame gap); the base plan's targets.

Metrics as :func:`hrope.nvs.evaluation.evaluate.evaluate_model`: per target image, averaged per scene, then over
scenes; every example is normalised as the run's ``data.normalize`` says (by default: first
context camera = world, unit context baseline).

Returned dict::

    {"protocol", "name" (encoding label), "checkpoint" (str or None), "axis" (label of the
     values), "data" ({"kind", "root"}), "num_scenes", "num_skipped", "zoom_all" (zoom only),
     "lpips_net" (eval.lpips_net: the LPIPS column's name), "lpips_backbone" (None when LPIPS
     is unavailable), "points": [{"value", "num_context", "num_target", "num_scenes",
                                   "metrics": {"psnr", "ssim", "lpips" (float or "unavailable")}}]}
"""

from __future__ import annotations

import logging
import math
from dataclasses import replace

import torch
import torch.nn.functional as F

from ...cameras import Cameras
from ..build_data import build_scene_source
from ..config import ConfigError, RunConfig, resolve, synthetic_settings
from ..data.dataset import DEFAULT_CONTEXT_GAP
from ..data.normalize import normalize
from ..data.real.depth_maps import load_frames
from ..data.rng import Rng, stream_seed
from ..data.scene import Scene, SceneError
from ..data.synthetic import KINDS as SYNTHETIC_KINDS
from ..data.synthetic import SyntheticConfig, make_scene
from .evaluate import (
    apply_data_overrides,
    apply_eval_options,
    configured_lpips,
    evaluate_scenes,
    lpips_fields,
    run_name,
)
from ..model import LVSM
from ..pretrained import load_trained

__all__ = [
    "PROTOCOLS",
    "DEFAULT_FACTORS",
    "AXES",
    "NUM_TARGETS",
    "run_protocol",
    "zoom_views",
    "base_plan",
    "protocol_plans",
    "SyntheticVideos",
    "SourceVideos",
    "build_videos",
]

logger = logging.getLogger("hrope.nvs.evaluation.protocols")

PROTOCOLS = ("standard", "views", "zoom", "extrapolate", "baseline")
DEFAULT_FACTORS = {
    "standard": (1,),
    "views": (2, 4, 8),
    "zoom": (1, 2, 3, 4, 5),
    "extrapolate": (0.25, 0.5, 1.0),
    "baseline": (1, 1.5, 2, 3),
}
AXES = {
    "standard": "standard",
    "views": "number of context views",
    "zoom": "target zoom factor",
    "extrapolate": "extrapolation distance (x context gap)",
    "baseline": "context baseline (x gap)",
}
NUM_TARGETS = 3


# ----------------------------------------------------------------------------- videos
class SyntheticVideos:
    """The held-out synthetic scenes of a run (the ``eval`` seed stream), as ``config.num_frames``-frame videos."""

    def __init__(self, kind: str, num_scenes: int, seed: int, config: SyntheticConfig = SyntheticConfig()) -> None:
        if kind not in SYNTHETIC_KINDS:
            raise ConfigError(f"unknown synthetic kind {kind!r}; expected one of {sorted(SYNTHETIC_KINDS)}")
        self.kind, self.count = kind, int(num_scenes)
        self.scene_seed = stream_seed("hrope.synthetic.eval", seed)
        self.context_gap = DEFAULT_CONTEXT_GAP[kind]
        self.config = config
        self.frame_count = config.num_frames

    def __len__(self) -> int:
        return self.count

    def num_frames(self, i: int) -> int:
        return self.frame_count

    def index_views(self, i: int) -> None:
        return None

    def load(self, i: int, frames: list[int], image_size: tuple[int, int]) -> Scene:
        return make_scene(self.scene_seed, i, self.kind, len(frames), image_size, frames=frames, config=self.config)


class SourceVideos:
    """The first ``num_scenes`` (all when None) scenes of a :class:`hrope.nvs.data.SceneSource`."""

    def __init__(self, source, num_scenes: int | None, context_gap: tuple[int, int] | None) -> None:
        self.source = source
        self.count = len(source) if num_scenes is None else min(int(num_scenes), len(source))
        self.context_gap = None if context_gap is None else tuple(context_gap)

    def __len__(self) -> int:
        return self.count

    def num_frames(self, i: int) -> int:
        return self.source.num_frames(i)

    def index_views(self, i: int) -> tuple[list[int], list[int]] | None:
        return getattr(self.source, "evaluation_views", {}).get(self.source.scene_name(i))

    def load(self, i: int, frames: list[int], image_size: tuple[int, int]) -> Scene:
        return load_frames(
            self.source.frames(i),
            self.source.scene_name(i),
            image_size,
            frames,
            self.source.depth,
            self.source.depth_scale,
        )


def build_videos(config: RunConfig):
    """The held-out videos of ``config.data`` (synthetic kinds or a real-data source), ``eval.num_scenes`` of them."""
    data, num_scenes = config.data, config.eval.num_scenes
    if data.kind in SYNTHETIC_KINDS:
        assert num_scenes is not None  # RunConfig: synthetic kinds count their scenes
        return SyntheticVideos(data.kind, num_scenes, data.seed, synthetic_settings(data))
    gap = None if data.context_gap is None else (data.context_gap[0], data.context_gap[1])
    return SourceVideos(build_scene_source(config, "eval"), num_scenes, gap)


# ----------------------------------------------------------------------------- view plans
def base_plan(videos, i: int, seed: int, reserve: float) -> tuple[list[int], list[int]]:
    """``(context, targets)`` frames of scene ``i`` (module doc), leaving ``reserve * gap`` free
    frames on both sides of the context pair. Raises :class:`SceneError` when impossible."""
    n = videos.num_frames(i)
    indexed = videos.index_views(i)
    if indexed is not None:
        return list(indexed[0]), list(indexed[1])
    low, high = videos.context_gap or (NUM_TARGETS + 1, n - 1)
    high = min(high, math.floor((n - 1) / (1 + 2 * reserve)))
    if high < max(low, NUM_TARGETS + 1):
        raise SceneError(
            f"a video of {n} frames is too short for context gaps {videos.context_gap} "
            f"with {reserve:g} x gap free on both sides"
        )
    rng = Rng("hrope.nvs.evaluation.protocols.views", seed, i)
    gap = rng.integer(max(low, NUM_TARGETS + 1), high)
    margin = math.ceil(reserve * gap)
    first = margin + rng.integer(0, n - 1 - gap - 2 * margin)
    last = first + gap
    return [first, last], [round(first + gap * (k + 1) / (NUM_TARGETS + 1)) for k in range(NUM_TARGETS)]


def _spread_context(first: int, last: int, count: int, taken: set[int]) -> list[int]:
    """``count`` context frames from ``first`` to ``last`` (both included), the inner ones evenly
    spaced and moved to the nearest frame not in ``taken``."""
    chosen = [first, last]
    for k in range(1, count - 1):
        ideal = first + (last - first) * k / (count - 1)
        free = [f for f in range(first + 1, last) if f not in taken and f not in chosen]
        if not free:
            raise SceneError(f"no free frame between {first} and {last} for {count} context views")
        chosen.append(min(free, key=lambda f: (abs(f - ideal), f)))
    return sorted(chosen)


def _point_plan(protocol: str, value, context: list[int], targets: list[int]) -> tuple[list[int], list[int]]:
    first, last = min(context), max(context)
    gap = last - first
    if protocol in ("standard", "zoom"):
        return context, targets
    if protocol == "views":
        return _spread_context(first, last, int(value), set(targets)), targets
    if protocol == "extrapolate":
        distance = max(1, round(value * gap))
        return [first, last], [first - distance, last + distance]
    extra = round((value - 1) * gap / 2)  # baseline
    return [first - extra, last + extra], targets


def _reserve(protocol: str, factors) -> float:
    if protocol == "extrapolate":
        return max(factors)
    if protocol == "baseline":
        return max(0.0, (max(factors) - 1) / 2)
    return 0.0


def protocol_plans(videos, protocol: str, factors, seed: int) -> tuple[list[int], list[list[tuple]], int]:
    """``(scenes, plans, num_skipped)``: the usable scene indices and, per factor, their
    ``(context, targets)`` frames. A scene is usable when every factor's frames exist and are distinct."""
    scenes: list[int] = []
    plans: list[list[tuple]] = [[] for _ in factors]
    skipped = 0
    for i in range(len(videos)):
        try:
            context, targets = base_plan(videos, i, seed, _reserve(protocol, factors))
            n = videos.num_frames(i)
            points = [_point_plan(protocol, value, context, targets) for value in factors]
            for c, t in points:
                frames = c + t
                if min(frames) < 0 or max(frames) >= n or len(set(frames)) != len(frames):
                    raise SceneError(f"frames {c} + {t} do not fit a video of {n} distinct frames")
        except SceneError as error:
            skipped += 1
            logger.warning("protocol %s: skipping scene %d (%d skipped so far): %s", protocol, i, skipped, error)
            continue
        scenes.append(i)
        for plan, point in zip(plans, points):
            plan.append(point)
    return scenes, plans, skipped


# ----------------------------------------------------------------------------- zoom
def zoom_views(scene: Scene, factor: float, views: list[int]) -> Scene:
    """``scene`` with ``views`` zoomed ``factor`` x about the image centre.

    The new image is the centre crop of ``1/factor`` of each side resampled to the full size
    (colours and object masks bilinear; geometry maps nearest), i.e. pixel ``x' -> x = (x' - W/2) / factor + W/2``; so
    ``fx' = factor fx`` and ``cx' = factor (cx - W/2) + W/2`` (same for y). Extrinsics unchanged.
    """
    if factor < 1:
        raise ValueError(f"zoom factor must be >= 1, got {factor}")
    if factor == 1 or not views:
        return scene
    views = list(views)
    H, W = scene.image_size
    theta = torch.tensor([[1 / factor, 0.0, 0.0], [0.0, 1 / factor, 0.0]]).expand(len(views), 2, 3)
    grid = F.affine_grid(theta, [len(views), 1, H, W], align_corners=False)

    def warp(x, mode: str):
        if x is None:
            return None
        out = x.clone()
        selected = x[views] if x.ndim == 4 else x[views][:, None]
        warped = F.grid_sample(selected.float(), grid, mode=mode, padding_mode="border", align_corners=False)
        out[views] = warped if x.ndim == 4 else warped[:, 0]
        return out

    K = scene.cameras.K.clone()
    centre = torch.tensor([W / 2, H / 2], dtype=K.dtype)
    K[0, views, :2, :2] *= factor
    K[0, views, :2, 2] = factor * (K[0, views, :2, 2] - centre) + centre
    cameras = Cameras(K, scene.cameras.world_to_cam, (H, W), validate=False)
    return replace(
        scene,
        images=warp(scene.images, "bilinear").clamp(0, 1),
        cameras=cameras,
        depth=warp(scene.depth, "nearest"),
        normals=warp(scene.normals, "nearest"),
        plane_m=warp(scene.plane_m, "nearest"),
        masks=warp(scene.masks, "bilinear"),
        relative_depth=warp(scene.relative_depth, "nearest"),
    )


# ----------------------------------------------------------------------------- running
def _load_model(model_or_checkpoint, dataset_config: dict | None, device: str):
    """``(model, config, checkpoint path or None)`` with the ``data`` overrides applied (a model's
    own config in the default one)."""
    if isinstance(model_or_checkpoint, LVSM):
        model, checkpoint = model_or_checkpoint.to(device), None
        config = replace(resolve(), model=model.config)
    else:
        model, config = load_trained(model_or_checkpoint, device)
        checkpoint = str(model_or_checkpoint)
    return model.eval(), apply_data_overrides(config, dataset_config), checkpoint


def _point_metrics(
    model, videos, scenes, plans, image_size, *, zoom: float, zoom_all: bool, batch_size, lpips, device, normalization
) -> dict:
    """Per-metric means over the scenes of one protocol point (scenes that fail to load are skipped);
    the targets (all views with ``zoom_all``) are zoomed ``zoom`` x; scenes normalised by
    ``normalization`` (``data.normalize``)."""

    def loaded():
        for i, (context, targets) in zip(scenes, plans):
            try:
                scene = videos.load(i, context + targets, image_size)
                scene = zoom_views(scene, zoom, list(range(0 if zoom_all else len(context), scene.num_views)))
            except SceneError as error:
                logger.warning("skipping scene %d: %s", i, error)
                continue
            yield normalize(scene, list(range(len(context))), normalization)

    means, per_scene, _ = evaluate_scenes(
        model, loaded(), len(plans[0][0]), batch_size=batch_size, lpips=lpips, device=device
    )
    return {"num_scenes": len(per_scene["psnr"]), "metrics": means}


def _protocol_options(protocol: str, options: dict) -> tuple[tuple, bool]:
    """``(factors, zoom_all)`` of :func:`run_protocol`'s ``options`` (emptied), checked for ``protocol``."""
    if protocol not in PROTOCOLS:
        raise ConfigError(f"unknown protocol {protocol!r}; available: {', '.join(PROTOCOLS)}")
    zoom_all = bool(options.pop("zoom_all", False))
    factors = tuple(
        int(v) if float(v).is_integer() else float(v)
        for v in (options.pop("factors", None) or DEFAULT_FACTORS[protocol])
    )
    if options:
        raise ConfigError(f"unknown protocol options {sorted(options)} (known: factors, zoom_all)")
    if zoom_all and protocol != "zoom":
        raise ConfigError("zoom_all applies to the zoom protocol only")
    if protocol == "views" and any(int(v) != v or v < 2 for v in factors):
        raise ConfigError(f"views: context counts must be integers >= 2, got {list(factors)}")
    if protocol in ("zoom", "baseline") and min(factors) < 1:
        raise ConfigError(f"{protocol}: factors must be >= 1, got {list(factors)}")
    if protocol == "extrapolate" and min(factors) <= 0:
        raise ConfigError(f"extrapolate: distances must be > 0, got {list(factors)}")
    return factors, zoom_all


def run_protocol(
    model_or_checkpoint,
    protocol: str,
    dataset_config: dict | None = None,
    *,
    num_scenes: int | None = None,
    device: str = "cpu",
    batch_size: int | None = None,
    lpips_weights: str | None = None,
    **options,
) -> dict:
    """Run ``protocol`` (one of :data:`PROTOCOLS`) and return its result dict (module doc).

    ``num_scenes`` defaults to ``eval.num_scenes`` of the run's config (None there = every scene of
    a real-data source); ``batch_size`` to ``eval.batch_size``; ``lpips_weights`` to
    ``eval.lpips_weights`` (LPIPS is "unavailable" without local weights).
    """
    factors, zoom_all = _protocol_options(protocol, options)
    model, config, checkpoint = _load_model(model_or_checkpoint, dataset_config, device)
    evaluation = apply_eval_options(config, num_scenes=num_scenes, batch_size=batch_size, lpips_weights=lpips_weights)
    batch_size = evaluation.eval.batch_size
    lpips = configured_lpips(evaluation, device)
    videos = build_videos(evaluation)
    scenes, plans, skipped = protocol_plans(videos, protocol, factors, config.data.seed)
    if not scenes:
        raise ConfigError(
            f"protocol {protocol}: none of the {len(videos)} scenes can be planned (all too short; see the warnings)"
        )
    size = (model.config.image_size, model.config.image_size)
    points = []
    for value, plan in zip(factors, plans):
        zoom = value if protocol == "zoom" else 1
        result = _point_metrics(
            model,
            videos,
            scenes,
            plan,
            size,
            zoom=zoom,
            zoom_all=zoom_all,
            batch_size=batch_size,
            lpips=lpips,
            device=device,
            normalization=config.data.normalize,
        )
        points.append({"value": value, "num_context": len(plan[0][0]), "num_target": len(plan[0][1]), **result})
    results = {
        "protocol": protocol,
        "name": run_name(config, model),
        "checkpoint": checkpoint,
        "axis": AXES[protocol] + (" (all views)" if zoom_all else ""),
        "data": {"kind": config.data.kind, "root": config.data.root},
        "num_scenes": len(scenes),
        "num_skipped": skipped,
        **lpips_fields(evaluation, lpips),
        "points": points,
    }
    if protocol == "zoom":
        results["zoom_all"] = zoom_all
    return results
