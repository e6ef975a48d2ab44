"""The NVS comparison benchmark (experiments/nvs_table.py) on a toy budget: finite metrics for
every row, per-cell cache that resumes, Markdown/JSON/PNG outputs, the noise rule. Stale cells
(earlier code versions): tests/test_provenance.py."""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from hrope.nvs.model import APE_ENCODINGS, encoding_names


import experiments.rows as nvs_rows
from experiments.cells import TRAINING_NAME
from experiments.report import claims, compare, markdown, psnr_interval, stat, table_report
from experiments.rows import ABLATIONS, BUDGETS, Cell, Row, Table, cell_config, cell_settings, config_hash, tables
from experiments.store import CELLS_NAME, CellStore
from experiments.nvs_table import main, run_benchmark

TOY = replace(
    BUDGETS["quick"],
    steps=3,
    train_scenes=4,
    eval_scenes=2,
    protocol_scenes=2,
    warmup=1,
    model={"preset": "tiny", "image_size": 16, "patch_size": 8, "dim": 48, "layers": 1, "heads": 2},
)
TOY_TABLES = ["table1", "table3", "fig6"]
TOY_ROWS = {"none", "hrope"}


def _finite(value) -> bool:
    return isinstance(value, dict) and math.isfinite(value["mean"]) and math.isfinite(value["std"])


def _check_first_run(first: dict, out: Path) -> None:
    """Every row of the toy run has finite metrics for both seeds; cells, Fig. 6 results and the
    written report record the current code."""
    labels = set()
    for table in first["tables"].values():
        for rows in table["datasets"].values():
            for row in rows:
                labels.add(row["row"])
                assert row["seeds"] == [0, 1]
                assert _finite(row["psnr"]) and _finite(row["ssim"]), row
                assert row["lpips"] == "unavailable"
                assert row["parameters"] > 0
    assert labels == {
        "none",
        "hrope",
        "hrope (external, targets transfer)",
        "hrope (oracle)",
        "hrope (oracle, targets transfer)",
        "hrope (external, with target geometry)",
        "hrope (oracle, with target geometry)",
    }
    assert all(math.isfinite(cell["final_loss"]) for cell in first["cells"])
    # Every cell and Fig. 6 result records the code that computed it: the current code, so none is stale.
    assert all(cell["provenance"] == first["provenance"] and not cell["stale"] for cell in first["cells"])
    assert first["stale_cells"]["count"] == 0 and first["obsolete_cells"] == {}
    protocols = [json.loads(p.read_text()) for p in out.glob("cache/*/*/*/protocols.json")]
    assert len(protocols) == 8 and all(r["provenance"] == first["provenance"] for p in protocols for r in p.values())
    assert not list(out.glob(f"cache/**/{TRAINING_NAME}"))  # only present while a cell trains
    assert first["fig6"]["status"] == "ok", first["fig6"]
    zoom = first["fig6"]["datasets"]["room"]["zoom"]["rows"]["hrope"]
    assert [p["value"] for p in zoom] == list(TOY.zoom_factors) and all(_finite(p["psnr"]) for p in zoom)

    markdown = (out / "nvs_table.md").read_text()
    assert "Table 1 analogue" in markdown and "| hrope (oracle) |" in markdown and "`toy`" in markdown
    assert json.loads((out / "nvs_table.json").read_text())["tables"] == first["tables"]
    assert (out / "table1.png").stat().st_size > 0 and (out / "fig6_object.png").stat().st_size > 0


def _check_unfinished_cell_resumes(first: dict, out: Path) -> None:
    """An unfinished cell (no record in the cache or the store) resumes its checkpoint only when the
    current code started it."""
    folder = next(out.glob("cache/room/none.learned.ctx2/seed0-*"))
    record = json.loads((folder / "metrics.json").read_text())
    for started, resumed_from in ((first["provenance"], TOY.steps), ({"source_fingerprint": "other"}, 0)):
        (folder / "metrics.json").unlink()
        cell = folder.relative_to(out / "cache").as_posix()
        lines = (out / CELLS_NAME).read_text().splitlines(keepends=True)
        (out / CELLS_NAME).write_text("".join(line for line in lines if json.loads(line)["cell"] != cell))
        (folder / TRAINING_NAME).write_text(json.dumps(started))
        again = run_benchmark(TOY, out, table_names=["table1"], row_filter={"none"}, command="toy", log=lambda _: None)
        assert again["progress"]["trained_this_invocation"] == 1
        redone = json.loads((folder / "metrics.json").read_text())
        assert redone["resumed_from_step"] == resumed_from and redone["metrics"] == record["metrics"]


