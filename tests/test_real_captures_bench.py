"""The real-capture benchmark (experiments/real_captures.py, its sets in real_captures_sets.py) on
tiny synthetic captures in COLMAP's layout: its planned sets, its cell keys, a smoke run's records and
report, shards, and the leak rule."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import yaml

from experiments.real_captures import CaptureCellRunner, _shard, main, shard_cells
from experiments.real_captures import budget as make_budget
from experiments.real_captures_report import supported_budget
from experiments.plane_evidence import PLANNED_ROWS
from experiments.real_captures_sets import (
    BEST_DEPTH,
    HELD_OUT,
    LEARNED,
    PRETRAIN,
    PRIORS,
    PROPE,
    SETS,
    SFM,
    CaptureSet,
    Data,
    from_scratch,
    synthetic_row,
)
from experiments.rows import BUDGETS, Cell
from hrope.nvs.data.real.colmap_points import write_colmap_model
from hrope.nvs.data.synthetic.generator import make_scene

NAMES = ("maryRose", "mother_child", "third")  # the first two: the held-out set's captures
VIEWS = 12  # per capture: test targets 0 and 8, validation targets 4, training views the rest


@pytest.fixture(scope="module")
def captures(tmp_path_factory) -> list[Path]:
    """Three 12-view orbits of synthetic objects written as COLMAP text models (128x128 renders: SIFT
    finds features for the SfM points at this size, not at 32)."""
    root = tmp_path_factory.mktemp("captures")
    for index, name in enumerate(NAMES):
        scene = make_scene(3, index, "object", VIEWS, (128, 128), frames=list(range(0, 4 * VIEWS, 4)))
        write_colmap_model(scene, root / name, points_per_view=1)
    return [root / name for name in NAMES]


@pytest.fixture(autouse=True)
def data_cache(tmp_path_factory, monkeypatch):
    """The decoded views and SfM points go to one temporary cache for the module, not the user's."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.getbasetemp() / "xdg-cache"))


def labels(name: str) -> list[str]:
    return [arm.label for arm in SETS[name].arms]


def pretrained(labels: list[str]) -> list[str]:
    """Arm labels as a pre-trained set's arms carry them."""
    return [
        label[:-1] + f", pre-trained on {PRETRAIN}]" if label.endswith("]") else f"{label} [pre-trained on {PRETRAIN}]"
        for label in labels
    ]


def test_the_sets_are_the_ones_written_down():
    depth = "external, targets transfer"
    assert labels("curve") == ["prope", "urope", "hrope-lift (targets transfer)", BEST_DEPTH.label]
    assert BEST_DEPTH.label == f"hrope-lift-uv ({depth}, fit robust) [sfm depth]"
    assert SETS["curve"].steps == (600, 3000) and SETS["curve"].split == "val"
    assert labels("choices") == ["prope", "prope [background composite]", "prope [pre-trained on object]"]
    assert labels("planned") == pretrained(
        [
            "prope",
            "prope (rays world)",
            "urope",
            f"worldrope ({depth}, fit robust, footprint False) [sfm depth]",
            f"hrope-lift ({depth}, fit robust, rays world) [sfm depth]",
            f"hrope-lift-uv ({depth}, fit robust) [sfm depth]",
            "hrope-lift (targets transfer)",
            f"rayrope ({depth}, fit robust, depth known) [sfm depth]",
        ]
    )
    priors = labels("priors")
    assert priors[0] == pretrained([LEARNED.label])[0] and len(priors) == 7
    assert [a.data.geometry for a in SETS["priors"].arms] == ["none"] + ["sfm"] * 3 + ["priors"] * 3
    for a, b in SETS["priors"].pairs:  # each priors row against its SfM twin: the same encoding and rays
        first, second = SETS["priors"].arms[a], SETS["priors"].arms[b]
        assert (first.data.geometry, second.data.geometry) == ("priors", "sfm")
        assert (first.row.encoding, first.row.model_options) == (second.row.encoding, second.row.model_options)
        assert dict(first.row.options)["use_normals"] is True and dict(second.row.options)["fit"] == "robust"
    assert SETS["priors"].test_every == 4
    assert labels("held-out") == pretrained(["prope", "urope", LEARNED.label, BEST_DEPTH.label])
    assert [arm.label for arm in from_scratch(SETS["held-out"]).arms] == [
        "prope",
        "urope",
        LEARNED.label,
        BEST_DEPTH.label,
    ]
    for name in ("curve", "choices"):  # the sets that decide the pre-training refuse to drop it
        with pytest.raises(ValueError, match="does not pre-train every row"):
            from_scratch(SETS[name])
    assert SETS["held-out"].held_out == HELD_OUT == ("maryRose", "mother_child")
    assert SETS["held-out"].protocol == "captures"
    assert {name: spec.split for name, spec in SETS.items()} == {
        "curve": "val",
        "choices": "val",
        "planned": "eval",
        "priors": "eval",
        "held-out": "eval",
    }
    for spec in SETS.values():  # depth only where a row reads it; every depth row is a planned row of
        for arm in spec.arms:  # experiments/plane_evidence.py with the geometry source's options added
            external = arm.row.predictor == "external"
            assert (arm.data.geometry != "none") == external, arm.label
            added = SFM if arm.data.geometry == "sfm" else PRIORS
            assert not external or replace(arm.row, options=arm.row.options[: -len(added)]) in PLANNED_ROWS
            assert not external or synthetic_row(arm.row) in PLANNED_ROWS  # pre-trained on rendered depth
            assert external or synthetic_row(arm.row) == arm.row


