"""One writer per folder: an OS lock that names its holder and dies with it.

:class:`FolderLock` holds an exclusive ``flock`` on ``<folder>/train.lock`` (created when missing,
never deleted) and writes its holder there as one JSON line: ``pid``, ``host``, ``started``
(UTC) and ``command``. A second process that tries the folder gets a :class:`FolderInUseError`
naming that holder, at once (the lock is never waited for). The operating system releases the
lock when its process ends in any way (exit, exception, SIGKILL, a crash); after a power loss
there is no lock at all. So a folder a killed process left is taken over by the next process
without any cleanup by hand: the record it finds there (a holder that never released) is logged
as a warning, and the temporary files (:func:`hrope.nvs.running.atomic.is_temporary`) the killed writer
may have left in the folder are removed (no other file). On a clean release the record is emptied.

Platforms: Linux and macOS lock with ``flock(2)``. Locks are per open file, so two locks in one
process exclude each other too; a child made by ``fork`` shares its parent's lock. On NFS,
Linux maps ``flock`` to NFS byte-range locks (kernel 2.6.12 and later), which hold across
machines; a crashed NFS client's lock lasts until the server's lease expires. Where ``fcntl`` is
missing (Windows) nothing is locked and a warning says so.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
from datetime import datetime, timezone
from pathlib import Path
from types import TracebackType

from ...errors import InputError
from .atomic import is_temporary, storage_faults

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["LOCK_NAME", "FolderLock", "FolderInUseError", "holder_of"]

LOCK_NAME = "train.lock"

logger = logging.getLogger("hrope.nvs.running.folder_lock")


class FolderInUseError(InputError):
    """A folder that another live process is writing."""


def _describe(holder: dict | None) -> str:
    """``process 1234 on host 'h' (since ...: hrope train ...)`` of a holder record."""
    if not holder:
        return "another process (it has not written its pid yet)"
    return (
        f"process {holder.get('pid')} on host {holder.get('host')!r} "
        f"(since {holder.get('started')}: {holder.get('command')})"
    )


def _read(descriptor: int) -> dict | None:
    """The holder record of an open lock file; None when empty or unreadable."""
    try:
        text = os.pread(descriptor, 4096, 0).decode("utf-8", "replace").strip()
        record = json.loads(text) if text else None
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def holder_of(folder: str | Path) -> dict | None:
    """The record in ``folder``'s lock file (the holder, or a holder that never released), or None."""
    try:
        descriptor = os.open(Path(folder) / LOCK_NAME, os.O_RDONLY)
    except OSError:
        return None
    try:
        return _read(descriptor)
    finally:
        os.close(descriptor)


class FolderLock:
    """Exclusive use of ``folder`` by this process while entered (module doc); ``key`` names the
    folder's setting in the error (e.g. ``train.out``)."""

    def __init__(self, folder: str | Path, key: str = "folder") -> None:
        self.folder, self.key = Path(folder), key
        self._descriptor: int | None = None

    def acquire(self) -> FolderLock:
        """Take the lock or raise :class:`FolderInUseError` naming its holder; takes over a folder
        whose holder died (removing its temporary files)."""
        if fcntl is None:
            logger.warning("no fcntl on this platform: %s is not locked against other processes", self.folder)
            return self
        with storage_faults(self.folder / LOCK_NAME):  # a full or read-only file system: StorageError
            self.folder.mkdir(parents=True, exist_ok=True)
            descriptor = os.open(self.folder / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # BlockingIOError: another open file holds it
            holder = _read(descriptor)
            os.close(descriptor)
            raise FolderInUseError(
                f"{self.key} {self.folder} is in use by {_describe(holder)}; wait for it to end or stop it, "
                f"or use another {self.key}"
            ) from None
        stale = _read(descriptor)
        if stale is not None:
            logger.warning("%s: taking over from %s, which ended without releasing it", self.folder, _describe(stale))
        record = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])[:300] if sys.argv else "python",
        }
        try:
            with storage_faults(self.folder / LOCK_NAME):
                for leftover in self.folder.iterdir():
                    if is_temporary(leftover.name):
                        leftover.unlink(missing_ok=True)
                os.ftruncate(descriptor, 0)
                os.pwrite(descriptor, (json.dumps(record) + "\n").encode(), 0)
        except BaseException:
            os.close(descriptor)
            raise
        self._descriptor = descriptor
        return self

    def release(self) -> None:
        """Empty the record and release the lock (a no-op when not held)."""
        if self._descriptor is None:
            return
        descriptor, self._descriptor = self._descriptor, None
        try:
            os.ftruncate(descriptor, 0)
        finally:
            os.close(descriptor)  # closing the only descriptor releases the flock

    def __enter__(self) -> FolderLock:
        return self.acquire()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.release()
