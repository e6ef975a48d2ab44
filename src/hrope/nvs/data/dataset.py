"""Torch datasets of normalised multi-view examples: context views first, then targets.

:func:`sample_views` picks the frames of one example like the RealEstate10K protocol: two
context frames ``gap`` frames apart (``gap`` in ``context_gap``), extra context frames between
them, and targets between them (``targets="interpolate"``) or outside them, at most ``gap / 2``
frames away (``"extrapolate"``). ``split="train"`` draws frames at random from a stream keyed by
``(seed, index, epoch)`` (call :meth:`set_epoch` to vary them); ``split="eval"`` (the test scenes)
and ``split="val"`` (validation scenes, synthetic kinds only: options are chosen on them, the test
scenes are scored once) are fixed per index and space the targets evenly. ``sampling="lvsm"``
draws the training views as LVSM does instead (:func:`sample_lvsm_views`; held-out views stay as
above). Every example is normalised (:func:`hrope.nvs.data.normalize.normalize`: ``context`` by
default, or ``lvsm``).
"""

from __future__ import annotations

from collections.abc import Sequence

from torch.utils.data import Dataset

from .batch import SceneBatch, collate_scenes
from ..config.schema import NORMALIZATIONS, VIEW_SAMPLINGS
from .normalize import normalize
from .real.source import load_or_skip
from .rng import Rng, stream_seed
from .scene import Scene, SceneError
from .synthetic import KINDS, SyntheticConfig, make_scene

__all__ = [
    "sample_views",
    "sample_lvsm_views",
    "TooFewFramesError",
    "ViewSampling",
    "SceneDataset",
    "SyntheticDataset",
    "DEFAULT_CONTEXT_GAP",
]

TARGET_MODES = ("interpolate", "extrapolate")
DEFAULT_CONTEXT_GAP = {"room": (25, 100), "object": (15, 60)}  # frames between the outer context views
SPLITS = ("train", "eval", "val")


class TooFewFramesError(SceneError):
    """A video too short for the requested view sampling (a data error: the scene is skipped)."""


def _evenly(low: int, high: int, count: int) -> list[int]:
    """``count`` integers evenly spaced strictly inside ``(low, high)`` (rounded)."""
    return [round(low + (high - low) * (k + 1) / (count + 1)) for k in range(count)]


