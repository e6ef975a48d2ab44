"""Storage faults on a real small file system (a size-limited tmpfs mounted for each test): a full
disk or a read-only file system under training, evaluation, export or the image cache is one line
naming the file and what was kept, leaves no partial file, and a run resumes bit-exactly once
space is back. Mounting needs root (or CAP_SYS_ADMIN) on Linux; elsewhere the tests skip and say
why. The same faults injected without a mount: tests/test_atomic.py, test_cli_errors.py."""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _lvsm_helpers import small_config
from safetensors.torch import load_file, save_file
from test_cli_errors import SMALL, TINY
from test_image_cache import SIZE, assert_same, write_capture

from hrope.nvs import cli
from hrope.nvs.config import apply_overrides, load_config, update_config
from hrope.nvs.data.real.loaders import load_scene
from hrope.nvs.model import build_model
from hrope.nvs.running.atomic import StorageError, append_line, atomic_path, write_bytes
from hrope.nvs.running.checkpoints import CHECKPOINT_NAME, load_checkpoint, save_checkpoint
from hrope.nvs.running.folder_lock import LOCK_NAME, FolderLock
from hrope.nvs.running.train import train
from hrope.nvs.running.train_step import make_optimizer

MiB = 1 << 20
FULL = "No space left on device (ENOSPC)"
READ_ONLY = "Read-only file system (EROFS)"
TRAIN = [*SMALL[: SMALL.index("--steps")], "--steps", "4", "--train.checkpoint_every", "2"]


def _mount(*options: str) -> subprocess.CompletedProcess:
    return subprocess.run(["mount", *options], capture_output=True, text=True)


