"""Checkpoint integrity: checksums, finite weights on save and load, v1 checkpoints, failed writes,
stray temporary files, pickle payloads and mismatched tensors: never a silent load, never a raw
traceback."""

import errno
import json
import logging
import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch
from _lvsm_helpers import small_config
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

import hrope.nvs.running.checkpoints as checkpoints
from hrope.nvs.config import update_config
from hrope.nvs.running.checkpoints import (
    CHECKPOINT_NAME,
    LEGACY_FORMAT,
    CheckpointError,
    checksum,
    load_checkpoint,
    load_model,
    save_checkpoint,
)
from hrope.nvs.cli import run
from hrope.nvs.model import build_model
from hrope.nvs.running.atomic import StorageError
from hrope.nvs.running.train import train
from hrope.nvs.running.train_step import make_optimizer


def read(path: Path) -> tuple[dict, dict]:
    with safe_open(str(path), framework="pt") as handle:
        return {k: handle.get_tensor(k) for k in handle.keys()}, handle.metadata()


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A 4-step prope run stopped at step 2 (copy it before changing it)."""
    config = small_config(encoding="prope")
    config = update_config(config, {"train": {"out": str(tmp_path_factory.mktemp("trained") / "run")}})
    train(config, stop_at=2, progress=False)
    return Path(config.train.out)


@pytest.fixture
def run_copy(trained, tmp_path) -> Path:
    shutil.copytree(trained, tmp_path / "run")
    return tmp_path / "run"


def flip(path: Path, position: int, value: int = 0xFF) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= value
    path.write_bytes(bytes(data))


def data_start(path: Path) -> int:
    """Offset of the tensor bytes: 8 bytes of header length, then the JSON header."""
    return 8 + int.from_bytes(path.read_bytes()[:8], "little")


def test_the_checksum_covers_every_tensor_and_the_metadata(trained):
    tensors, metadata = read(trained / CHECKPOINT_NAME)
    assert metadata["checksum"] == checksum(tensors, metadata) and len(metadata["checksum"]) == 64
    assert any(k.startswith("optimizer.") for k in tensors) and "rng.torch" in tensors
    changed = dict(tensors, **{"rng.torch": tensors["rng.torch"].clone()})
    changed["rng.torch"][0] ^= 1
    assert checksum(changed, metadata) != metadata["checksum"]
    assert checksum(tensors, {**metadata, "step": "3"}) != metadata["checksum"]


def test_damaged_tensor_bytes_are_refused_everywhere(run_copy, capsys):
    path = run_copy / CHECKPOINT_NAME
    flip(path, (data_start(path) + path.stat().st_size) // 2)
    for load in (lambda: load_model(run_copy), lambda: load_checkpoint(path, build_model(small_config()))):
        with pytest.raises(CheckpointError, match=rf"^{path}: checksum mismatch: the file is damaged$"):
            load()
    config = small_config(encoding="prope")
    config = update_config(config, {"train": {"out": str(run_copy)}})
    with pytest.raises(CheckpointError, match="checksum mismatch"):  # resuming reads it too
        train(config, progress=False)
    assert run(["eval", str(run_copy)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "checksum mismatch: the file is damaged" in err and "psnr" not in err


@given(in_header=st.booleans(), position=st.floats(0, 1, exclude_max=True), value=st.integers(1, 255))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_no_changed_byte_loads_silently(trained, tmp_path, in_header, position, value):
    path = tmp_path / CHECKPOINT_NAME
    shutil.copyfile(trained / CHECKPOINT_NAME, path)
    start = data_start(path)
    low, high = (0, start) if in_header else (start, path.stat().st_size)
    flip(path, low + int(position * (high - low)), value)
    try:
        tensors, metadata = checkpoints._read_checkpoint(path)
    except CheckpointError:
        return
    original_tensors, original_metadata = read(trained / CHECKPOINT_NAME)  # e.g. a space of the header padding
    assert metadata == original_metadata and tensors.keys() == original_tensors.keys()
    assert all(torch.equal(tensors[k], original_tensors[k]) for k in tensors)


def test_non_finite_weights_are_never_written(run_copy):
    path = run_copy / CHECKPOINT_NAME
    before = path.read_bytes()
    config = small_config(encoding="prope")
    model = build_model(config)
    with torch.no_grad():
        model.head.weight[0, 0] = float("nan")
        model.blocks[0].attn.qkv.weight[0, 0] = float("inf")
    with pytest.raises(
        CheckpointError,
        match=r"refusing to write .*: non-finite model weights in "
        r"model\.blocks\.0\.attn\.qkv\.weight, model\.head\.weight$",
    ):
        save_checkpoint(path, model, make_optimizer(model, config.train), 9, config)
    assert path.read_bytes() == before and not list(run_copy.glob("*.tmp"))


def test_non_finite_weights_are_never_loaded(run_copy, capsys):
    path = run_copy / CHECKPOINT_NAME
    tensors, metadata = read(path)
    tensors["model.head.weight"][0, 0] = float("nan")
    metadata["checksum"] = checksum(tensors, metadata)  # a consistent file, as another tool might write it
    save_file(tensors, str(path), metadata=metadata)
    with pytest.raises(
        CheckpointError,
        match=r"non-finite model weights in model\.head\.weight; the checkpoint "
        "is unusable",
    ):
        load_model(path)
    assert run(["eval", str(run_copy)]) == 2  # not "psnr=nan" with status 0
    assert "non-finite model weights" in capsys.readouterr().err


def test_v1_checkpoints_without_a_checksum_load_with_a_warning(run_copy, caplog):
    path = run_copy / CHECKPOINT_NAME
    tensors, metadata = read(path)
    del metadata["checksum"]
    save_file(tensors, str(path), metadata={**metadata, "format": LEGACY_FORMAT})
    with caplog.at_level(logging.WARNING, logger="hrope.nvs.running.checkpoints"):
        model, _ = load_model(path)
    assert "has no checksum" in caplog.text and LEGACY_FORMAT in caplog.text
    for key, value in model.state_dict().items():
        assert torch.equal(value, tensors[f"model.{key}"])
    save_file(tensors, str(path), metadata=metadata)  # the current format must carry its checksum
    with pytest.raises(CheckpointError, match="checksum missing from a hrope-checkpoint-v2 checkpoint"):
        load_model(path)


# what safetensors' writer (Rust) raises on a full disk, and an OSError of a disk quota
DISK_FAULTS = {
    "full": (
        SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)"),
        "No space left on device (ENOSPC)",
        "free space",
    ),
    "quota": (
        OSError(errno.EDQUOT, os.strerror(errno.EDQUOT)),
        "Disk quota exceeded (EDQUOT)",
        "free space within the quota",
    ),
}


@pytest.mark.parametrize("fault,reason,remedy", DISK_FAULTS.values(), ids=DISK_FAULTS.keys())
def test_a_failed_write_leaves_the_previous_checkpoint(run_copy, monkeypatch, fault, reason, remedy):
    path = run_copy / CHECKPOINT_NAME
    before = path.read_bytes()

    def partial_then_fail(tensors, filename, metadata=None):
        Path(filename).write_bytes(before[: len(before) // 2])
        raise fault

    monkeypatch.setattr(checkpoints, "save_file", partial_then_fail)
    config = small_config(encoding="prope")
    config = update_config(config, {"train": {"out": str(run_copy)}})
    with pytest.raises(StorageError) as caught:
        train(config, progress=False)  # resumes at step 2, fails to write the step-4 checkpoint
    assert str(caught.value) == (
        f"cannot write {path}: {reason}; the checkpoint of step 2 is intact; {remedy}, then run "
        f"`hrope train {run_copy / 'config.yaml'} --out {run_copy}` to resume"
    )
    assert path.read_bytes() == before and not list(run_copy.glob("*.tmp"))
    assert load_checkpoint(path, build_model(config))["step"] == 2
    segment = json.loads((run_copy / "segments.jsonl").read_text().splitlines()[-1])
    assert (segment["outcome"], segment["end_step"], segment["checkpoint_step"]) == ("failed", 4, 2)
    monkeypatch.undo()
    assert train(config, progress=False).step == 4


def test_a_stray_temporary_file_is_never_a_checkpoint(run_copy, tmp_path):
    (run_copy / (CHECKPOINT_NAME + ".tmp")).write_bytes(b"half a checkpoint")  # an older version's name
    (run_copy / f".{CHECKPOINT_NAME}.0123abcd.tmp").write_bytes(b"half a checkpoint")
    config = small_config(encoding="prope")
    config = update_config(config, {"train": {"out": str(run_copy)}})
    assert train(config, stop_at=3, progress=False).step == 3  # resumed from step 2, not from a .tmp
    assert not (run_copy / f".{CHECKPOINT_NAME}.0123abcd.tmp").exists()  # removed when the folder is taken
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / (CHECKPOINT_NAME + ".tmp")).write_bytes(b"half a checkpoint")
    config = update_config(config, {"train": {"out": str(fresh)}})
    result = train(config, stop_at=1, progress=False)
    segment = json.loads((fresh / "segments.jsonl").read_text())
    assert result.step == 1 and segment["resumed_from_step"] is None  # a new run


class Payload:
    """Unpickling it would create a file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_a_pickle_payload_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / CHECKPOINT_NAME).write_bytes(pickle.dumps({"model": Payload(marker)}))
    with pytest.raises(CheckpointError, match="is not a readable safetensors checkpoint"):
        load_model(folder)
    config = small_config(encoding="prope")
    config = update_config(config, {"train": {"out": str(folder)}})
    with pytest.raises(CheckpointError, match="is not a readable safetensors checkpoint"):
        train(config, progress=False)
    assert not marker.exists()