@pytest.mark.slow
def test_toy_benchmark_every_row_finite_and_cache_resumes(tmp_path):
    first = run_benchmark(TOY, tmp_path, table_names=TOY_TABLES, row_filter=TOY_ROWS, command="toy", log=lambda _: None)
    # table1: none, hrope on room + object; table3 (room): hrope learned (shared) + 5 plane sources; 2 seeds.
    assert first["progress"] == {"finished": 18, "planned": 18, "trained_this_invocation": 18}
    _check_first_run(first, tmp_path)

    second = run_benchmark(
        TOY, tmp_path, table_names=TOY_TABLES, row_filter=TOY_ROWS, command="toy", log=lambda _: None
    )
    assert second["progress"]["trained_this_invocation"] == 0
    assert second["tables"] == first["tables"] and second["fig6"] == first["fig6"]

    # The committed cells.jsonl alone (no cache) gives the same report, training nothing.
    store = CellStore(tmp_path / CELLS_NAME)
    assert len(store.ids()) == 18 and all(store.record(cell) is not None for cell in store.ids())
    (tmp_path / "cache").rename(tmp_path / "kept")
    alone = run_benchmark(
        TOY, tmp_path, table_names=TOY_TABLES, row_filter=TOY_ROWS, command="toy", report_only=True, log=lambda _: None
    )
    assert alone["tables"] == first["tables"] and alone["fig6"] == first["fig6"]
    assert not (tmp_path / "cache").exists()
    (tmp_path / "kept").rename(tmp_path / "cache")

    # A Fig. 6 result in neither the store nor the cache is recomputed from a retrained (identical) checkpoint.
    checkpoints = list(tmp_path.glob("cache/room/hrope.learned.ctx2/*/checkpoint.safetensors"))
    assert len(checkpoints) == 2
    for checkpoint in checkpoints:
        checkpoint.unlink()
        (checkpoint.parent / "protocols.json").unlink()
        cell = checkpoint.parent.relative_to(tmp_path / "cache").as_posix()
        store.put(cell, store.record(cell), {})
    store.save()
    fourth = run_benchmark(
        TOY, tmp_path, table_names=TOY_TABLES, row_filter=TOY_ROWS, command="toy", log=lambda _: None
    )
    assert fourth["fig6"] == first["fig6"] and fourth["tables"] == first["tables"]
    assert all(CellStore(tmp_path / CELLS_NAME).protocols(cell) for cell in store.ids() if "/hrope.learned." in cell)

    _check_unfinished_cell_resumes(first, tmp_path)

    # A changed budget is a different cell (no stale reuse): it trains again.
    third = run_benchmark(
        replace(TOY, steps=4), tmp_path, table_names=["table1"], row_filter={"none"}, command="toy", log=lambda _: None
    )
    assert third["progress"]["trained_this_invocation"] == 4


def test_report_only_trains_nothing_and_marks_cells_pending(tmp_path, capsys):
    report = main(["--quick", "--report-only", "--out", str(tmp_path), "--tables", "table2", "--rows", "none,prope"])
    assert report["progress"]["finished"] == 0 and report["progress"]["trained_this_invocation"] == 0
    rows = report["tables"]["table2"]["datasets"]["room"]
    assert [r["row"] for r in rows] == [
        "none",
        "prope",
        "none, 4 views",
        "prope, 4 views",
        "none, 8 views",
        "prope, 8 views",
    ]
    assert all(r["psnr"] is None for r in rows)
    assert {c["verdict"] for c in report["claims"]} == {"pending"}
    assert "pending" in (tmp_path / "nvs_table.md").read_text()


def test_seeds_option_plans_those_seeds(tmp_path):
    argv = ["--quick", "--report-only", "--out", str(tmp_path), "--tables", "table1", "--rows", "none"]
    assert main(argv)["progress"]["planned"] == 2 * len(BUDGETS["quick"].seeds)  # room and object
    report = main([*argv, "--seeds", "0", "2", "4"])
    assert report["progress"]["planned"] == 6 and list(report["budget"]["seeds"]) == [0, 2, 4]


def test_config_hash_tracks_the_budget_not_paths_or_device(tmp_path):
    cell = Cell("room", Row("hrope", "oracle"), 0)
    base = config_hash(cell_settings(TOY, cell))
    assert config_hash(cell_settings(replace(TOY, steps=5), cell)) != base
    assert config_hash(cell_settings(TOY, replace(cell, seed=1))) != base
    assert config_hash(cell_settings(TOY, Cell("room", Row("hrope", "external"), 0))) != base
    # The run config holds the settings plus paths/device/logging, which the key leaves out.
    config = cell_config(TOY, cell, tmp_path / "a", device="cuda", threads=4)
    assert config.train.out == str(tmp_path / "a") and config.train.steps == TOY.steps
    assert config.model.encoding == "hrope" and config.model.predictor == "oracle"


