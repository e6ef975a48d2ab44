"""Files written whole: every output of the toolkit and the benchmarks goes through this module.

A file is written to a temporary file in its own folder (``.<name>.<random>.tmp``: unique, so
concurrent writers never share one), flushed and fsynced, then moved over ``path`` with
``os.replace`` (atomic on POSIX and Windows within one file system), and the folder is fsynced
(POSIX; best effort). A reader therefore sees the previous file or the new one, never a part of
either; a write that fails or is interrupted (an exception, SIGTERM, a full disk) removes its
temporary file and leaves the previous file as it was. A process killed outright (SIGKILL, power
loss) can leave a ``.tmp`` file behind, never a partial ``path``.

:func:`atomic_path` is the general form (the caller writes the temporary path it is given, e.g.
safetensors' ``save_file``); :func:`atomic_open` yields an open file; :func:`write_text`,
:func:`write_json`, :func:`write_bytes`, :func:`save_figure` (matplotlib) and :func:`save_image`
(PIL) cover the common outputs. :func:`append_line` adds one line to a log (``segments.jsonl``,
``plane_accuracy.jsonl``) in a single ``write`` call on an ``O_APPEND`` descriptor.

Storage faults: a write the file system refuses (full: ENOSPC; over quota: EDQUOT; read-only:
EROFS; not permitted: EACCES, EPERM) raises a :class:`StorageError` naming the file and saying
what was kept (its previous version, or nothing written) and what to do; its caller may add what
else was kept and the command to run next (:meth:`StorageError.keeping`: the checkpoint a run
resumes from). :func:`storage_faults` turns the faults of any block of writes into this error.
"""

from __future__ import annotations

import errno
import json
import os
import re
import secrets
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import IO, Any

from ...errors import InputError

__all__ = [
    "StorageError",
    "storage_faults",
    "atomic_path",
    "atomic_open",
    "write_text",
    "write_json",
    "write_bytes",
    "save_figure",
    "save_image",
    "append_line",
    "is_temporary",
]

_TEMPORARY = re.compile(r"\..+\.[0-9a-f]{8}\.tmp")

# the storage faults, each with what the user does about it
_REMEDIES = {
    errno.ENOSPC: "free space",
    errno.EDQUOT: "free space within the quota",
    errno.EROFS: "make the file system writable",
    errno.EACCES: "make the folder writable",
    errno.EPERM: "make the folder writable",
}
# how Rust's std::io::Error ends its message (safetensors' writer is Rust and raises no OSError)
_RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)")


class StorageError(InputError):
    """A write the file system refused (module doc): ``cannot write PATH: REASON (CODE); KEPT;
    REMEDY[, then NEXT]`` in one line. ``path``, ``code`` (the errno), ``kept`` and ``then`` are
    attributes."""

    def __init__(self, path: str | Path, code: int, kept: str, then: str | None = None) -> None:
        self.path, self.code, self.kept, self.then = Path(path), code, kept, then
        remedy = _REMEDIES[code] + (f", then {then}" if then else "")
        super().__init__(f"cannot write {path}: {os.strerror(code)} ({errno.errorcode[code]}); {kept}; {remedy}")

    def keeping(self, kept: str, then: str | None = None, path: str | Path | None = None) -> StorageError:
        """The same fault with the caller's ``kept`` and ``then`` (and ``path``, e.g. the folder a
        temporary file belonged to)."""
        return StorageError(self.path if path is None else path, self.code, kept, then)


def _storage_errno(error: BaseException) -> int | None:
    """The errno of ``error`` when it is a storage fault (ENOSPC, EDQUOT, EROFS, EACCES, EPERM), else
    None: an ``OSError``'s, or the ``(os error N)`` at the end of a Rust writer's message."""
    if isinstance(error, OSError):
        code = error.errno
    else:
        match = _RUST_OS_ERROR.search(str(error))
        code = int(match.group(1)) if match else None
    return code if code in _REMEDIES else None


@contextmanager
def storage_faults(path: str | Path) -> Iterator[None]:
    """Raise a storage fault of the block (an ``OSError``, or a Rust writer's error, with one of the
    module doc's errnos) as a :class:`StorageError` naming ``path`` and saying whether its previous
    version (the one there when the block began) is intact; other errors pass unchanged."""
    existed = os.path.exists(path)
    try:
        yield
    except StorageError:
        raise
    except Exception as error:
        code = _storage_errno(error)
        if code is None:
            raise
        kept = f"the previous {Path(path).name} is intact" if existed else "nothing was written"
        raise StorageError(path, code, kept) from error


