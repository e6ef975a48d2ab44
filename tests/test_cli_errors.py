"""The CLI's error contract: every user error is one line on stderr and exit status 2, checked
before any work where it can be; anything else is a bug and keeps its traceback."""

from __future__ import annotations

import errno
import json
import os
import shlex
from pathlib import Path

import pytest
import torch
from _lvsm_helpers import small_config
from safetensors import safe_open
from safetensors.torch import save_file

import hrope.nvs.running.checkpoints as checkpoints
from hrope.nvs import cli
from hrope.nvs.running.checkpoints import CheckpointError, load_checkpoint, load_model, save_checkpoint
from hrope.nvs.config import ConfigError, apply_overrides, load_config, update_config
from hrope.nvs.model import build_model
from hrope.nvs.running.train_step import make_optimizer

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
    "--steps",
    "1",
]
LEGACY_FORMAT = "hrope-checkpoint-v1"  # the format without a checksum, whose metadata is trusted as read


def one_error_line(capsys, code: int) -> str:
    """The single stderr line of a run that ended with exit status 2."""
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("hrope")
    return lines[0]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A run folder with an untrained small model's checkpoint (made directly, no training)."""
    folder = tmp_path_factory.mktemp("run")
    config = small_config(encoding="hrope-lift")
    config = update_config(config, {"train": {"out": str(folder)}})
    model = build_model(config)
    save_checkpoint(folder / "checkpoint.safetensors", model, make_optimizer(model, config.train), 1, config)
    return folder


@pytest.fixture
def a_file(tmp_path) -> Path:
    path = tmp_path / "results.txt"
    path.write_text("keep me")
    return path


TRAIN_CASES = [
    (["--train.grad_clip", "-1"], "train.grad_clip"),
    (["--train.grad_clip", "0"], "train.grad_clip"),
    (["--lr", "nan"], "train.lr"),
    (["--lr", "abc"], "train.lr"),
    (["--steps", "true"], "train.steps"),
    (["--device", "tpu"], "train.device"),
    (["--data.num_context", "0"], "data.num_context"),
    (["--data.kind", "xyz"], "data.kind"),
    (["--model.dim", "true"], "model.dim"),
    (["--model.layers", "-1"], "model.layers"),
    (["--model.heads", "0"], "model.heads"),
]


@pytest.mark.parametrize("args,key", TRAIN_CASES, ids=[" ".join(a) for a, _ in TRAIN_CASES])
def test_train_value_errors(tmp_path, capsys, args, key):
    code = cli.run(["train", TINY, *SMALL, "--out", str(tmp_path / "run"), *args])
    assert key in one_error_line(capsys, code)
    assert not (tmp_path / "run" / "checkpoint.safetensors").exists()


def test_train_cuda_without_cuda_and_an_out_file(tmp_path, capsys, monkeypatch, a_file):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    code = cli.run(["train", TINY, *SMALL, "--out", str(tmp_path / "run"), "--device", "cuda"])
    assert "train.device is 'cuda' but torch.cuda.is_available() is False" in one_error_line(capsys, code)
    for out in (a_file, a_file / "sub"):
        code = cli.run(["train", TINY, *SMALL, "--out", str(out)])
        assert f"train.out '{out}': '{a_file}' is an existing file" in one_error_line(capsys, code)
    assert a_file.read_text() == "keep me"


@pytest.mark.parametrize(
    "args,key",
    [
        (["--num-scenes", "-1"], "argument --num-scenes: must be a positive integer, got '-1'"),
        (["--num-scenes", "0"], "argument --num-scenes: must be a positive integer, got '0'"),
        (["--num-scenes", "abc"], "argument --num-scenes"),
        (["--device", "tpu"], "--device must be one of auto, cpu, cuda"),
        (["--data.num_context", "0"], "data.num_context must be a positive integer"),
        (["--protocol", "zoom", "--factors", "nan"], "argument --factors: must be a finite number"),
    ],
)
def test_eval_option_errors(run_dir, capsys, args, key):
    assert key in one_error_line(capsys, cli.run(["eval", str(run_dir), *args]))
    assert not (run_dir / "eval").exists()


def test_out_that_is_a_file(run_dir, capsys, a_file):
    for argv in (
        ["eval", str(run_dir)],
        ["eval", str(run_dir), "--protocol", "standard"],
        ["viz", "planes", str(run_dir)],
        ["viz", "plane-accuracy", str(run_dir)],
    ):
        code = cli.run([*argv, "--out", str(a_file)])
        assert f"--out '{a_file}': '{a_file}' is an existing file" in one_error_line(capsys, code)
    assert a_file.read_text() == "keep me"


def test_viz_option_errors(run_dir, capsys):
    code = cli.run(["viz", "planes", str(run_dir), "--num-scenes", "0"])
    assert "argument --num-scenes: must be a positive integer" in one_error_line(capsys, code)
    code = cli.run(["viz", "planes", str(run_dir), "--layer", "7", "--num-scenes", "1", "--out", str(run_dir / "v")])
    assert "layer 7 is out of range" in one_error_line(capsys, code)
    code = cli.run(["viz", "planes", str(run_dir), "--head", "1", "--num-scenes", "1", "--out", str(run_dir / "v")])
    assert "head 1 is out of range: the model predicts planes for 1 head(s)" in one_error_line(capsys, code)
    assert "unrecognized arguments: --data.kind room" in one_error_line(
        capsys, cli.run(["viz", "planes", str(run_dir), "--data.kind", "room"])
    )


def test_usage_errors_are_one_line(capsys):
    assert "the following arguments are required" in one_error_line(capsys, cli.run([]))
    assert "(see hrope eval --help)" in one_error_line(capsys, cli.run(["eval"]))


