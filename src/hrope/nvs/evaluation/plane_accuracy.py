"""How accurate predicted planes are, where the data has ground-truth planes.

For a model whose encoding takes planes (``"planes"`` among ``model.source.specs``) with a
``learned`` or ``backbone`` source (:func:`measures_planes`), and a batch with ground truth
(``batch.planes(patch_size)`` not None), every patch of every view is scored against its true
plane, both in the token's camera frame at the patch-centre ray r̂:

- ``normal_error_deg``: the angle between the predicted and the true unit normal, both taken
  facing the camera (so the sign of m does not matter): ``atan2(|n̂ × n|, |n̂ · n|)``, in
  [0°, 90°]. A predicted plane at infinity (m = 0) has no normal and counts as 90°.
- ``depth_rel_error``: ``min(|ẑ − z| / z, 1)`` with z = 1 / (m · r̂) the z-depth where the plane
  crosses the patch-centre ray; saturated at 1 per patch, so a predicted plane at infinity or one
  crossing the ray behind the camera counts as fully wrong (and an over-far one at most that).
- ``*_neutral``: the same for the neutral planes, what a zero raw head output decodes to through
  the model's own plane :class:`~hrope.nvs.sources.ParameterSpec` (``hrope-lift``: the plane at
  infinity, so 90° and 1; ``hrope`` / ``hrope-pf``: fronto-parallel at ``depth_init``).

Patches whose true plane is undefined (m = 0: no valid depth) or does not cross the patch-centre
ray in front of the camera are left out. Predictions come from the last layer (``per_layer``
adds every layer's two prediction errors for the per-layer ``learned`` source). Errors are
averaged over a scene's patches, separately for ``context`` and ``target`` views, then over
scenes. A context view appears in the folded sequence of every target (:meth:`LVSM.fold_cameras`)
and, with the learned source, gets a prediction in each: its errors are averaged over all of them.
A per-head source (``predictor_options.per_head``) is scored head by head and averaged over heads.

Training appends the batch means of logged steps to ``<run>/plane_accuracy.jsonl``
(:func:`append_log`, :func:`read_log`); ``hrope viz plane-accuracy`` draws them.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import Tensor

from ...cameras import Cameras
from ...planes import Planes
from ..running.atomic import append_line
from ..sources import fold_heads, unfold_heads

__all__ = [
    "GROUPS",
    "METRICS",
    "LOG_NAME",
    "measures_planes",
    "scene_errors",
    "PlaneAccuracy",
    "plane_accuracy",
    "append_log",
    "read_log",
]

GROUPS = ("context", "target")
METRICS = ("normal_error_deg", "normal_error_deg_neutral", "depth_rel_error", "depth_rel_error_neutral")
LOG_NAME = "plane_accuracy.jsonl"
MEASURED_SOURCES = ("learned", "backbone")
UNDEFINED_NORMAL_DEG = 90.0  # a predicted plane at infinity: no normal, no information
MAX_DEPTH_ERROR = 1.0


def measures_planes(model) -> bool:
    """Whether ``model`` predicts planes that can be scored: a plane encoding with a learned or
    backbone source (oracle planes are the ground truth; external ones are fitted to the data)."""
    return (
        model.source is not None
        and model.config.predictor in MEASURED_SOURCES
        and any(s.name == "planes" for s in model.source.specs)
    )


def _plane_errors(m: Tensor, truth: tuple[Tensor, Tensor], cameras: Cameras, grid) -> tuple[Tensor, Tensor]:
    """Per-patch ``(normal error in degrees, relative depth error)`` ``(B', N)`` of plane vectors
    ``m (B', N, 3)`` against the true ``(normal (B', N, 3), z-depth (B', N))``."""
    normal, depth = Planes.from_m(m).normal_and_depth(cameras, grid)
    true_normal, true_depth = truth
    angle = torch.atan2(torch.linalg.cross(normal, true_normal).norm(dim=-1), (normal * true_normal).sum(-1).abs())
    angle = torch.where(m.norm(dim=-1) > 0, angle.rad2deg(), UNDEFINED_NORMAL_DEG)
    return angle, ((depth - true_depth).abs() / true_depth).clamp(max=MAX_DEPTH_ERROR)


def scene_errors(parameters: list[dict[str, Tensor]], batch, model) -> dict[tuple, Tensor] | None:
    """Per-scene mean errors of one forward pass; None unless :func:`measures_planes` and the batch
    has ground-truth planes.

    ``parameters``: ``LVSMOutput.parameters`` (``"planes"``: m ``(B*Vt, (Vc+1)*P, 3)`` per entry, or
    ``(B*Vt, (Vc+1)*P, heads, 3)`` from a per-head source: errors are then averaged over heads) of
    ``batch``, the :class:`~hrope.nvs.data.SceneBatch` it came from. Returns ``{(group, metric): (B,)}``
    for the 4 :data:`METRICS` and, with several entries (per-layer source), ``{("per_layer", group,
    metric): (L, B)}`` for the two prediction errors; NaN for a scene without a valid patch in a group.
    """
    config = model.config
    truth = batch.planes(config.patch_size) if measures_planes(model) else None
    if truth is None:
        return None
    grid, Vc = config.grid, int(batch.num_context)
    B, V = batch.images.shape[:2]
    with torch.no_grad():
        cameras = model.fold_cameras(batch.cameras, Vc).to(dtype=torch.float32)
        true_m = model.fold_tokens(truth.m(batch.cameras, grid, torch.float32), Vc, V)
        true_planes = Planes.from_m(true_m).normal_and_depth(cameras, grid)
        valid = (torch.isfinite(true_planes[1]) & (true_planes[1] > 0)).reshape(B, V - Vc, Vc + 1, -1)
        views = {"context": slice(None, Vc), "target": slice(Vc, None)}
        counts = {group: valid[:, :, view].sum((1, 2, 3)) for group, view in views.items()}

        def per_scene(error: Tensor) -> dict[str, Tensor]:  # (B*Vt, (Vc+1)*P) -> {group: (B,)}
            error = torch.where(valid, error.reshape(valid.shape), 0.0)
            return {group: error[:, :, view].sum((1, 2, 3)) / counts[group] for group, view in views.items()}

        spec = next(s for s in model.source.specs if s.name == "planes")
        neutral_m = spec.decode(true_m.new_zeros(*true_m.shape[:2], spec.raw_dim), cameras, grid)
        heads = model.source.attention_heads
        if heads > 1:
            head_cameras = cameras.repeat_batch(heads)
            head_truth = (true_planes[0].repeat_interleave(heads, 0), true_planes[1].repeat_interleave(heads, 0))

        def predicted_errors(m: Tensor) -> tuple[Tensor, Tensor]:  # per-head m (B', N, heads, 3): mean over heads
            if heads == 1:
                return _plane_errors(m, true_planes, cameras, grid)
            normal, depth = _plane_errors(fold_heads(m), head_truth, head_cameras, grid)
            return unfold_heads(normal, heads).mean(-1), unfold_heads(depth, heads).mean(-1)

        # per entry: (normal error, depth error)
        layers = [predicted_errors(values["planes"].detach().float()) for values in parameters]
        neutral = _plane_errors(neutral_m, true_planes, cameras, grid)
        maps = {
            "normal_error_deg": layers[-1][0],
            "normal_error_deg_neutral": neutral[0],
            "depth_rel_error": layers[-1][1],
            "depth_rel_error_neutral": neutral[1],
        }
        errors: dict[tuple, Tensor] = {
            (group, metric): value for metric, error in maps.items() for group, value in per_scene(error).items()
        }
        if len(layers) > 1:
            for index, metric in enumerate(("normal_error_deg", "depth_rel_error")):
                stacked = [per_scene(layer[index]) for layer in layers]
                errors.update(
                    {("per_layer", group, metric): torch.stack([s[group] for s in stacked]) for group in GROUPS}
                )
    return errors


class PlaneAccuracy:
    """Scene-weighted means of :func:`scene_errors` over batches: ``add`` each forward pass, then
    ``means``."""

    def __init__(self) -> None:
        self._values: dict[tuple, list[Tensor]] = {}

    def add(self, parameters: list[dict[str, Tensor]], batch, model) -> PlaneAccuracy:
        """Add the scenes of one forward pass (nothing when :func:`scene_errors` gives None)."""
        for key, value in (scene_errors(parameters, batch, model) or {}).items():
            self._values.setdefault(key, []).append(value.cpu())
        return self

    def means(self) -> dict | None:
        """``{"context": {metric: float}, "target": {...}}`` (+ ``"per_layer": {group: {metric:
        [float per layer]}}``), or None when no scene was added. Scenes without a valid patch in a
        group are skipped there (NaN when none has one)."""
        if not self._values:
            return None
        out: dict = {}
        for (*path, metric), values in self._values.items():
            mean = torch.cat(values, dim=-1).nanmean(-1)
            node = out
            for part in path:
                node = node.setdefault(part, {})
            node[metric] = mean.tolist() if mean.ndim else float(mean)
        return out


def plane_accuracy(parameters: list[dict[str, Tensor]], batch, model) -> dict | None:
    """:meth:`PlaneAccuracy.means` of one forward pass (``LVSMOutput.parameters`` of ``batch``)."""
    return PlaneAccuracy().add(parameters, batch, model).means()


def append_log(path: str | Path, step: int, accuracy: dict) -> None:
    """Append ``{"step": step, **accuracy}`` as one JSON line to ``path``."""
    append_line(path, json.dumps({"step": step, **accuracy}))


def read_log(path: str | Path) -> list[dict]:
    """The records of a :func:`append_log` file by step; a step logged twice (a run resumed from
    an earlier checkpoint logs it again) keeps its last record; a last line without its newline (the
    writer was killed during it) is left out."""
    records = {}
    lines = Path(path).read_text().split("\n")[:-1]  # a killed writer's last line has no newline
    for line in lines:
        if line.strip():
            record = json.loads(line)
            records[record["step"]] = record
    return [records[step] for step in sorted(records)]