@pytest.fixture
def small_fs(tmp_path, request):
    """``small_fs(size)``: a new tmpfs of ``size`` bytes under ``tmp_path``, unmounted after the test."""
    if sys.platform != "linux" or shutil.which("mount") is None:
        pytest.skip("a size-limited tmpfs needs Linux and its mount command")

    def mount(size: int) -> Path:
        point = tmp_path / f"fs{len(list(tmp_path.glob('fs*')))}"
        point.mkdir()
        done = _mount("-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(point))
        if done.returncode != 0:
            reason = (done.stderr.strip().splitlines() or ["mount failed"])[0]
            pytest.skip(f"cannot mount a tmpfs here (it needs root or CAP_SYS_ADMIN): {reason}")
        request.addfinalizer(lambda: subprocess.run(["umount", "--lazy", str(point)], capture_output=True))
        return point

    return mount


def read_only(point: Path) -> None:
    done = _mount("-o", "remount,ro", str(point))
    assert done.returncode == 0, done.stderr


def fill(point: Path, leave: int) -> Path:
    """A file that leaves about ``leave`` bytes free on the file system of ``point``."""
    stats = os.statvfs(point)
    filler = point / "filler"
    with open(filler, "wb") as handle:
        handle.write(bytes(stats.f_bavail * stats.f_frsize - leave))
    return filler


def stderr_line(capsys, code: int) -> str:
    """The one line a failed command ended with (after its progress bar, whose lines start with its name)."""
    *progress, line = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and all(bar.startswith("train ") for bar in progress), progress
    return line


def model_weights(folder: Path) -> dict:
    return {k: v for k, v in load_file(str(folder / CHECKPOINT_NAME)).items() if k.startswith("model.")}


def test_a_full_disk_stops_training_at_the_next_checkpoint_and_the_resume_is_exact(small_fs, tmp_path, capsys):
    fs = small_fs(4 * MiB)
    whole = tmp_path / "whole"
    train(apply_overrides(load_config(TINY), [*TRAIN, "--out", str(whole)]), progress=False)
    size = (whole / CHECKPOINT_NAME).stat().st_size
    filler = fill(fs, leave=size * 3 // 2)  # room for one checkpoint, not for its successor beside it
    run = fs / "run"
    line = stderr_line(capsys, cli.run(["train", TINY, *TRAIN, "--out", str(run)]))
    resume = ["train", str(run / "config.yaml"), "--out", str(run)]
    assert line == (
        f"hrope train: error: cannot write {run / CHECKPOINT_NAME}: {FULL}; the checkpoint of step 2 is intact; "
        f"free space, then run `{shlex.join(['hrope', *resume])}` to resume"
    )
    assert not [p for p in run.iterdir() if p.name.endswith(".tmp")] and load_checkpoint(run)["step"] == 2
    filler.unlink()
    assert cli.run(resume) == 0
    expected, resumed = model_weights(whole), model_weights(run)
    assert expected.keys() == resumed.keys() and all(torch.equal(expected[k], resumed[k]) for k in expected)


def test_writes_that_do_not_fit_leave_the_previous_file_and_no_partial_one(small_fs):
    fs = small_fs(256 * 1024)
    path = write_bytes(fs / "a.bin", b"old")
    with pytest.raises(StorageError) as caught:
        write_bytes(path, bytes(300 * 1024))
    assert str(caught.value) == f"cannot write {path}: {FULL}; the previous a.bin is intact; free space"
    with pytest.raises(StorageError, match=r"\(ENOSPC\); nothing was written; free space$"):
        with atomic_path(fs / "b.safetensors") as temporary:  # safetensors' writer is Rust: no OSError
            save_file({"x": torch.zeros(300 * 1024 // 4)}, str(temporary))
    assert path.read_bytes() == b"old" and sorted(p.name for p in fs.iterdir()) == ["a.bin"]


def test_a_log_line_that_does_not_fit_is_taken_back(small_fs):
    fs = small_fs(256 * 1024)
    log = fs / "plane_accuracy.jsonl"
    append_line(log, '{"step": 1}')
    fill(fs, leave=0)  # the log's page has room for part of the next line, the disk for no more
    with pytest.raises(StorageError, match=f"cannot write {log}: {re.escape(FULL)}; the previous"):
        append_line(log, json.dumps({"step": 2, "pad": "x" * 8000}))
    assert log.read_text() == '{"step": 1}\n'


@pytest.fixture
def run_dir(tmp_path) -> Path:
    """A run folder with an untrained small model's checkpoint (made directly, no training)."""
    config = update_config(small_config(encoding="prope"), {"train": {"out": str(tmp_path / "run")}})
    model = build_model(config)
    save_checkpoint(tmp_path / "run" / CHECKPOINT_NAME, model, make_optimizer(model, config.train), 1, config)
    return tmp_path / "run"


def test_a_read_only_file_system_under_train_eval_and_export(small_fs, run_dir, capsys):
    fs = small_fs(MiB)
    read_only(fs)
    again = "make the file system writable, then run `{}` again"
    cases = [
        (["train", TINY, *SMALL, "--out", str(fs / "run")], fs / "run" / LOCK_NAME, "no checkpoint was written"),
        (["eval", str(run_dir), "--out", str(fs / "eval")], fs / "eval" / "config.yaml", "nothing was written"),
        (
            ["export", str(run_dir), str(fs / "model")],
            fs / "model",
            "nothing was written and no temporary folder is left",
        ),
    ]
    for argv, path, kept in cases:
        line = stderr_line(capsys, cli.run(argv))
        rerun = again.format(shlex.join(["hrope", *argv]))
        assert line == f"hrope {argv[0]}: error: cannot write {path}: {READ_ONLY}; {kept}; {rerun}"
    with pytest.raises(StorageError, match=f"cannot write {fs / 'run' / LOCK_NAME}: Read-only"):
        FolderLock(fs / "run", "train.out").acquire()
    assert list(fs.iterdir()) == []


def test_an_export_onto_a_full_disk_keeps_the_previous_saved_model(small_fs, run_dir, capsys):
    fs = small_fs(2 * MiB)
    model = fs / "model"
    assert cli.run(["export", str(run_dir), str(model)]) == 0
    before = {p.name: p.read_bytes() for p in model.iterdir()}
    filler = fill(fs, leave=len(before["model.safetensors"]) // 2)
    argv = ["export", str(run_dir), str(model), "--overwrite"]
    capsys.readouterr()
    assert stderr_line(capsys, cli.run(argv)) == (
        f"hrope export: error: cannot write {model}: {FULL}; the previous saved model in {model} is intact and no "
        f"temporary folder is left; free space, then run `{shlex.join(['hrope', *argv])}` again"
    )
    assert {p.name: p.read_bytes() for p in model.iterdir()} == before
    assert sorted(p.name for p in fs.iterdir()) == ["filler", "model"]
    filler.unlink()
    assert cli.run(argv) == 0


def test_an_image_cache_on_a_full_disk_warns_once_and_leaves_no_partial_entry(small_fs, tmp_path, caplog):
    write_capture(tmp_path / "scene")
    fs = small_fs(256 * 1024)
    filler = fill(fs, leave=0)
    with caplog.at_level(logging.WARNING, logger="hrope.nvs.data"):
        scene = load_scene(tmp_path / "scene", SIZE, cache_dir=fs / "cache")
    assert_same(scene, load_scene(tmp_path / "scene", SIZE))
    assert caplog.text.count(f"image cache {fs / 'cache'} cannot be written; views are decoded every time") == 1
    assert f"cannot write {fs / 'cache'}" in caplog.text and FULL in caplog.text
    assert [p for p in fs.rglob("*") if p.is_file()] == [filler]  # no partial entry, no temporary file
