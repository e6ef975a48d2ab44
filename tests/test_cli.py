"""The `hrope` command: train / eval / viz smoke runs on a tiny model, and clear errors."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from _lvsm_helpers import SMALL_MODEL  # noqa: F401  (sets one torch thread)

from hrope.nvs.cli import run

TINY = str(Path(__file__).parents[1] / "configs" / "tiny.yaml")
SMALL = [
    "--model.image_size",
    "32",
    "--model.dim",
    "48",
    "--model.layers",
    "2",
    "--model.heads",
    "2",
    "--data.num_scenes",
    "2",
    "--eval.num_scenes",
    "2",
    "--train.batch_size",
    "1",
    "--train.warmup",
    "1",
    "--train.threads",
    "1",
    "--eval.batch_size",
    "2",
    "--eval.num_grid_scenes",
    "2",
]


@pytest.mark.slow
def test_train_eval_viz_smoke(tmp_path, capsys):
    out = tmp_path / "run"
    assert run(["train", TINY, "--encoding", "hrope", "--steps", "3", "--out", str(out), *SMALL]) == 0
    assert (out / "checkpoint.safetensors").is_file()
    resolved = yaml.safe_load((out / "config.yaml").read_text())
    assert resolved["model"]["encoding"] == "hrope" and resolved["train"]["steps"] == 3
    assert "trained 3 steps" in capsys.readouterr().out

    assert run(["eval", str(out)]) == 0
    results = json.loads((out / "eval" / "results.json").read_text())
    assert set(results["metrics"]) == {"psnr", "ssim", "lpips", "st_lpips"}
    assert 0 < results["metrics"]["psnr"] < 60 and results["metrics"]["lpips"] == "unavailable"
    assert 0 < results["metrics"]["st_lpips"] < 1  # the dev extra installs stlpips-pytorch
    assert (
        (out / "eval" / "results.md")
        .read_text()
        .startswith("| model | PSNR ↑ | SSIM ↑ | LPIPS-Alex ↓ | ST-LPIPS (alex) ↓ |")
    )
    assert (out / "eval" / "grid.png").is_file() and (out / "eval" / "config.yaml").is_file()

    assert run(["viz", "planes", str(out / "checkpoint.safetensors"), "--num-scenes", "1"]) == 0
    assert (out / "viz" / "planes.png").is_file()
    (out / "viz" / "planes.png").unlink()
    assert run(["viz", "planes", str(out), "--num-scenes", "1"]) == 0  # a run folder: same place
    assert (out / "viz" / "planes.png").is_file()


def test_viz_planes_needs_a_plane_encoding(tmp_path, capsys):
    out = tmp_path / "none"
    assert run(["train", TINY, "--steps", "1", "--out", str(out), *SMALL]) == 0
    assert run(["viz", "planes", str(out)]) == 2
    assert "takes no planes" in capsys.readouterr().err


def test_clear_errors(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # configs/tiny.yaml's run folder is relative: refused runs may leave its lock
    assert run(["eval", str(tmp_path / "nope.safetensors")]) == 2
    assert "checkpoint not found" in capsys.readouterr().err
    assert run(["train", str(tmp_path / "missing.yaml")]) == 2
    assert "config file not found" in capsys.readouterr().err
    assert run(["train", TINY, "--encoding", "hrope-xyz"]) == 2
    assert "unknown encoding 'hrope-xyz'" in capsys.readouterr().err
    assert run(["train", TINY, "--train.learning_rate", "1"]) == 2
    assert "unknown config key 'train.learning_rate'" in capsys.readouterr().err


def test_override_before_the_path_is_a_clear_error(tmp_path, capsys):
    assert run(["eval", "--data.kind", "folder", str(tmp_path / "run")]) == 2
    assert "--data.kind comes before the checkpoint path; put overrides after it" in capsys.readouterr().err
    assert run(["train", "--steps", "5", TINY]) == 2
    assert "--steps comes before the config path; put overrides after it" in capsys.readouterr().err
    assert run(["eval", "--zoom-all", str(tmp_path / "nope")]) == 2  # a known flag: the usual errors
    assert "need --protocol" in capsys.readouterr().err


@pytest.mark.slow
def test_console_entry_point_reports_errors_with_exit_status_2(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "hrope.nvs.cli", "eval", str(tmp_path / "missing")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and "checkpoint not found" in result.stderr