def tamper(source: Path, target: Path, **metadata: str) -> Path:
    """A copy of checkpoint ``source`` in the checksum-less legacy format with ``metadata`` replaced."""
    with safe_open(str(source), framework="pt") as handle:
        tensors = {key: handle.get_tensor(key) for key in handle.keys()}
        values = {**handle.metadata(), **metadata, "format": LEGACY_FORMAT}
    values.pop("checksum", None)
    target.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(target), metadata=values)
    return target


TAMPERED_CONFIGS = {
    "not JSON": "{model: tiny",
    "not a mapping": "[1, 2]",
    "an unknown key": json.dumps({"train": {"learning_rate": 1}}),
    "a bad value": json.dumps({"train": {"lr": -1}}),
}


@pytest.mark.parametrize("config", TAMPERED_CONFIGS.values(), ids=TAMPERED_CONFIGS.keys())
def test_tampered_config_metadata(run_dir, tmp_path, capsys, config):
    path = tamper(run_dir / "checkpoint.safetensors", tmp_path / "checkpoint.safetensors", config=config)
    assert str(path) in one_error_line(capsys, cli.run(["eval", str(path)]))
    with pytest.raises(CheckpointError, match="config"):
        load_model(path)


def test_tampered_checkpoint_without_the_legacy_format(run_dir, tmp_path, capsys):
    """A current-format checkpoint whose metadata was edited (its checksum, if any, left as it was)."""
    with safe_open(str(run_dir / "checkpoint.safetensors"), framework="pt") as handle:
        tensors = {key: handle.get_tensor(key) for key in handle.keys()}
        metadata = {**handle.metadata(), "config": "{model: tiny"}
    path = tmp_path / "checkpoint.safetensors"
    save_file(tensors, str(path), metadata=metadata)
    assert str(path) in one_error_line(capsys, cli.run(["eval", str(path)]))


def test_tampered_step_metadata(tmp_path, capsys):
    out = tmp_path / "run"
    config = apply_overrides(load_config(TINY), [*SMALL, "--out", str(out)])
    model = build_model(config)
    source = save_checkpoint(tmp_path / "source.safetensors", model, make_optimizer(model, config.train), 0, config)
    path = tamper(source, out / "checkpoint.safetensors", step="one")
    with pytest.raises(CheckpointError, match="step"):
        load_checkpoint(path)
    assert str(path) in one_error_line(capsys, cli.run(["train", TINY, *SMALL, "--out", str(out)]))


def test_os_errors_for_user_paths_and_one_line_messages(tmp_path, capsys, monkeypatch):
    def fail(error):
        def train(config):
            raise error

        monkeypatch.setattr(cli, "train", train)
        return cli.run(["train", TINY, "--out", str(tmp_path / "run")])

    assert "Permission denied" in one_error_line(capsys, fail(PermissionError(13, "Permission denied", "x")))
    assert one_error_line(capsys, fail(ConfigError("first\n  second"))) == "hrope train: error: first second"


# errno -> the reason and the remedy the one line gives
STORAGE_FAULTS = {
    errno.ENOSPC: ("No space left on device (ENOSPC)", "free space"),
    errno.EDQUOT: ("Disk quota exceeded (EDQUOT)", "free space within the quota"),
    errno.EROFS: ("Read-only file system (EROFS)", "make the file system writable"),
}


def refuse(code: int):
    def refused(*args, **kwargs):
        raise OSError(code, os.strerror(code))

    return refused


@pytest.mark.parametrize("code", STORAGE_FAULTS, ids=[errno.errorcode[c] for c in STORAGE_FAULTS])
def test_storage_faults_of_eval_and_export_are_one_line(run_dir, tmp_path, capsys, monkeypatch, code):
    reason, remedy = STORAGE_FAULTS[code]
    monkeypatch.setattr(os, "fsync", refuse(code))  # where a full disk's deferred write error surfaces
    out, model = tmp_path / "eval", tmp_path / "model"
    for argv, path, kept in (
        (["eval", str(run_dir), "--out", str(out)], out / "config.yaml", "nothing was written"),
        (["export", str(run_dir), str(model)], model, "nothing was written and no temporary folder is left"),
    ):
        line = one_error_line(capsys, cli.run(argv))
        again = shlex.join(["hrope", *argv])
        assert (
            line == f"hrope {argv[0]}: error: cannot write {path}: {reason}; {kept}; {remedy}, then run `{again}` again"
        )
    assert [p.name for p in tmp_path.iterdir()] == ["eval"] and list(out.iterdir()) == []  # no partial file


def test_a_checkpoint_the_disk_refuses_is_one_line(tmp_path, capsys, monkeypatch):
    def partial_then_refused(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"half a checkpoint")
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(checkpoints, "save_file", partial_then_refused)
    out = tmp_path / "run"
    argv = ["train", TINY, *SMALL, "--out", str(out)]
    code = cli.run(argv)
    *progress, line = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and all(bar.startswith("train none:") for bar in progress)  # the progress bar, then the line
    assert line == (
        f"hrope train: error: cannot write {out / 'checkpoint.safetensors'}: Read-only file system (EROFS); no "
        f"checkpoint was written; make the file system writable, then run `{shlex.join(['hrope', *argv])}` again"
    )
    assert not [p for p in out.iterdir() if p.name.startswith(".") or p.name.startswith("checkpoint")]


@pytest.mark.parametrize(
    "bug", [RuntimeError("boom"), ValueError("not an InputError"), KeyError("k"), OSError("disk on fire")]
)
def test_bugs_keep_their_traceback(tmp_path, monkeypatch, bug):
    def train(config):
        raise bug

    monkeypatch.setattr(cli, "train", train)
    with pytest.raises(type(bug)):
        cli.run(["train", TINY, "--out", str(tmp_path / "run")])
