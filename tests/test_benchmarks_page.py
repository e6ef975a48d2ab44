"""docs/benchmarks.md and the measured tables of docs/benchmarks/*.md (experiments/benchmarks_page.py)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

import experiments.benchmarks_page as benchmarks_page


def test_the_pages_match_the_committed_results():
    assert benchmarks_page.main(["--check"]) == 0


def test_every_committed_benchmark_result_has_a_row():
    listed = {result.path for result in benchmarks_page.RESULTS}
    top_level = {path.name for path in benchmarks_page.RESULTS_DIR.glob("*.json")}
    assert top_level - listed == set(), "a result file in benchmarks/results/ is missing from RESULTS"
    assert all((benchmarks_page.RESULTS_DIR / path).is_file() for path in listed)
    assert {result.benchmark for result in benchmarks_page.RESULTS} == set(benchmarks_page.BENCHMARKS)


def test_a_command_comes_from_the_file_or_from_the_registry_never_both():
    result = benchmarks_page.Result("x", "x.json", "", str, command="python benchmarks/x.py")
    assert benchmarks_page.command(result, {}) == "python benchmarks/x.py"
    assert benchmarks_page.command(replace(result, command=None), {"meta": {"command": "recorded"}}) == "recorded"
    with pytest.raises(ValueError, match="x.json records a command"):
        benchmarks_page.command(result, {"command": "recorded"})
    with pytest.raises(ValueError, match="x.json records no command"):
        benchmarks_page.command(replace(result, command=None), {})


def test_the_attention_headline_pairs_the_peer_per_repetition():
    per_rep = {"prope": [1.1, 1.2, 1.3], "prope-einsum": [1.0, 1.5, 1.3]}
    data = {
        "forward": {"ratio": {"prope": 1.2, "prope-einsum": 1.3}, "ratios_per_repetition": per_rep},
        "forward_backward": {"ratio": {"prope": 1.05, "prope-einsum": 1.1}},
    }
    # per repetition 1.1, 0.8, 1.0: median 1.0, not 1.2 / 1.3 = 0.923
    assert benchmarks_page.attention(data) == "fwd / SDPA: prope 1.200; fwd+bwd / SDPA: prope 1.050; " + (
        "fwd / prope-einsum: prope 1.000"
    )


def test_detail_blocks_hold_the_committed_markdown_with_its_headings_made_bold(tmp_path, monkeypatch):
    monkeypatch.setattr(benchmarks_page, "RESULTS_DIR", tmp_path)
    (tmp_path / "r.md").write_text("# Title\n\n| a |\n|---|\n| 1 |\n")
    page = "Intro.\n\n<!-- benchmarks_page: r.md -->\nstale\n<!-- /benchmarks_page -->\n\nAfter.\n"
    assert benchmarks_page.render_detail(page) == (
        "Intro.\n\n<!-- benchmarks_page: r.md -->\n\n**Title**\n\n| a |\n|---|\n| 1 |\n\n<!-- /benchmarks_page -->\n\n"
        "After.\n"
    )
    with pytest.raises(ValueError, match="'missing.md': no such file"):
        benchmarks_page.render_detail("<!-- benchmarks_page: missing.md -->\n<!-- /benchmarks_page -->")


def test_rows_without_provenance_say_so(tmp_path, monkeypatch):
    monkeypatch.setattr(benchmarks_page, "RESULTS_DIR", tmp_path)
    (tmp_path / "a.json").write_text(json.dumps({"command": "python benchmarks/a.py"}))
    (tmp_path / "b.json").write_text(
        json.dumps({"meta": {"provenance": {"commit": "0123456789abcdef", "dirty": True}}})
    )
    monkeypatch.setattr(benchmarks_page, "BENCHMARKS", {"a": benchmarks_page.Benchmark("a", "a.md", "what a does")})
    monkeypatch.setattr(
        benchmarks_page,
        "RESULTS",
        (
            benchmarks_page.Result("a", "a.json", "first", lambda data: "1.00"),
            benchmarks_page.Result("a", "b.json", "second", lambda data: "2.00", command="python benchmarks/a.py --b"),
        ),
    )
    rows = benchmarks_page.summary().splitlines()[-2:]
    assert rows == [
        "| [a](a.md) | what a does | first | 1.00 | `not recorded` | `python benchmarks/a.py` |",
        "| a |  | second | 2.00 | `0123456789 + uncommitted changes` | `python benchmarks/a.py --b` |",
    ]
