"""The real-image check's verdict (experiments/real_stereo_check.py) on made-up per-window PSNRs."""

from __future__ import annotations


import torch


from experiments.real_stereo_check import SYNTHETIC_ORDER, ordering, verdict


def _records(offsets: list[float], noise: float = 0.01) -> dict:
    """Per row of SYNTHETIC_ORDER, 3 seeds x 20 windows of PSNR = window difficulty + row offset."""
    g = torch.Generator().manual_seed(0)
    windows = 20 + 3 * torch.rand(20, generator=g)
    records = {}
    for row, offset in zip(SYNTHETIC_ORDER, offsets):
        records[row] = []
        for seed in range(3):
            values = (windows + offset + noise * torch.randn(20, generator=g)).tolist()
            records[row].append({"seed": seed, "per_scene": {"psnr": values}, "metrics": {"psnr": sum(values) / 20}})
    return records


def test_the_ordering_holds_when_each_row_beats_the_next():
    order = ordering(_records([0.4, 0.3, 0.2, 0.1, 0.0]))
    assert order["holds"] and order["significant"]
    assert order["observed_order"] == [row.label for row in SYNTHETIC_ORDER]
    assert "holds on the real pair" in verdict(order)


def test_a_reversed_step_is_named():
    order = ordering(_records([0.4, 0.3, 0.2, 0.0, 0.1]))  # prope (rays world) below prope
    assert not order["holds"]
    assert [p["mean"] < 0 for p in order["pairs"]] == [False, False, False, True]
    assert f"reversed `{SYNTHETIC_ORDER[3].label}` vs `{SYNTHETIC_ORDER[4].label}`" in verdict(order)


def test_differences_within_noise_hold_only_in_the_means():
    order = ordering(_records([0.004, 0.003, 0.002, 0.001, 0.0], noise=0.5))
    assert not order["significant"]
