"""Run folders shared by processes: one trainer per run folder (a second is refused, naming the
holder; a killed holder's folder is taken over), evaluation reads whole checkpoints while training
writes them, and processes sharing the image cache never read a partial entry."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from _lvsm_helpers import small_config

from hrope.nvs.running import tensor_files
from hrope.nvs.running.checkpoints import CHECKPOINT_NAME, load_checkpoint, load_model, save_checkpoint
from hrope.nvs.cli import run
from hrope.nvs.config import save_config, update_config
from hrope.nvs.data.real.image_cache import ImageCache
from hrope.nvs.model import build_model
from hrope.nvs.running.folder_lock import LOCK_NAME, FolderInUseError, FolderLock, holder_of
from hrope.nvs.running.train import train

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}

HOLDER = """
import sys, time
from hrope.nvs.running.folder_lock import FolderLock
FolderLock(sys.argv[1], "train.out").acquire()
print("held", flush=True)
time.sleep(120)
"""


def hold(folder: Path) -> subprocess.Popen:
    """A process that holds ``folder``'s lock until killed."""
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder)], env=ENV, stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    return holder


def tiny_config(out: Path) -> dict:
    config = small_config(encoding="prope")
    config = update_config(config, {"train": dict(out=str(out), steps=2, image_every=0)})
    return config


def test_a_second_train_into_a_held_folder_is_refused_then_taken_over_when_its_holder_dies(tmp_path, capsys, caplog):
    out = tmp_path / "run"
    config_file = save_config(tiny_config(out), tmp_path / "config")
    holder = hold(out)
    try:
        assert run(["train", str(config_file), "--out", str(out)]) == 2
        message = capsys.readouterr().err.strip()
        assert "\n" not in message and message.startswith(f"hrope train: error: train.out {out} is in use by ")
        assert f"process {holder.pid} on host {socket.gethostname()!r}" in message
        assert not (out / CHECKPOINT_NAME).exists() and not (out / "config.yaml").exists()  # nothing written
        with pytest.raises(FolderInUseError, match=f"process {holder.pid} "):
            train(tiny_config(out), progress=False)
    finally:
        holder.kill()  # SIGKILL: the OS releases its lock, its record stays
        holder.wait()
    assert holder_of(out)["pid"] == holder.pid
    (out / ".checkpoint.safetensors.1a2b3c4d.tmp").write_bytes(b"half a checkpoint")  # what a kill leaves
    (out / "notes.tmp").write_text("the user's")
    with caplog.at_level(logging.WARNING, logger="hrope.nvs.running.folder_lock"):
        assert train(tiny_config(out), progress=False).step == 2
    assert f"taking over from process {holder.pid}" in caplog.text
    assert [p.name for p in out.glob("*.tmp")] == ["notes.tmp"] and load_checkpoint(out)["step"] == 2
    assert holder_of(out) is None  # released at the end of the run: the record is emptied


def test_two_locks_exclude_each_other_in_one_process_and_release_cleanly(tmp_path):
    with FolderLock(tmp_path, "train.out"):
        assert holder_of(tmp_path)["pid"] == os.getpid()
        with pytest.raises(FolderInUseError, match=f"train.out {tmp_path} is in use by process {os.getpid()} "):
            FolderLock(tmp_path, "train.out").acquire()
    assert (tmp_path / LOCK_NAME).read_text() == ""
    with FolderLock(tmp_path):  # free again
        pass


WRITER = """
import sys, time, torch
sys.path.insert(0, sys.argv[2])
from _lvsm_helpers import small_config
from hrope.nvs.running.checkpoints import save_checkpoint
from hrope.nvs.model import build_model
config = small_config(encoding="prope")
model = build_model(config)
for step in range(1, 21):
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.fill_(step / 100)
    save_checkpoint(sys.argv[1], model, None, step, config)
    time.sleep(0.05)  # a training step
"""


@pytest.mark.slow
def test_eval_reads_whole_checkpoints_while_training_writes_them(tmp_path):
    """Every read during 20 rewrites is one complete checkpoint: checksum verified, and every
    parameter holds that checkpoint's value."""
    path = tmp_path / CHECKPOINT_NAME
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(Path(__file__).parent)], env=ENV)
    steps = set()
    try:
        while writer.poll() is None:
            if path.exists():
                model, _ = load_model(path)
                values = torch.cat([p.detach().flatten() for p in model.parameters()])
                assert torch.all(values == values[0]), "a checkpoint mixed two writes"
                steps.add(round(float(values[0]) * 100))
    finally:
        writer.wait(timeout=120)
    assert writer.returncode == 0
    assert len(steps) >= 2, steps  # the reads overlapped the writes
    assert load_checkpoint(path)["step"] == 20 and not list(tmp_path.glob("*.tmp"))


def test_a_checkpoint_replaced_while_it_is_read_is_read_whole(tmp_path, monkeypatch):
    """The reader opens the file once: a checkpoint that training replaces between the header and
    the tensors is still read as the one that was opened (safetensors' ``safe_open`` opens the file
    by name twice, and paired one file's checksum with the next one's tensors in the suite)."""
    config = small_config(encoding="prope")
    model = build_model(config)
    path, newer = tmp_path / CHECKPOINT_NAME, tmp_path / "newer.safetensors"
    for step, target in ((1, path), (2, newer)):
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.fill_(step / 100)
        save_checkpoint(target, model, None, step, config)

    def open_then_replace(file, *args, **kwargs):
        handle = open(file, *args, **kwargs)
        if Path(file) == path and newer.exists():
            os.replace(newer, path)  # the next checkpoint lands while this one is being read
        return handle

    monkeypatch.setattr(tensor_files, "open", open_then_replace, raising=False)
    loaded, _ = load_model(path)
    assert all(torch.all(p == 0.01) for p in loaded.parameters())
    monkeypatch.undo()
    assert load_checkpoint(path)["step"] == 2


CACHE_WRITER = """
import sys
import numpy as np
from hrope.nvs.data.real.image_cache import ImageCache
cache = ImageCache(sys.argv[1])
for round_ in range(5):
    for k in range(8):
        pixels = np.full((128, 128, 3), k, dtype=np.uint8)
        cache.put(f"{k:02d}" + "0" * 62, pixels, (512, 512))
"""


@pytest.mark.slow
def test_processes_sharing_the_image_cache_never_read_a_partial_entry(tmp_path):
    writers = [subprocess.Popen([sys.executable, "-c", CACHE_WRITER, str(tmp_path)], env=ENV) for _ in range(2)]
    cache, reads = ImageCache(tmp_path), 0
    while any(w.poll() is None for w in writers):
        for k in range(8):
            entry = cache.get(f"{k:02d}" + "0" * 62)
            if entry is not None:
                pixels, size = entry
                assert size == (512, 512) and pixels.shape == (128, 128, 3) and np.all(pixels == k)
                reads += 1
    assert [w.returncode for w in writers] == [0, 0] and reads > 0
    assert not list(tmp_path.rglob("*.tmp"))