def test_results_version_is_in_the_cache_key(monkeypatch):
    cell = Cell("room", Row("hrope"), 0)
    settings = cell_settings(TOY, cell)
    current, version = config_hash(settings), nvs_rows.RESULTS_VERSION
    monkeypatch.setattr(nvs_rows, "RESULTS_VERSION", 0)  # version 0 (unhashed): the cells trained before it existed
    legacy = config_hash(settings)
    assert legacy == hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:10]
    monkeypatch.setattr(nvs_rows, "RESULTS_VERSION", version + 1)
    assert len({current, legacy, config_hash(settings)}) == 3


def test_an_encoding_results_version_rekeys_that_encoding_only(monkeypatch):
    """A version in ENCODING_RESULTS_VERSIONS re-keys the cells of its encoding; the others keep their keys."""
    cape, prope = (cell_settings(TOY, Cell("room", Row(e), 0)) for e in ("cape", "prope"))
    before = config_hash(cape), config_hash(prope)
    monkeypatch.setattr(nvs_rows, "ENCODING_RESULTS_VERSIONS", {"cape": nvs_rows.RESULTS_VERSION + 5})
    assert config_hash(cape) != before[0] and config_hash(prope) == before[1]
    assert nvs_rows.results_version(cape) == nvs_rows.RESULTS_VERSION + 5
    monkeypatch.setattr(nvs_rows, "ENCODING_RESULTS_VERSIONS", {})
    assert nvs_rows.results_version(cape) == nvs_rows.RESULTS_VERSION


def test_fig4a_ape_rows_only_for_distinct_ape_models():
    """``hrope-pf-ape`` (the same model as ``hrope-ape``) is gone: APE rows come from APE_ENCODINGS."""
    rows = tables(TOY)["fig4a"].rows
    labels = [row.label for row in rows]
    expected = [e + "-ape" for e in ABLATIONS if e in APE_ENCODINGS]
    assert "hrope-pf" in labels and "hrope-pf-ape" not in labels and "hrope-ape" in labels
    assert [label for label in labels if label.endswith("-ape")] == expected
    known = set(encoding_names())
    assert all(row.encoding in known for table in tables(TOY).values() for row in table.rows)


def test_noise_rule():
    a, b = stat([20.0, 20.2]), stat([19.9, 20.1])  # Δ 0.1, pooled std 0.141
    assert compare(a, b)["verdict"] == "within noise"
    assert compare(stat([21.0, 21.2]), b)["verdict"] == "higher"
    assert compare(b, stat([21.0, 21.2]))["verdict"] == "lower"
    assert compare(stat([20.0]), b)["verdict"] == "1 seed"
    assert compare(None, b) is None
    assert compare(stat([20.1, 20.1]), stat([20.0, 20.0]))["verdict"] == "higher"  # std 0: any Δ counts
    assert compare(stat([20.1, 20.1]), stat([20.0, 20.0]), floor=0.2)["verdict"] == "within noise"
    assert stat([1.0, 3.0]) == {"mean": 2.0, "std": pytest.approx(math.sqrt(2.0)), "n": 2}


def _records(label: str, per_scene: list[list[float]] | None) -> list[dict]:
    """Cell records of one row on ``room``, one per seed, with or without per-scene PSNR."""
    seeds = per_scene or [[20.0, 21.0], [20.2, 21.2]]
    return [
        {
            "dataset": "room",
            "row": label,
            "seed": seed,
            "metrics": {"psnr": sum(scenes) / len(scenes), "ssim": 0.5, "lpips": "unavailable"},
            "per_scene": None if per_scene is None else {"psnr": scenes},
            "train_seconds": 1.0,
            "parameters": 10,
        }
        for seed, scenes in enumerate(seeds)
    ]


