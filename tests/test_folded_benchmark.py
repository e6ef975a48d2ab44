"""benchmarks/folded_attention.py on a tiny shape: every part writes its rows and ratios."""

from __future__ import annotations

import json

import pytest


@pytest.mark.slow
def test_folded_attention_benchmark_writes_every_part(tmp_path, monkeypatch):
    import folded_attention

    monkeypatch.setattr(folded_attention, "TRAINING", [("none", False), ("prope", True)])  # 2 of the 7 rows
    argv = ["--reps", "1", "--grid", "2", "--heads", "2", "--head-dim", "16", "--threads", "1"]
    folded_attention.main(argv + ["--rounds", "1", "--steps", "1", "--out", str(tmp_path)])
    results = json.loads((tmp_path / "folded_attention.json").read_text())
    for mode in ("forward", "forward_backward"):
        modules = results["modules"][mode]
        assert list(modules["ms"]) == [
            "plain",
            "rope2d",
            *(f"{name} {fold}" for name in ("prope", "gta", "hrope-lift") for fold in ("folded", "unfolded")),
        ]
        assert modules["ratio_to_plain"]["plain"] == 1.0 and modules["cpu_ratio_to_rope2d"]["rope2d"] == 1.0
        assert all(ms > 0 for ms in modules["cpu_ms"].values())
    passes = results["passes"]["cpu_ms"]
    assert {"qkv: plain", "qkv: prope (folded)", "sdpa", "output: prope (folded)"} <= set(passes)
    assert all(ms > 0 for ms in passes.values())
    for path in ("per_call", "prepared_once"):
        assert set(results["per_call"][path]["forward"]["ratio"]) == {"prope", "hrope-lift", "prope-einsum"}
    training = results["training"]
    assert list(training["steps_per_s"]) == ["none", "prope folded"]
    assert training["ratio_to_none"]["none"] == 1.0 and training["cpu_ratio_to_none"]["none"] == 1.0
    assert training["cpu_ratio_quartiles_to_none"]["none"] == [1.0, 1.0]
    assert set(results["provenance"]) == {"commit", "dirty", "torch"}
    markdown = (tmp_path / "folded_attention.md").read_text()
    assert "| forward | prope folded |" in markdown and "| prope folded |" in markdown and "commit `" in markdown
    assert "| qkv: prope (folded) |" in markdown


def test_folded_attention_benchmark_on_another_dtype(tmp_path):
    """bfloat16 modules (the GPU suite's runs, here on the CPU): the file carries dtype and tag."""
    import folded_attention

    argv = ["--reps", "1", "--grid", "2", "--heads", "2", "--head-dim", "16", "--threads", "1", "--views", "2"]
    folded_attention.main(argv + ["--dtype", "bfloat16", "--parts", "modules", "--tag", "n8", "--out", str(tmp_path)])
    results = json.loads((tmp_path / "folded_attention_bfloat16_n8.json").read_text())
    assert results["config"]["dtype"] == "bfloat16" and all(
        ms > 0 for ms in results["modules"]["forward"]["ms"].values()
    )
    assert "cpu bfloat16" in (tmp_path / "folded_attention_bfloat16_n8.md").read_text()