def sample_views(
    num_frames: int,
    num_context: int,
    num_target: int,
    rng: Rng,
    *,
    context_gap: tuple[int, int] | None = None,
    targets: str = "interpolate",
    random_targets: bool = True,
) -> list[int]:
    """Frame indices ``[context..., targets...]`` of one example from a video of ``num_frames``.

    ``context_gap`` (inclusive frame range of the first-to-last context distance) defaults to
    any gap the video allows. Raises :class:`TooFewFramesError` when the video is too short, and
    ValueError for an invalid request.
    """
    if num_context < 1 or num_target < 0:
        raise ValueError(f"need num_context >= 1 and num_target >= 0, got {num_context}, {num_target}")
    if targets not in TARGET_MODES:
        raise ValueError(f"targets must be one of {TARGET_MODES}, got {targets!r}")
    if context_gap is not None and not num_context - 1 <= context_gap[0] <= context_gap[1]:
        raise ValueError(
            f"context_gap {context_gap} must satisfy {num_context - 1} <= low <= high (distinct context frames)"
        )
    low, high = context_gap if context_gap is not None else (num_context - 1, num_frames - 1)
    margin = lambda gap: max(1, gap // 2) if targets == "extrapolate" else 0  # noqa: E731
    high = min(high, max((g for g in range(low, high + 1) if g + 2 * margin(g) < num_frames), default=-1))
    if high < low:
        raise TooFewFramesError(
            f"impossible view sampling: a context gap of {low} frames with {targets} targets "
            f"needs {low + 2 * margin(low) + 1} frames, the video has {num_frames}"
        )
    gap = rng.integer(low, high)
    first = margin(gap) + rng.integer(0, num_frames - 1 - gap - 2 * margin(gap))
    last = first + gap
    inner = num_context - 2
    if inner > 0 and random_targets:
        middle = sorted(first + 1 + int(i) for i in rng.child("context").uniform(0, 1, (inner,)).mul(gap - 1).long())
    else:
        middle = _evenly(first, last, inner)
    context = [first] + middle + ([last] if num_context > 1 else [])
    if targets == "interpolate":
        choices = list(range(first, last + 1))
    else:
        ext = margin(gap)
        choices = list(range(first - ext, first)) + list(range(last + 1, last + ext + 1))
    if random_targets:
        picks = [choices[rng.integer(0, len(choices) - 1)] for _ in range(num_target)]
    else:
        picks = [choices[i] for i in _evenly(-1, len(choices), num_target)]
    return context + picks


def sample_lvsm_views(
    num_frames: int, num_context: int, num_target: int, rng: Rng, *, context_gap: tuple[int, int] | None = None
) -> tuple[list[int], list[int]]:
    """LVSM's training views: ``(frames, example)``, the frames to load and the example's views as
    positions in ``frames`` (context first, then targets).

    ``frames`` are n = ``num_context + num_target`` distinct frames: the first and the last,
    ``gap`` frames apart (``gap`` uniform in ``context_gap`` capped at the video's length, at least
    n - 1), then n - 2 frames drawn without replacement strictly between them, in random order.
    The context is the first ``num_context`` of them; the targets are ``num_target`` distinct
    positions drawn from all n, context views included (LVSM's ``target_has_input``; with 2 + 6
    views each target is a context view with probability 1/4). Raises :class:`TooFewFramesError`
    when the video is too short.
    """
    if num_context < 1 or num_target < 1:
        raise ValueError(f"need num_context >= 1 and num_target >= 1, got {num_context}, {num_target}")
    n = num_context + num_target
    low, high = context_gap if context_gap is not None else (n - 1, num_frames - 1)
    low, high = max(low, n - 1), min(high, num_frames - 1)
    if high < low:
        raise TooFewFramesError(
            f"impossible view sampling: {n} distinct frames with a context gap of at least {low} frames "
            f"need {low + 1} frames, the video has {num_frames}"
        )
    gap = rng.integer(low, high)
    first = rng.integer(0, num_frames - 1 - gap)
    inner = [first + 1 + i for i in rng.permutation(gap - 1)[: n - 2]]
    targets = rng.child("targets").permutation(n)[:num_target]
    return [first, first + gap, *inner], list(range(num_context)) + targets


class ViewSampling:
    """Shared view-sampling, normalisation and batching of the datasets below (not a Dataset itself)."""

    def __init__(
        self,
        num_context: int,
        num_target: int,
        split: str,
        seed: int,
        context_gap,
        targets: str,
        sampling: str = "uniform",
        normalization: str = "context",
    ) -> None:
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        if num_context < 1 or num_target < 0:
            raise ValueError(f"need num_context >= 1 and num_target >= 0, got {num_context}, {num_target}")
        if targets not in TARGET_MODES:
            raise ValueError(f"targets must be one of {TARGET_MODES}, got {targets!r}")
        if sampling not in VIEW_SAMPLINGS:
            raise ValueError(f"sampling must be one of {VIEW_SAMPLINGS}, got {sampling!r}")
        if normalization not in NORMALIZATIONS:
            raise ValueError(f"normalization must be one of {NORMALIZATIONS}, got {normalization!r}")
        self.num_context, self.num_target, self.split = num_context, num_target, split
        self.seed, self.context_gap, self.targets = seed, context_gap, targets
        self.sampling, self.normalization = sampling, normalization
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Vary the training views per epoch (eval views never change)."""
        self.epoch = epoch

    def plan(self, index: int, num_frames: int) -> tuple[list[int], list[int] | None]:
        """``(frames, example)``: the frames to load for example ``index`` and its views as positions
        in them (None: the frames in order, :func:`sample_views`; LVSM's training views:
        :func:`sample_lvsm_views`)."""
        train = self.split == "train"
        key = ("views", self.seed, index, self.epoch) if train else (f"{self.split}-views", self.seed, index)
        if train and self.sampling == "lvsm":
            return sample_lvsm_views(
                num_frames, self.num_context, self.num_target, Rng(*key), context_gap=self.context_gap
            )
        frames = sample_views(
            num_frames,
            self.num_context,
            self.num_target,
            Rng(*key),
            context_gap=self.context_gap,
            targets=self.targets,
            random_targets=train,
        )
        return frames, None

    def frames(self, index: int, num_frames: int) -> list[int]:
        """The frames :meth:`plan` loads for example ``index``."""
        return self.plan(index, num_frames)[0]

    def example(self, scene: Scene, example: list[int] | None) -> Scene:
        """The loaded views of one :meth:`plan` normalised (``lvsm``: over all of them), then
        arranged as the example (context views first)."""
        context = list(range(self.num_context)) if example is None else example[: self.num_context]
        scene = normalize(scene, context, self.normalization)
        return scene if example is None else scene.select_views(example)

    def collate(self, scenes: list[Scene]) -> SceneBatch:
        """``collate_fn`` for ``torch.utils.data.DataLoader``."""
        return collate_scenes(scenes, self.num_context)


class SceneDataset(ViewSampling, Dataset):
    """Examples drawn from any indexable source of :class:`Scene` (all frames of a video each).

    A source that also has ``num_frames(i)`` and ``load_views(i, frames)`` (like
    :class:`hrope.nvs.data.SceneSource`) decodes only the sampled frames, never a whole video; a scene
    that cannot be loaded or is too short for the sampling (a :class:`SceneError`) is skipped
    (replaced by the next one) with a warning counting the skipped scenes (``num_skipped``), unless
    the source has ``skip_errors=False``. ``context_gap=None`` allows any gap the scene's length allows.
    ``sampling`` / ``normalization``: the training views and the normalisation of
    :class:`ViewSampling` (``data.view_sampling``, ``data.normalize``).
    """

    def __init__(
        self,
        source: Sequence[Scene],
        num_context: int = 2,
        num_target: int = 1,
        *,
        split: str = "train",
        seed: int = 0,
        context_gap: tuple[int, int] | None = None,
        targets: str = "interpolate",
        sampling: str = "uniform",
        normalization: str = "context",
    ) -> None:
        super().__init__(num_context, num_target, split, seed, context_gap, targets, sampling, normalization)
        self.source = source
        self._bad: set[int] = set()

    def __len__(self) -> int:
        return len(self.source)

    @property
    def num_skipped(self) -> int:
        return len(self._bad)

    def __getitem__(self, index: int) -> Scene:
        if not (hasattr(self.source, "load_views") and hasattr(self.source, "num_frames")):
            scene = self.source[index]
            frames, example = self.plan(index, scene.num_views)
            return self.example(scene.select_views(frames), example)
        source = self.source

        def load(i: int) -> Scene:
            frames, example = self.plan(i, source.num_frames(i))
            return self.example(source.load_views(i, frames), example)

        return load_or_skip(source, index, load, self._bad, getattr(source, "skip_errors", True))


class SyntheticDataset(ViewSampling, Dataset):
    """``num_scenes`` synthetic scenes (:func:`make_scene`), rendering only the sampled frames.

    The ``eval`` split draws its scenes from a separate seed stream, so train and eval scenes
    never coincide. ``context_gap=None`` uses the kind's default (:data:`DEFAULT_CONTEXT_GAP`:
    25–100 frames for rooms as in RealEstate10K, 15–60 frames, i.e. 27–108 degrees of orbit, for
    objects). ``patch_size`` (optional) is checked against ``image_size``. ``sampling`` /
    ``normalization`` as for :class:`SceneDataset`.
    """

    def __init__(
        self,
        kind: str = "room",
        num_scenes: int = 1000,
        seed: int = 0,
        image_size: tuple[int, int] = (64, 64),
        num_context: int = 2,
        num_target: int = 2,
        *,
        split: str = "train",
        context_gap: tuple[int, int] | None = None,
        targets: str = "interpolate",
        config: SyntheticConfig = SyntheticConfig(),
        patch_size: int | None = None,
        sampling: str = "uniform",
        normalization: str = "context",
    ) -> None:
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {sorted(KINDS)}, got {kind!r}")
        gap = DEFAULT_CONTEXT_GAP[kind] if context_gap is None else context_gap
        super().__init__(num_context, num_target, split, seed, gap, targets, sampling, normalization)
        if num_scenes < 1:
            raise ValueError(f"num_scenes must be >= 1, got {num_scenes}")
        if patch_size is not None and (image_size[0] % patch_size or image_size[1] % patch_size):
            raise ValueError(f"image size {tuple(image_size)} is not divisible by patch size {patch_size}")
        height, width = image_size
        self.kind, self.num_scenes, self.image_size, self.config = kind, num_scenes, (height, width), config
        # independent scene streams per split: train ``seed`` itself, eval and val seeds keyed by their name
        self.scene_seed = seed if split == "train" else stream_seed(f"hrope.synthetic.{split}", seed)
        self.frames(0, config.num_frames)  # fail now, not in a worker, if the sampling is impossible

    def __len__(self) -> int:
        return self.num_scenes

    def __getitem__(self, index: int) -> Scene:
        if not 0 <= index < self.num_scenes:
            raise IndexError(f"scene index {index} out of range 0..{self.num_scenes - 1}")
        frames, example = self.plan(index, self.config.num_frames)
        scene = make_scene(
            self.scene_seed, index, self.kind, len(frames), self.image_size, frames=frames, config=self.config
        )
        return self.example(scene, example)
