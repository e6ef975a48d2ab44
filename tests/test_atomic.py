"""Outputs are written whole (hrope.nvs.running.atomic): an interrupted write keeps the previous file and
leaves no temporary file, and every writer of src/ and benchmarks/ goes through the module."""

from __future__ import annotations

import errno
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors import SafetensorError

import hrope.nvs.running.atomic as atomic
from hrope import InputError
from hrope.nvs.running.atomic import (
    StorageError,
    append_line,
    atomic_path,
    atomic_open,
    save_figure,
    save_image,
    write_bytes,
    write_json,
    write_text,
)
from hrope.nvs.evaluation.plane_accuracy import read_log

ROOT = Path(__file__).resolve().parents[1]


class Interrupted(BaseException):
    """Stands for KeyboardInterrupt / SIGTERM's exception in the middle of a write."""


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


class PartialFigure:
    """A figure (or PIL image) whose save writes part of a file, then is interrupted."""

    def savefig(self, handle, **options) -> None:
        handle.write(b"\x89PNG half a figure")
        raise Interrupted

    save = savefig


def test_an_interrupted_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "results.json"
    write_json(path, {"psnr": 20.0})
    before = path.read_bytes()
    with pytest.raises(Interrupted):
        with atomic_open(path, "w") as handle:
            handle.write('{"psnr": 2')  # half of the new file
            raise Interrupted
    assert path.read_bytes() == before and leftovers(tmp_path) == []
    for saver in (save_figure, save_image):
        figure = tmp_path / "metrics.png"
        write_bytes(figure, b"old figure")
        with pytest.raises(Interrupted):
            saver(PartialFigure(), figure)
        assert figure.read_bytes() == b"old figure" and leftovers(tmp_path) == []


@pytest.mark.parametrize(
    "write",
    [
        lambda path: write_text(path, "new"),
        lambda path: write_json(path, {"new": 1}),
        lambda path: write_bytes(path, b"new"),
    ],
    ids=["text", "json", "bytes"],
)
def test_an_interruption_just_before_the_rename_keeps_the_old_file(tmp_path, monkeypatch, write):
    path = tmp_path / "out.txt"
    path.write_text("old")

    def interrupted(source, target):
        assert Path(source).read_bytes() in (b"new", b'{\n  "new": 1\n}')  # written whole, then stopped
        raise Interrupted

    monkeypatch.setattr(atomic.os, "replace", interrupted)
    with pytest.raises(Interrupted):
        write(path)
    assert path.read_text() == "old" and leftovers(tmp_path) == []


STORAGE_ERRNOS = [errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM]


def refused(code: int):
    def refuse(*args, **kwargs):
        raise OSError(code, os.strerror(code))

    return refuse


class RefusedFigure:
    """A figure whose save writes part of a file, then meets a file system that refuses the rest."""

    def __init__(self, code: int) -> None:
        self.code = code

    def savefig(self, handle, **options) -> None:
        handle.write(b"\x89PNG half a figure")
        raise OSError(self.code, os.strerror(self.code))


@pytest.mark.parametrize("code", STORAGE_ERRNOS, ids=[errno.errorcode[c] for c in STORAGE_ERRNOS])
def test_a_refused_write_is_one_storage_error_naming_the_file_and_what_was_kept(tmp_path, monkeypatch, code):
    """Refused while writing, at the fsync, at the rename, or appending a line: a StorageError (an
    InputError) naming the file, its previous version intact, no temporary file left."""
    reason = f"{os.strerror(code)} ({errno.errorcode[code]})"
    writes = {
        "figure.png": (lambda path: save_figure(RefusedFigure(code), path), None),
        "results.md": (lambda path: write_text(path, "new"), (atomic.os, "fsync")),
        "results.json": (lambda path: write_json(path, {"new": 1}), (atomic.os, "replace")),
        "log.jsonl": (lambda path: append_line(path, '{"new": 1}'), (atomic.os, "write")),
    }
    for name, (write, where) in writes.items():
        for path, kept in ((tmp_path / name, f"the previous {name} is intact"), (tmp_path / "new" / name, None)):
            if kept:
                path.write_text("old\n")
            with monkeypatch.context() as patch:
                if where is not None:
                    patch.setattr(*where, refused(code))
                with pytest.raises(StorageError) as caught:
                    write(path)
            assert isinstance(caught.value, InputError) and (caught.value.path, caught.value.code) == (path, code)
            assert str(caught.value).startswith(f"cannot write {path}: {reason}; {kept or 'nothing was written'}; ")
            left = path.read_text() if path.exists() else None  # a log that was not there is left empty
            assert left == ("old\n" if kept else "" if name == "log.jsonl" else None)
            assert leftovers(path.parent) == []


