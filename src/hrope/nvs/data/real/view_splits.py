"""How posed captures are cut into 3-view scenes: splits of views, contexts chosen by viewing direction.

A scene is ``(context a, context b, target)`` of one capture (a :class:`SceneCut`).

- **Splits of a capture's views** (:func:`split_views`, protocol ``views``): view ``i`` is a test
  target when ``i % test_every == 0``, a validation target when ``i % test_every == test_every // 2``,
  and a training view otherwise (``test_every >= 3``, so every split has views).
- **Contexts** (:func:`nearest_views`): the two views nearest the target by the angle between the
  optical axes (+z of the OpenCV cameras), among the capture's **training views** only and never
  the target itself (ties go to the lower index). So validation and test views appear in no
  training scene, neither as target nor as context.
- **Protocols** (:func:`cut_captures`): ``views`` (every capture gives training, validation and test
  targets as above) or ``captures`` (the captures named ``held_out`` give only validation and test
  targets, their contexts from their own training views; every view of the other captures is a
  training view and a training target).

Each cut records its angles in degrees: target to each context, and between the contexts
(:func:`angle_summary` gives min / median / max over a split).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from ...config.schema import CAPTURE_PROTOCOLS
from ..scene import SceneError

__all__ = [
    "PROTOCOLS",
    "CAPTURE_SPLITS",
    "DEFAULT_TEST_EVERY",
    "SceneCut",
    "split_views",
    "capture_views",
    "optical_axes",
    "axis_angles",
    "nearest_views",
    "cut_capture",
    "check_protocol",
    "cut_captures",
    "angle_summary",
]

PROTOCOLS = CAPTURE_PROTOCOLS
CAPTURE_SPLITS = ("train", "val", "eval")  # eval: the test targets
DEFAULT_TEST_EVERY = 8


@dataclass(frozen=True)
class SceneCut:
    """One scene: ``target`` and ``context`` (two view indices) of capture ``capture``; ``angles``
    (degrees): target to ``context[0]``, target to ``context[1]``, between the two contexts."""

    capture: str
    target: int
    context: tuple[int, int]
    angles: tuple[float, float, float]


def split_views(num_views: int, test_every: int = DEFAULT_TEST_EVERY) -> dict[str, list[int]]:
    """``{"train": [...], "val": [...], "eval": [...]}``: the view indices of each split (module doc)."""
    if isinstance(test_every, bool) or not isinstance(test_every, int) or test_every < 3:
        raise SceneError(f"test_every must be an integer >= 3, got {test_every!r}")
    splits: dict[str, list[int]] = {name: [] for name in CAPTURE_SPLITS}
    for i in range(num_views):
        phase = i % test_every
        splits["eval" if phase == 0 else "val" if phase == test_every // 2 else "train"].append(i)
    return splits


def capture_views(
    num_views: int, name: str, protocol: str, held_out: Sequence[str], test_every: int = DEFAULT_TEST_EVERY
) -> dict[str, list[int]]:
    """The targets of each split (``train``, ``val``, ``eval``) of capture ``name`` under ``protocol``
    and its ``context`` views (those every split draws contexts from, the training views; module doc)."""
    if protocol == "captures" and name not in held_out:
        return {"train": list(range(num_views)), "val": [], "eval": [], "context": list(range(num_views))}
    views = split_views(num_views, test_every)
    held = protocol == "captures"
    return {
        "train": [] if held else views["train"],
        "val": views["val"],
        "eval": views["eval"],
        "context": views["train"],
    }


def optical_axes(world_to_cam: Tensor) -> Tensor:
    """Unit optical axes ``(V, 3)`` float64 in world coordinates (the third row of each rotation)."""
    axes = world_to_cam.double()[..., 2, :3]
    return axes / axes.norm(dim=-1, keepdim=True)


def axis_angles(axes: Tensor) -> Tensor:
    """``(V, V)`` angles in degrees between unit axes ``(V, 3)`` (float64; atan2, accurate near 0)."""
    cross = torch.linalg.cross(axes[:, None], axes[None], dim=-1).norm(dim=-1)
    return torch.rad2deg(torch.atan2(cross, axes @ axes.T))


def nearest_views(angles: Tensor, target: int, candidates: Sequence[int], count: int) -> list[int]:
    """The ``count`` of ``candidates`` (``target`` left out) nearest ``target`` by ``angles (V, V)``,
    nearest first (ties: the lower index); a :class:`SceneError` when there are fewer."""
    pool = [int(c) for c in candidates if int(c) != target]
    if len(pool) < count:
        raise SceneError(f"view {target} needs {count} other training views as context, the capture has {len(pool)}")
    return sorted(pool, key=lambda c: (float(angles[target, c]), c))[:count]


def cut_capture(
    name: str, world_to_cam: Tensor, targets: Sequence[int], training: Sequence[int], choices: int = 2
) -> list[tuple[SceneCut, list[int]]]:
    """Per target: its :class:`SceneCut` (the 2 nearest training views as context) and the
    ``choices`` nearest training views it may draw its context from (the first two: the cut's)."""
    angles = axis_angles(optical_axes(world_to_cam))
    out = []
    for target in targets:
        near = nearest_views(angles, target, training, 2)
        pool = nearest_views(angles, target, training, min(choices, len(set(training) - {target})))
        a, b = near
        cut = SceneCut(name, target, (a, b), (float(angles[target, a]), float(angles[target, b]), float(angles[a, b])))
        out.append((cut, pool))
    return out


def check_protocol(names: Sequence[str], protocol: str, held_out: Sequence[str]) -> None:
    """A one-line :class:`SceneError` unless ``protocol`` and ``held_out`` fit the captures ``names``."""
    if protocol not in PROTOCOLS:
        raise SceneError(f"protocol must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
    unknown = sorted(set(held_out) - set(names))
    if unknown:
        raise SceneError(f"held_out names {unknown}, which are not captures; the captures are {sorted(names)}")
    if protocol == "views" and held_out:
        raise SceneError(f"held_out {list(held_out)} is for protocol 'captures'; protocol 'views' holds out views")
    if protocol == "captures" and not (held_out and set(names) - set(held_out)):
        raise SceneError("protocol 'captures' needs held_out: one or more of the captures, not all of them")


def cut_captures(
    poses: Mapping[str, Tensor],
    split: str,
    *,
    protocol: str = "views",
    held_out: Sequence[str] = (),
    test_every: Mapping[str, int] | None = None,
    choices: int = 2,
) -> list[tuple[SceneCut, list[int]]]:
    """The scenes of ``split`` over captures ``poses`` (``{name: world_to_cam (V, 4, 4)}``), in
    capture order, then target order (:func:`cut_capture` pairs; module doc for the protocols).
    ``test_every``: per capture (default :data:`DEFAULT_TEST_EVERY`); ``choices``: see :func:`cut_capture`."""
    if split not in CAPTURE_SPLITS:
        raise SceneError(f"split must be one of {', '.join(CAPTURE_SPLITS)}, got {split!r}")
    check_protocol(list(poses), protocol, held_out)
    scenes = []
    for name, world_to_cam in poses.items():
        views = capture_views(
            len(world_to_cam), name, protocol, held_out, (test_every or {}).get(name, DEFAULT_TEST_EVERY)
        )
        try:
            scenes += cut_capture(name, world_to_cam, views[split], views["context"], choices)
        except SceneError as error:
            raise SceneError(f"capture {name}: {error}") from None
    return scenes


def angle_summary(cuts: Sequence[SceneCut]) -> dict:
    """Min / median / max (degrees) over ``cuts`` of the target-to-context angles (both contexts)
    and of the angle between the contexts; ``{"scenes": 0}`` without cuts."""
    if not cuts:
        return {"scenes": 0}
    to_context = [angle for cut in cuts for angle in cut.angles[:2]]
    between = [cut.angles[2] for cut in cuts]
    stats = lambda x: {"min": min(x), "median": statistics.median(x), "max": max(x)}  # noqa: E731
    return {"scenes": len(cuts), "target_context": stats(to_context), "between_contexts": stats(between)}