SCRATCH = from_scratch(SETS["planned"])


def held_out_argv(captures, out: Path, *steps: str) -> list[str]:
    """The held-out set from scratch (tiny step counts; pre-training is the ``full`` budget's 600 steps)."""
    return [
        "--captures",
        *map(str, captures),
        "--out",
        str(out),
        "--set",
        "held-out",
        "--from-scratch",
        "--steps",
        *steps,
    ]


def runner_for(captures, tmp_path, spec=SCRATCH, steps=600) -> CaptureCellRunner:
    return CaptureCellRunner(make_budget(steps, [0]), tmp_path / "cache", captures, spec, {})


def test_the_key_changes_with_captures_cameras_geometry_and_split(captures, tmp_path):
    cell = Cell(Data().name, PROPE.row, 0)
    key = runner_for(captures, tmp_path).key(cell)
    assert runner_for(captures[:2], tmp_path).key(cell) != key
    assert runner_for(captures, tmp_path, replace(SCRATCH, split="val")).key(cell) != key
    assert runner_for(captures, tmp_path, steps=3000).key(cell) != key
    sfm = Cell(Data("sfm").name, PROPE.row, 0)
    composite = Cell(Data(background="composite").name, PROPE.row, 0)
    started = Cell(Data(pretrain=PRETRAIN).name, PROPE.row, 0)
    spec = replace(SCRATCH, arms=SCRATCH.arms + SETS["planned"].arms[:1] + (replace(PROPE, data=Data("sfm")),))
    spec = replace(spec, arms=spec.arms + (replace(PROPE, data=Data(background="composite")),))
    keys = {runner_for(captures, tmp_path, spec).key(c) for c in (cell, sfm, composite, started)}
    assert len(keys) == 4 and key in keys
    moved = tmp_path / "elsewhere"
    for capture in captures:
        shutil.copytree(capture, moved / capture.name)
    copies = [moved / name for name in NAMES]
    assert runner_for(copies, tmp_path).key(cell) == key  # the cameras' content, not the folder's place
    images = moved / "third" / "sparse" / "0" / "images.txt"
    lines = images.read_text().splitlines()
    first = next(i for i, line in enumerate(lines) if not line.startswith("#"))
    fields = lines[first].split()
    fields[5] = repr(float(fields[5]) + 1e-3)  # the first camera moved by a thousandth of the unit
    lines[first] = " ".join(fields)
    images.write_text("\n".join(lines) + "\n")
    assert runner_for(copies, tmp_path).key(cell) != key


