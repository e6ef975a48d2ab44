"""The one interval every NVS report gives a paired difference: a crossed (seed x scene) bootstrap.

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
"""

from __future__ import annotations

import torch

from hrope import InputError

__all__ = ["crossed_bootstrap", "hierarchical_bootstrap", "RESAMPLES", "LEVEL", "METHOD"]

RESAMPLES = 4000
LEVEL = 0.95
METHOD = (
    "a 95% percentile bootstrap of the mean paired difference (same seed, same scene), seeds and "
    "scenes each resampled once per draw, the scene draw shared by all seeds (crossed design)"
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


def _percentile_interval(diff: torch.Tensor, means: torch.Tensor, level: float) -> dict:
    """The report of a paired table ``diff`` (seeds, scenes) from its bootstrap means (resamples,)."""
    bounds = torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=torch.float64)
    low, high = torch.quantile(means, bounds).tolist()
    return {
        "mean": float(diff.mean()),
        "low": low,
        "high": high,
        "level": level,
        "seeds": diff.shape[0],
        "scenes": diff.shape[1],
        "excludes_zero": low > 0 or high < 0,
    }


def hierarchical_bootstrap(
    a: list[list[float]],
    b: list[list[float]],
    clusters: list,
    *,
    resamples: int = RESAMPLES,
    seed: int = 0,
    level: float = LEVEL,
) -> dict:
    """Mean paired difference ``a - b`` with a percentile interval that also resamples captures.

    Scenes cut from one real capture share its object, lighting and camera path, so the design is
    seeds crossed with scenes nested in captures. One resample draws the seeds, then the captures
    with replacement, then within each drawn capture as many scenes as it holds with replacement;
    the capture and scene draws are shared by all drawn seeds (crossed, as in
    :func:`crossed_bootstrap`). The statistic is the mean over the drawn (seed, scene) cells, so a
    drawn capture weighs as many scenes as it holds: the bootstrap estimates the variance of the
    reported point estimate, the plain mean over all scenes (a capture-size-weighted mean of the
    capture means), not of the mean of capture means. One capture gives the crossed bootstrap's
    distribution; one scene per capture gives the crossed bootstrap itself.

    Args:
        a, b: ``(seeds, scenes)`` tables as for :func:`crossed_bootstrap`.
        clusters: ``scenes`` hashable labels, the capture each scene comes from.
        resamples, seed, level: as for :func:`crossed_bootstrap`.

    Returns:
        :func:`crossed_bootstrap`'s dict plus ``"captures"``, the number of distinct labels.
    """
    diff = _paired_table(a, b)
    seeds, scenes = diff.shape
    if len(clusters) != scenes:
        raise InputError(f"clusters must give one capture per scene ({scenes}), got {len(clusters)}")
    names = list(dict.fromkeys(clusters))
    label = torch.tensor([names.index(name) for name in clusters])
    captures = len(names)
    sizes = torch.bincount(label, minlength=captures)
    # members[c, j]: the j-th scene of capture c (padded with scene 0 past the capture's size)
    order = torch.sort(label, stable=True).indices
    rank = torch.arange(scenes) - (torch.cumsum(sizes, 0) - sizes)[label[order]]
    members = torch.zeros(captures, int(sizes.max()), dtype=torch.long)
    members[label[order], rank] = order
    generator = torch.Generator().manual_seed(seed)
    seed_draw = torch.randint(seeds, (resamples, seeds), generator=generator)
    capture_draw = torch.randint(captures, (resamples, captures), generator=generator)
    drawn_sizes = sizes[capture_draw][..., None]  # (resamples, captures, 1)
    uniform = torch.rand(resamples, captures, members.shape[1], generator=generator, dtype=torch.float64)
    position = torch.minimum((uniform * drawn_sizes).long(), drawn_sizes - 1)
    scene_draw = members[capture_draw[..., None], position]
    valid = torch.arange(members.shape[1]) < drawn_sizes
    cells = diff[seed_draw].mean(dim=1).gather(1, scene_draw.flatten(1)).view_as(position)
    means = (cells * valid).sum(dim=(1, 2)) / valid.sum(dim=(1, 2))
    return _percentile_interval(diff, means, level) | {"captures": captures}