def test_a_line_a_full_disk_cuts_short_is_taken_back(tmp_path, monkeypatch):
    log = tmp_path / "segments.jsonl"
    append_line(log, '{"step": 1}')
    write = os.write

    def half_then_full(descriptor, data):
        if len(data) < 20:  # the rest of the line
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return write(descriptor, bytes(data[: len(data) // 2]))

    monkeypatch.setattr(atomic.os, "write", half_then_full)
    with pytest.raises(StorageError, match="the previous segments.jsonl is intact"):
        append_line(log, '{"step": 2, "loss": 0.5}')
    monkeypatch.undo()
    assert log.read_text() == '{"step": 1}\n'
    append_line(log, '{"step": 2, "loss": 0.5}')  # once there is room, the log reads whole
    assert [json.loads(line)["step"] for line in log.read_text().splitlines()] == [1, 2]


def test_a_rust_writers_storage_fault_is_a_storage_error_and_other_errors_pass(tmp_path):
    """safetensors (Rust) raises its own error whose message ends in ``(os error N)``; an error that
    is no storage fault (no errno, an I/O error, a missing file) passes unchanged."""
    path = tmp_path / "checkpoint.safetensors"
    for error, code in (
        (SafetensorError(f"Error while serializing: I/O error: No space left (os error {errno.ENOSPC})"), errno.ENOSPC),
        (SafetensorError(f"Error while serializing: I/O error: No such file (os error {errno.ENOENT})"), None),
        (OSError("disk on fire"), None),
        (OSError(errno.EIO, os.strerror(errno.EIO)), None),
    ):
        with pytest.raises(StorageError if code else type(error)) as caught:
            with atomic_path(path) as temporary:
                temporary.write_bytes(b"half a checkpoint")
                raise error
        assert (caught.value.code == code) if code else caught.value is error
        assert list(tmp_path.iterdir()) == []


def test_a_value_that_is_not_json_leaves_no_file(tmp_path):
    with pytest.raises(TypeError):
        write_json(tmp_path / "results.json", {"bad": object()})
    assert list(tmp_path.iterdir()) == []


def test_written_files_keep_the_usual_permissions(tmp_path):
    path = write_text(tmp_path / "results.md", "x")
    reference = tmp_path / "plain.md"
    reference.write_text("x")
    assert path.stat().st_mode == reference.stat().st_mode  # not mkstemp's 0600


def protocol_results(psnr: float) -> list[dict]:
    points = [{"value": v, "metrics": {"psnr": psnr + v, "ssim": 0.5, "lpips": "unavailable"}} for v in (1.0, 2.0)]
    run = {"name": "prope", "checkpoint": "runs/prope", "num_scenes": 2, "num_skipped": 0}
    return [{**run, "protocol": "zoom", "axis": "zoom factor", "points": points}]


def test_an_interrupted_protocol_report_keeps_the_previous_figure(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    from hrope.nvs.evaluation.protocol_report import write_results

    write_results(protocol_results(20.0), tmp_path)
    before = (tmp_path / "metrics.png").read_bytes()
    assert before.startswith(b"\x89PNG")

    def interrupted(self, fname, **options):  # a figure cut off halfway
        if hasattr(fname, "write"):
            fname.write(before[:100])
        else:
            Path(fname).write_bytes(before[:100])
        raise Interrupted

    monkeypatch.setattr(Figure, "savefig", interrupted)
    with pytest.raises(Interrupted):
        write_results(protocol_results(30.0), tmp_path)
    assert (tmp_path / "metrics.png").read_bytes() == before
    assert json.loads((tmp_path / "results.json").read_text())[0]["points"][0]["metrics"]["psnr"] == 31.0
    assert leftovers(tmp_path) == []


WRITERS = re.compile(
    r"\.write_text\(|\.write_bytes\(|\.savefig\(|json\.dump\(|torch\.save\(|np\.save\(|save_file\(|"
    r"Image\.fromarray\([^\n]*\)\.save\(|open\([^)\n]*[\"'][wax]b?\+?[\"']"
)


def test_every_writer_goes_through_the_atomic_module():
    """No file in src/ or benchmarks/ writes a file directly; a writer that needs a path or a handle
    (safetensors, numpy) writes the temporary file of ``atomic_path`` / ``atomic_open``."""
    direct = []
    for path in sorted([*(ROOT / "src").rglob("*.py"), *(ROOT / "benchmarks").glob("*.py")]):
        if path.name == "atomic.py":
            continue
        lines = path.read_text().splitlines()
        for number, line in enumerate(lines):
            if WRITERS.search(line.split("#")[0]):
                inside = any("with atomic_" in previous for previous in lines[max(0, number - 3) : number])
                if not inside:
                    direct.append(f"{path.relative_to(ROOT)}:{number + 1}: {line.strip()}")
    assert direct == []


APPENDER = """
import sys
from hrope.nvs.running.atomic import append_line
for i in range(60):
    append_line(sys.argv[1], '{"step": %d, "writer": "%s", "pad": "%s"}' % (i, sys.argv[2], "x" * 2000))
"""


def test_concurrent_appenders_never_interleave_within_a_line(tmp_path):
    log = tmp_path / "log.jsonl"
    env_path = {"PYTHONPATH": str(ROOT / "src")}
    writers = [subprocess.Popen([sys.executable, "-c", APPENDER, str(log), name], env=env_path) for name in ("a", "b")]
    assert [w.wait(timeout=60) for w in writers] == [0, 0]
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert sorted((r["writer"], r["step"]) for r in records) == sorted((w, i) for w in "ab" for i in range(60))


def test_a_log_line_cut_short_by_a_kill_is_left_out(tmp_path):
    log = tmp_path / "plane_accuracy.jsonl"
    append_line(log, json.dumps({"step": 1, "loss": 0.5}))
    with open(log, "a") as handle:  # what a writer killed during its line leaves
        handle.write('{"step": 2, "lo')
    assert read_log(log) == [{"step": 1, "loss": 0.5}]