def test_a_smoke_run_records_per_scene_psnr_with_captures(captures, tmp_path, capsys):
    """``--set held-out`` for 2 steps in two shards, then the report: trained on `third`, scored on
    the test targets (views 0 and 8) of the two held-out captures; every row, the SfM one included,
    has per-scene PSNR with labels."""
    pytest.importorskip("hrope.nvs.data.real.sfm", reason="the SfM geometry source is not in this tree")
    out = tmp_path / "out"
    argv = held_out_argv(captures, out, "2") + ["--seeds", "0", "1"]
    trained = []
    for shard in ("0/2", "1/2"):
        assert main([*argv, "--shard", shard]) is None
        trained.append([line for line in capsys.readouterr().out.splitlines() if line.startswith("[")])
        assert not (out / "cells.jsonl").exists() and not (out / "real_captures.json").exists()
    assert [len(lines) for lines in trained] == [4, 4] and not set(trained[0]) & set(trained[1])
    report = main(argv)
    assert "steps" not in capsys.readouterr().out  # the final call trains nothing: every cell is finished
    cells = [json.loads(line) for line in (out / "cells.jsonl").read_text().splitlines()]
    assert len(cells) == 2 * len(SETS["held-out"].arms)
    for cell in cells:
        record = cell["record"]
        assert record["split"] == "eval" and record["steps"] == 2
        assert record["scene_captures"] == ["maryRose", "maryRose", "mother_child", "mother_child"]
        assert len(record["per_scene"]["psnr"]) == 4 == len(record["context_angles"])
        assert all(0 < a <= 180 for angles in record["context_angles"] for a in angles)
    with_sfm = [cell["record"]["sfm"] for cell in cells if "sfm" in cell["record"]]
    assert len(with_sfm) == 2  # the SfM row's two seeds, with the points' statistics of every capture
    assert all(set(sfm) == set(NAMES) and all(s["points"] > 0 for s in sfm.values()) for sfm in with_sfm)
    assert report["sfm"] == with_sfm[0]
    rows = report["budgets"]["2"]
    assert [row["row"] for row in rows] == [arm.label for arm in from_scratch(SETS["held-out"]).arms]
    assert set(rows[-1]["psnr_per_capture"]) == set(HELD_OUT)
    assert rows[-1]["vs_reference"]["seeds"] == 2 and rows[-1]["vs_reference"]["captures"] == 2
    written = json.loads((out / "real_captures.json").read_text())
    assert written["command"] == "python -m experiments.real_captures " + " ".join(argv)
    assert written["budgets"]["2"][0]["metrics"]["psnr"]["n"] == 2
    assert f"| {BEST_DEPTH.label} |" in (out / "real_captures.md").read_text()
    shutil.rmtree(out / "cache")
    again = main([*argv, "--report-only"])  # from the finished cells alone
    assert again["budgets"] == written["budgets"]


def _rows(psnr: dict[str, float], delta: dict[str, tuple[float, float, float]]) -> list[dict]:
    """Report rows with mean PSNR and a difference to the reference (mean, low, high)."""
    rows = []
    for label, value in psnr.items():
        mean, low, high = delta.get(label, (0.0, 0.0, 0.0))
        rows.append(
            {
                "row": label,
                "metrics": {"psnr": {"mean": value}},
                "vs_reference": {"mean": mean, "low": low, "high": high},
            }
        )
    return rows


def test_the_budget_rule():
    """The smallest budget whose order and differences agree with the largest one's, at every larger budget."""
    late = _rows(
        {"prope": 17.0, "urope": 17.3, "hrope-lift": 17.1}, {"urope": (0.3, 0.1, 0.5), "hrope-lift": (0.1, -0.1, 0.3)}
    )
    agrees = _rows(
        {"prope": 16.0, "urope": 16.2, "hrope-lift": 16.1}, {"urope": (0.2, 0.0, 0.4), "hrope-lift": (0.1, -0.2, 0.4)}
    )
    reordered = _rows(
        {"prope": 16.0, "urope": 15.9, "hrope-lift": 16.1}, {"urope": (-0.1, -0.3, 0.1), "hrope-lift": (0.1, -0.1, 0.3)}
    )
    outside = _rows(
        {"prope": 16.0, "urope": 16.9, "hrope-lift": 16.1}, {"urope": (0.9, 0.7, 1.1), "hrope-lift": (0.1, -0.1, 0.3)}
    )
    assert supported_budget({600: agrees, 3000: late})["supported"] == 600
    assert supported_budget({600: reordered, 3000: late})["supported"] == 3000
    assert supported_budget({600: outside, 3000: late})["supported"] == 3000
    # a budget that agrees is not supported when a larger one before the last does not
    assert supported_budget({300: agrees, 600: reordered, 3000: late})["supported"] == 3000
    assert supported_budget({300: reordered, 600: agrees, 3000: late})["supported"] == 600


def test_shards_partition_the_cells():
    cells = list(range(11))
    shards = [shard_cells(cells, (i, 3)) for i in range(3)]
    assert sorted(c for shard in shards for c in shard) == cells
    assert all(set(a).isdisjoint(b) for i, a in enumerate(shards) for b in shards[i + 1 :])
    assert _shard("1/2") == (1, 2)
    for text in ("2/2", "x", "1/0"):
        with pytest.raises(Exception, match="--shard"):
            _shard(text)


@pytest.mark.parametrize("geometry", ["none", "sfm"])
def test_no_row_dataset_gives_a_target_view_depth(captures, tmp_path, geometry):
    """The data variants of the sets' rows that the fixture can give (it has no priors files and no
    masks), in every split: the target view carries no depth and no normals; with SfM depth the
    context views do carry some."""
    if geometry == "sfm":
        pytest.importorskip("hrope.nvs.data.real.sfm", reason="the SfM geometry source is not in this tree")
    (data,) = {arm.data for spec in SETS.values() for arm in spec.arms if arm.data == Data(geometry)}
    runner = runner_for(captures, tmp_path, CaptureSet("leak", "leak", (replace(PROPE, data=data),)))
    config = runner.config(Cell(data.name, PROPE.row, 0), tmp_path / "cell")
    for split in ("train", "val", "eval"):
        scenes = [runner.dataset(config, split)[i] for i in range(len(runner.dataset(config, split)))]
        for scene in scenes:
            assert scene.depth is None or torch.isinf(scene.depth[2]).all()
            assert scene.normals is None or (scene.normals[2] == 0).all()
        assert (geometry == "sfm") == any(torch.isfinite(s.depth[:2]).any() for s in scenes if s.depth is not None)


