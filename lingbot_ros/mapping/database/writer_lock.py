"""The map database's one-writer lock: ``<db>-writer.lock`` beside the file the path resolves to.

One process writes at a time: the writer holds an exclusive ``flock`` on the lock file, which
holds its pid. The lock sits beside the *resolved* file, so two paths to one database (a symlink,
``..``) meet at one lock; it is never followed through a symlink. The lock also tells a reader
whether a run without an end is being written now or died (``held``).
"""
from __future__ import annotations

import errno
import fcntl
import os
import stat
from pathlib import Path

from .blobs import MapDatabaseError
from .schema import describe_error


def lock_path(path: Path) -> Path:
    """``<db>-writer.lock`` beside the file the path resolves to: two processes reaching one
    database through different paths (a symlink, ``..``) meet at one lock."""
    return Path(f"{os.path.realpath(path)}-writer.lock")


class WriterLock:
    """The one-writer lock: an exclusive flock on ``lock_path(db)`` holding the owner's pid. The
    lock file is opened with O_NOFOLLOW: a symlink there is refused, never followed into the file
    it points at (whose content the pid would replace)."""

    def __init__(self, path: Path):
        self.path = lock_path(path)
        try:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError as error:
            if error.errno == errno.ELOOP:
                raise MapDatabaseError(f"{self.path} is a symlink, not followed (it would overwrite the file it "
                                       "points at); remove it: this run is not stored") from None
            raise MapDatabaseError(describe_error(error, self.path)) from None
        if not stat.S_ISREG(os.fstat(self._fd).st_mode):
            os.close(self._fd)
            raise MapDatabaseError(f"{self.path} is not a regular file; this run is not stored")
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.pread(self._fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(self._fd)
            raise MapDatabaseError(f"{path} is being written by another process (pid {owner}); "
                                   "this run is not stored") from None
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, str(os.getpid()).encode(), 0)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    @staticmethod
    def held(path: Path) -> bool:
        """Whether a writer holds ``path`` now (readers use it to tell a running run from a crashed one)."""
        try:
            fd = os.open(lock_path(path), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return False
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