def test_table_differences_and_claims_use_the_crossed_interval_when_cells_have_per_scene_psnr():
    """Δ vs the reference carries the crossed-bootstrap interval of the paired per-scene table, and a
    claim's verdict follows it: a lead of 0.1 dB that every scene shows holds, although the one-sigma
    screen calls it noise; cells without per-scene PSNR keep the screen."""
    table = Table("table1", "t", (Row("none"), Row("hrope"), Row("urope")), ("room",), lambda row: Row("none"))
    scenes = [[20.0, 21.0, 19.0, 22.0], [20.4, 21.4, 19.4, 22.4]]  # seed spread 0.4 dB, shared by every row
    lead = [[v + 0.1 for v in seed] for seed in scenes]  # hrope − urope: +0.1 on every scene and seed
    records = {
        (d, Row(e)): _records(e, t)
        for d in ("room",)
        for e, t in (("none", scenes), ("hrope", lead), ("urope", scenes))
    }
    rows = {r["row"]: r for r in table_report(table, records)["datasets"]["room"]}
    assert rows["none"]["psnr_interval"] is None
    interval = rows["hrope"]["psnr_interval"]
    assert interval["mean"] == pytest.approx(0.1) and interval["low"] == pytest.approx(0.1) and interval["seeds"] == 2
    assert rows["hrope"]["delta_psnr"]["verdict"] == "within noise"  # the screen: |0.1| < pooled std 0.28
    report = {"tables": {"table1": table_report(table, records)}, "cells": [r for rs in records.values() for r in rs]}
    (claim,) = [c for c in claims(report) if c["claim"] == "hrope > urope"]
    assert claim["verdict"] == "holds" and claim["interval"]["low"] > 0
    assert "**+0.10 [+0.10, +0.10]**" in markdown({**_report_frame(), **report, "claims": claims(report)})
    bare = {key: _records(key[1].encoding, None) for key in records}
    assert psnr_interval(bare[("room", Row("hrope"))], bare[("room", Row("none"))]) is None
    plain = {"tables": {"table1": table_report(table, bare)}, "cells": [r for rs in bare.values() for r in rs]}
    (claim,) = [c for c in claims(plain) if c["claim"] == "hrope > urope"]
    assert claim["interval"] is None and claim["verdict"] == "within noise"


def _report_frame() -> dict:
    """The parts of a report dict that markdown() reads besides the tables and claims."""
    return {
        "budget": {**TOY.as_dict(), "name": "toy"},
        "progress": {"finished": 0, "planned": 0},
        "command": "toy",
        "generated": "now",
        "device": "cpu",
        "threads": 1,
        "lpips": "unavailable",
    }


def test_the_cape_forms_set_reuses_table_1s_cape_cells():
    """plane_evidence's ``cape-forms`` set: EscherNet's ``cape`` (the reference) and the transposed form;
    its ``cape`` cell has Table 1's key at the same budget, so ``--cache`` on the nvs_table cache reuses it."""
    from experiments.plane_evidence import REFERENCES, SETS

    eschernet, transposed = SETS["cape-forms"]
    assert REFERENCES["cape-forms"] == eschernet and eschernet in tables(BUDGETS["full"])["table1"].rows
    assert dict(transposed.encoding_options) == {"form": "transposed"} and transposed.encoding == "cape"
    key = config_hash(cell_settings(BUDGETS["full"], Cell("room", eschernet, 0)))
    assert key != config_hash(cell_settings(BUDGETS["full"], Cell("room", transposed, 0)))
    assert cell_config(BUDGETS["full"], Cell("room", transposed, 0), Path("x")).model.encoding_options == {
        "form": "transposed"
    }


def test_plane_evidence_report_pairs_rows_with_prope_and_labels_target_geometry():
    from experiments.plane_evidence import markdown, row_report, uses_target_geometry
    from experiments.rows import Row

    def record(seed, psnr, planes=None):
        return {"seed": seed, "metrics": {"psnr": sum(psnr) / len(psnr)}, "per_scene": {"psnr": psnr}, "planes": planes}

    reference = [record(s, [20.0, 21.0, 22.0]) for s in (0, 1, 2)]
    errors = {
        "normal_error_deg": 30.0,
        "normal_error_deg_neutral": 90.0,
        "depth_rel_error": 0.2,
        "depth_rel_error_neutral": 1.0,
    }
    better = [record(s, [20.5, 21.5, 22.5], {"context": errors, "target": errors}) for s in (0, 1, 2)]
    report = row_report(better, reference)
    assert report["vs_reference"]["mean"] == pytest.approx(0.5) and report["vs_reference"]["excludes_zero"]
    assert report["planes"]["target"]["normal_error_deg"]["mean"] == 30.0
    assert uses_target_geometry(Row("hrope-lift", "oracle", options=(("scope", "all"),)))
    assert not uses_target_geometry(Row("hrope-lift", "oracle", options=(("targets", "transfer"),)))
    text = markdown(
        {
            "title": "t",
            "command": "c",
            "provenance": {"commit": "abc", "dirty": False},
            "generated": "now",
            "seeds": [0, 1, 2],
            "budget": {"name": "toy", "model": {}, "steps": 1, "batch_size": 1, "train_scenes": 1, "eval_scenes": 3},
            "datasets": {
                "room": [
                    {"row": "prope", "target_geometry": False, "trained_at": [], **row_report(reference, reference)},
                    {
                        "row": "hrope-lift (oracle, scope all)",
                        "target_geometry": True,
                        "trained_at": ["commit x"],
                        **report,
                    },
                ]
            },
        }
    )
    assert "| hrope-lift (oracle, scope all) † ‡ |" in text and "**+0.50 [+0.50, +0.50]**" in text
    assert "30.0 (90.0)" in text and "0.200 (1.000)" in text and "commit x" in text