def test_the_held_out_set_refuses_captures_without_its_held_out_ones(captures, tmp_path):
    with pytest.raises(SystemExit, match=r"held-out captures \['maryRose', 'mother_child'\]: give them in --captures"):
        main(["--captures", str(captures[2]), "--out", str(tmp_path), "--set", "held-out", "--steps", "1"])
    assert not (tmp_path / "cells.jsonl").exists()


def test_every_budget_of_a_run_reaches_cells_jsonl(captures, tmp_path):
    """Two budgets in one call: the runners of both write one ``cells.jsonl``, so neither budget's
    records overwrite the other's, whether the cells are trained now or read from the cache."""
    pytest.importorskip("hrope.nvs.data.real.sfm", reason="the SfM geometry source is not in this tree")
    out = tmp_path / "out"
    argv = held_out_argv(captures, out, "1", "2")
    for extra in ([], ["--report-only"]):
        (out / "cells.jsonl").unlink(missing_ok=True)
        main([*argv, "--seeds", "0", *extra])
        records = [json.loads(line)["record"] for line in (out / "cells.jsonl").read_text().splitlines()]
        assert sorted(r["steps"] for r in records) == [1] * 4 + [2] * 4


def test_a_cell_trained_for_the_validation_split_is_scored_on_the_test_split_without_training(captures, tmp_path):
    """``--trained-in``: the held-out set's cells trained and scored on the validation split are
    evaluated on the test split from their own final checkpoints (no training step), and score what a
    cell trained for the test split scores (training does not depend on the scored split)."""
    pytest.importorskip("hrope.nvs.data.real.sfm", reason="the SfM geometry source is not in this tree")
    argv = ["--captures", *map(str, captures), "--set", "held-out", "--from-scratch", "--steps", "2", "--seeds", "0"]
    main([*argv, "--out", str(tmp_path / "val"), "--split", "val"])
    main([*argv, "--out", str(tmp_path / "test"), "--trained-in", str(tmp_path / "val" / "cache")])
    main([*argv, "--out", str(tmp_path / "fresh")])
    reused, fresh = (
        {r["row"]: r for r in (json.loads(line)["record"] for line in (tmp_path / name / "cells.jsonl").open())}
        for name in ("test", "fresh")
    )
    assert reused.keys() == fresh.keys() and len(reused) == 4
    for row, record in reused.items():
        assert record["split"] == "eval" and record["resumed_from_step"] == 2 and record["train_seconds"] is None
        assert record["checkpoint_of"].startswith(f"{record['dataset']}/") and "checkpoint_of" not in fresh[row]
        assert record["per_scene"]["psnr"] == fresh[row]["per_scene"]["psnr"]


def test_each_pre_trained_row_starts_from_its_own_synthetic_cell(captures, tmp_path, monkeypatch):
    """A pre-trained set (held-out, with the ``full`` budget cut to 2 steps): every arm's run starts
    (``train.init_from``) from the synthetic ``object`` cell of its own row with its seed, the SfM
    row's without the SfM fit (the synthetic scenes' rendered depth), and that cell is trained."""
    pytest.importorskip("hrope.nvs.data.real.sfm", reason="the SfM geometry source is not in this tree")
    tiny = replace(BUDGETS["full"], steps=2, warmup=1, train_scenes=4, eval_scenes=2, protocol_scenes=2)
    monkeypatch.setitem(BUDGETS, "full", tiny)
    out = tmp_path / "out"
    main(["--captures", *map(str, captures), "--out", str(out), "--set", "held-out", "--steps", "2", "--seeds", "1"])
    synthetic = out / "cache" / "synthetic" / PRETRAIN
    assert sorted(p.name for p in synthetic.iterdir()) == sorted(
        synthetic_row(a.row).key for a in SETS["held-out"].arms
    )
    for arm in SETS["held-out"].arms:
        (folder,) = (out / "cache" / arm.data.name / arm.row.key).glob("seed1-*")
        start = Path(yaml.safe_load((folder / "config.yaml").read_text())["train"]["init_from"])
        assert start.parent == synthetic / synthetic_row(arm.row).key and start.name.startswith("seed1-")
        assert (start / "checkpoint.safetensors").is_file()
    assert dict(synthetic_row(BEST_DEPTH.row).options).get("fit") is None
