"""The intervals NVS reports give a paired difference: a crossed (seed x scene) bootstrap, and its
hierarchical version for scenes clustered in real captures.

Every row of an experiment is trained with the same seeds and scored on the same held-out scenes,
so a difference between two rows is a ``(seeds, scenes)`` table, and the design is *crossed*: a
scene that is hard for one seed is hard for all of them (per-scene differences correlate 0.87 to
0.96 across seeds in the committed cells). A nested bootstrap, drawing scenes anew within each
drawn seed, treats every seed's scenes as independent and divides the scene variance by
``seeds * scenes`` instead of ``scenes``: its intervals are too narrow (tests/test_intervals.py
measures it). :func:`crossed_bootstrap` draws seeds and scenes each once per resample, the scene
draw shared by all drawn seeds (the "pigeonhole" bootstrap of a two-way crossed design; it keeps
each factor's variance, and counts the interaction in both, so it errs on the wide side), and
averages the paired differences; the interval is the percentile one.

With few seeds (3 here) the seed factor has few distinct resamples: the interval covers the scene
spread well and the seed spread roughly. tests/test_intervals.py checks the coverage on simulated
data with the committed experiments' variance components (scene dominant, seed small).

Scenes cut from a few real captures are not independent: :func:`hierarchical_bootstrap` also
resamples the captures, and widens its interval for their small number.
"""

from __future__ import annotations

import functools
import math

import torch

from hrope import InputError

__all__ = [
    "crossed_bootstrap",
    "hierarchical_bootstrap",
    "interval_text",
    "RESAMPLES",
    "LEVEL",
    "METHOD",
    "HIERARCHICAL_METHOD",
]

RESAMPLES = 4000
LEVEL = 0.95
METHOD = (
    "a 95% percentile bootstrap of the mean paired difference (same seed, same scene), seeds and "
    "scenes each resampled once per draw, the scene draw shared by all seeds (crossed design)"
)
HIERARCHICAL_METHOD = (
    "a 95% bootstrap of the mean paired difference (same seed, same scene), seeds, captures and "
    "scenes within captures resampled once per draw, shared by all seeds, the percentile interval "
    "widened by t(C - 1) / z * sqrt(C / (C - 1)) for C captures"
)


def crossed_bootstrap(
    a: list[list[float]], b: list[list[float]], *, resamples: int = RESAMPLES, seed: int = 0, level: float = LEVEL
) -> dict:
    """Mean paired difference ``a - b`` with its crossed-bootstrap percentile interval.

    Args:
        a, b: one list of per-scene values per seed, ``(seeds, scenes)``, the same seeds and
            held-out scenes in the same order in both (row a and row b trained with seed s and
            scored on scene i).
        resamples: bootstrap draws; seed: of the draws (the interval is deterministic).
        level: the interval's coverage.

    Returns:
        ``{"mean", "low", "high", "level", "seeds", "scenes", "excludes_zero"}``.
    """
    diff = _paired_table(a, b)
    seeds, scenes = diff.shape
    generator = torch.Generator().manual_seed(seed)
    seed_draw = torch.randint(seeds, (resamples, seeds, 1), generator=generator)
    scene_draw = torch.randint(scenes, (resamples, 1, scenes), generator=generator)
    return _percentile_interval(diff, diff[seed_draw, scene_draw].mean(dim=(1, 2)), level)


def _paired_table(a: list[list[float]], b: list[list[float]]) -> torch.Tensor:
    diff = torch.tensor(a, dtype=torch.float64) - torch.tensor(b, dtype=torch.float64)
    if diff.ndim != 2 or diff.numel() == 0:
        raise InputError(f"a and b must be (seeds, scenes) tables of the same shape, got {tuple(diff.shape)}")
    return diff


def _percentile_interval(diff: torch.Tensor, means: torch.Tensor, level: float, widening: float = 1.0) -> dict:
    """The report of a paired table ``diff`` (seeds, scenes) from its bootstrap means (resamples,),
    the percentile interval widened about the point estimate by ``widening``."""
    bounds = torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=torch.float64)
    low, high = torch.quantile(means, bounds).tolist()
    mean = float(diff.mean())
    if widening != 1.0:
        low, high = mean + widening * (low - mean), mean + widening * (high - mean)
    return {
        "mean": mean,
        "low": low,
        "high": high,
        "level": level,
        "seeds": diff.shape[0],
        "scenes": diff.shape[1],
        "excludes_zero": low > 0 or high < 0,
    }


def interval_text(result: dict) -> str:
    """``+0.12 [+0.07, +0.17]`` of a bootstrap result, bold when it excludes zero."""
    text = f"{result['mean']:+.2f} [{result['low']:+.2f}, {result['high']:+.2f}]"
    return f"**{text}**" if result["excludes_zero"] else text