def test_tensors_that_do_not_fit_the_model_are_one_line_errors(trained, tmp_path, capsys):
    tensors, metadata = read(trained / CHECKPOINT_NAME)
    config = json.loads(metadata["config"])
    model_section = dict(config["model"])
    cases = (
        ({"layers": 3}, r"missing: blocks\.2\.\S+, blocks\.2\.\S+, blocks\.2\.\S+ \(\+\d+ more\)"),
        ({"layers": 1}, r"unexpected: blocks\.1\."),
        ({"heads": 4}, r"mis-shaped: blocks\.0\.attn\.k_norm\.weight \(24,\) in the file, \(12,\) in the model"),
    )
    for changes, expected in cases:
        config["model"] = {**model_section, **changes}
        stored = {**metadata, "config": json.dumps(config)}
        stored["checksum"] = checksum(tensors, stored)
        path = tmp_path / f"{changes}.safetensors"
        save_file(tensors, str(path), metadata=stored)
        with pytest.raises(CheckpointError, match=rf"does not fit the model \(.*{expected}"):
            load_model(path)
        assert run(["viz", "planes", str(path)]) == 2
        assert capsys.readouterr().err.count("\n") == 1
    model = build_model(small_config(encoding="prope"))
    optimizer = torch.optim.AdamW(model.parameters())  # one group where the checkpoint has several
    with pytest.raises(CheckpointError, match="its optimizer state does not fit the optimizer"):
        load_checkpoint(trained, model, optimizer)