def is_temporary(name: str) -> bool:
    """Whether a file name is one of this module's temporary files (``.<name>.<8 hex>.tmp``)."""
    return _TEMPORARY.fullmatch(name) is not None


def _fsync_folder(folder: Path) -> None:
    """Make a rename in ``folder`` durable (POSIX); a no-op where folders cannot be opened (Windows)."""
    try:
        descriptor = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


@contextmanager
def atomic_path(path: str | Path, *, durable: bool = True) -> Iterator[Path]:
    """Yield a temporary path beside ``path`` for the caller to write; on a clean exit it replaces
    ``path`` (fsynced first when ``durable``), on any exception it is removed and ``path`` is left
    as it was. The parent folder is created when missing. A storage fault raises
    :class:`StorageError`."""
    path = Path(path)
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    with storage_faults(path):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            yield temporary
            if durable:
                _fsync_file(temporary)
            os.replace(temporary, path)
        except BaseException:
            with suppress(OSError):  # none was made, or a read-only file system refuses even this
                temporary.unlink()
            raise
    if durable:
        _fsync_folder(path.parent)


@contextmanager
def atomic_open(path: str | Path, mode: str = "w", *, durable: bool = True, **options: Any) -> Iterator[IO[Any]]:
    """``open(temporary, mode, **options)`` (``mode`` ``"w"`` or ``"wb"``; text is UTF-8 unless
    ``encoding`` is given) whose file replaces ``path`` when the block ends without an error."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_open writes a whole file: mode must be 'w' or 'wb', got {mode!r}")
    if mode == "w":
        options.setdefault("encoding", "utf-8")
    with atomic_path(path, durable=durable) as temporary:
        with open(temporary, mode, **options) as handle:
            yield handle


def write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` whole."""
    with atomic_open(path, "w") as handle:
        handle.write(text)
    return Path(path)


def write_bytes(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` whole."""
    with atomic_open(path, "wb") as handle:
        handle.write(data)
    return Path(path)


def write_json(path: str | Path, value: Any, *, indent: int | None = 2, newline: bool = False) -> Path:
    """Write ``json.dumps(value, indent=indent)`` to ``path`` whole (encoded before the file is
    touched, so a value that is not JSON-able leaves no file); ``newline`` adds a final newline."""
    return write_text(path, json.dumps(value, indent=indent) + ("\n" if newline else ""))


def _format(path: Path) -> str:
    """The image format named by ``path``'s suffix (``png``, ``jpeg``, ``pdf``, ...)."""
    suffix = path.suffix.lower().lstrip(".")
    if not suffix:
        raise ValueError(f"{path}: no suffix to tell the image format by")
    return {"jpg": "jpeg", "tif": "tiff"}.get(suffix, suffix)


def save_figure(figure: Any, path: str | Path, **options: Any) -> Path:
    """``figure.savefig`` (a matplotlib figure) to ``path`` whole, in the format of its suffix."""
    path = Path(path)
    with atomic_open(path, "wb") as handle:
        figure.savefig(handle, format=_format(path), **options)
    return path


def save_image(image: Any, path: str | Path, **options: Any) -> Path:
    """``image.save`` (a PIL image) to ``path`` whole, in the format of its suffix."""
    path = Path(path)
    with atomic_open(path, "wb") as handle:
        image.save(handle, format=_format(path).upper(), **options)
    return path


def append_line(path: str | Path, line: str) -> None:
    """Append ``line`` plus a newline to ``path`` (created, with its folder, when missing) in one
    ``write`` on an ``O_APPEND`` descriptor, then fsync: concurrent appenders never interleave
    within a line; a process killed during the call can leave at most its own line incomplete,
    which readers skip. A storage fault raises :class:`StorageError`, the part of the line written
    before it taken back."""
    data = (line.rstrip("\n") + "\n").encode("utf-8")
    with storage_faults(path):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)
        written = 0
        try:
            while written < len(data):  # one call unless the OS writes short
                written += os.write(descriptor, data[written:])
            os.fsync(descriptor)
        except BaseException:
            if 0 < written < len(data):
                _take_back(descriptor, written)
            raise
        finally:
            os.close(descriptor)


def _take_back(descriptor: int, count: int) -> None:
    """Remove the last ``count`` bytes ``descriptor`` appended (a line a full disk cut short), unless
    another writer has appended since."""
    end = os.lseek(descriptor, 0, os.SEEK_CUR)  # with O_APPEND: the end of this descriptor's last write
    with suppress(OSError):
        if os.fstat(descriptor).st_size == end:
            os.ftruncate(descriptor, end - count)