@functools.cache
def student_t_quantile(level: float, df: int) -> float:
    """The ``t`` with ``P(|T| < t) = level`` for Student's T with ``df`` degrees of freedom.

    With ``T = sqrt(df) tan(theta)`` the density of ``theta`` is proportional to
    ``cos(theta) ** (df - 1)`` on ``(-pi/2, pi/2)``; its integral is tabulated by the trapezoid rule
    and inverted by linear interpolation (error below 1e-7 up to ``level`` 0.99 and ``df`` 100).
    """
    theta = torch.linspace(0, math.pi / 2, 2**16 + 1, dtype=torch.float64)
    mass = torch.cumulative_trapezoid(torch.cos(theta) ** (df - 1), theta)
    mass = torch.cat([mass.new_zeros(1), mass / mass[-1]])
    index = int(torch.searchsorted(mass, torch.tensor(level, dtype=torch.float64)))
    fraction = (level - mass[index - 1]) / (mass[index] - mass[index - 1])
    return math.sqrt(df) * math.tan(float(theta[index - 1] + fraction * (theta[index] - theta[index - 1])))


def hierarchical_bootstrap(
    a: list[list[float]],
    b: list[list[float]],
    clusters: list,
    *,
    resamples: int = RESAMPLES,
    seed: int = 0,
    level: float = LEVEL,
) -> dict:
    """Mean paired difference ``a - b`` with an interval that also resamples captures.

    Scenes cut from one real capture share its object, lighting and camera path, so the design is
    seeds crossed with scenes nested in captures. One resample draws the seeds, the captures with
    replacement, and within each drawn capture as many scenes as it holds with replacement; the
    capture and scene draws are shared by all drawn seeds (crossed, as in :func:`crossed_bootstrap`).
    The statistic is the mean over the drawn (seed, scene) cells, so a drawn capture weighs as many
    scenes as it holds: the bootstrap estimates the variance of the reported point estimate, the
    plain mean over all scenes (captures weighted by their scene counts), not that of the mean of
    capture means. The percentile interval is then widened about the point estimate by
    ``t(level, C - 1) / z(level) * sqrt(C / (C - 1))`` for ``C`` captures: the bootstrap variance
    of the capture factor is ``(C - 1) / C`` of its estimate and rests on ``C - 1`` degrees of
    freedom, so with 5 to 7 captures the plain percentile interval is too narrow (coverage 0.84 to
    0.93 where captures differ, tests/test_intervals.py and docs/results.md). Known biases: seeds
    resample poorly, as in :func:`crossed_bootstrap`; redrawing scenes inside redrawn captures counts
    the scene variance twice, and the widening assumes the capture factor dominates, so where
    captures do not differ the interval errs wide (coverage 0.99). One capture: the crossed
    bootstrap's distribution, no widening; one scene per capture: the crossed bootstrap's draws.

    Args:
        a, b: ``(seeds, scenes)`` tables as for :func:`crossed_bootstrap`.
        clusters: ``scenes`` hashable labels, the capture each scene comes from.
        resamples, seed, level: as for :func:`crossed_bootstrap`.

    Returns:
        :func:`crossed_bootstrap`'s dict plus ``"captures"`` (distinct labels) and ``"widening"``
        (the factor applied to the percentile interval; 1 for one capture).
    """
    diff = _paired_table(a, b)
    seeds, scenes = diff.shape
    if len(clusters) != scenes:
        raise InputError(f"clusters must give one capture per scene ({scenes}), got {len(clusters)}")
    names = list(dict.fromkeys(clusters))
    label, captures = torch.tensor([names.index(name) for name in clusters]), len(names)
    generator = torch.Generator().manual_seed(seed)
    seed_draw = torch.randint(seeds, (resamples, seeds), generator=generator)
    scene_draw, valid = _nested_scene_draw(label, captures, resamples, generator)
    seed_means = torch.nn.functional.one_hot(seed_draw, seeds).double().mean(dim=1) @ diff  # (resamples, scenes)
    cells = seed_means.gather(1, scene_draw.flatten(1)).view_as(scene_draw)
    means = (cells * valid).sum(dim=(1, 2)) / valid.sum(dim=(1, 2))
    widening = 1.0
    if captures > 1:
        normal = float(torch.special.ndtri(torch.tensor((1 + level) / 2, dtype=torch.float64)))
        widening = student_t_quantile(level, captures - 1) / normal * math.sqrt(captures / (captures - 1))
    return _percentile_interval(diff, means, level, widening) | {"captures": captures, "widening": widening}


def _nested_scene_draw(
    label: torch.Tensor, captures: int, resamples: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Captures drawn with replacement, then as many scenes as each drawn capture holds, drawn with
    replacement among its own; ``label`` (scenes,) the capture of each scene. Returns the drawn
    scene indices and which of them count, both ``(resamples, captures, largest capture)``."""
    sizes = torch.bincount(label, minlength=captures)
    # members[c, j]: the j-th scene of capture c (padded with scene 0 past the capture's size)
    order = torch.sort(label, stable=True).indices
    rank = torch.arange(len(label)) - (torch.cumsum(sizes, 0) - sizes)[label[order]]
    members = torch.zeros(captures, int(sizes.max()), dtype=torch.long)
    members[label[order], rank] = order
    capture_draw = torch.randint(captures, (resamples, captures), generator=generator)
    drawn_sizes = sizes[capture_draw][..., None]  # (resamples, captures, 1)
    uniform = torch.rand(resamples, captures, members.shape[1], generator=generator, dtype=torch.float64)
    position = torch.minimum((uniform * drawn_sizes).long(), drawn_sizes - 1)
    return members[capture_draw[..., None], position], torch.arange(members.shape[1]) < drawn_sizes
