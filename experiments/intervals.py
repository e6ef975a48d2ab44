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

__all__ = ["crossed_bootstrap", "RESAMPLES", "LEVEL", "METHOD"]

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
    diff = torch.tensor(a, dtype=torch.float64) - torch.tensor(b, dtype=torch.float64)
    if diff.ndim != 2 or diff.numel() == 0:
        raise ValueError(f"a and b must be (seeds, scenes) tables of the same shape, got {tuple(diff.shape)}")
    seeds, scenes = diff.shape
    generator = torch.Generator().manual_seed(seed)
    seed_draw = torch.randint(seeds, (resamples, seeds, 1), generator=generator)
    scene_draw = torch.randint(scenes, (resamples, 1, scenes), generator=generator)
    means = diff[seed_draw, scene_draw].mean(dim=(1, 2))
    bounds = torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=torch.float64)
    low, high = torch.quantile(means, bounds).tolist()
    return {
        "mean": float(diff.mean()),
        "low": low,
        "high": high,
        "level": level,
        "seeds": seeds,
        "scenes": scenes,
        "excludes_zero": low > 0 or high < 0,
    }
