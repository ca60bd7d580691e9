"""Files written all or none: the one way the node and the tools write a file.

``StagedFiles.add(path, data)`` writes ``data`` to a temporary file in ``path``'s directory and
fsyncs it; ``commit()`` renames every staged file over its target, ``discard()`` removes them. Used
as a context manager it commits on a normal exit and discards on an exception (which goes on).

What a reader and a later run can rely on:
- no partial file ever: a target is only ever replaced by a rename of a complete, fsynced file;
- a failed write keeps the previous files: a target that exists and is not a regular file (a
  directory, a FIFO) is refused when it is staged, before any target is touched; a write that
  fails while staging (disk full, a read-only directory) touches no target; a rename that fails
  during the commit puts back the targets renamed before it (from hard links of the previous
  files, taken just before each rename), so the set stays the previous one;
- a symlink at a target is replaced by the file, never followed (its target is left as it was);
- no temporary file is left behind by a failure (only a process killed outright leaves one,
  named ``.NAME.*.tmp`` beside its target).
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path


class StagedFiles:
    """Stage files, then commit them all or discard them all (module docstring)."""

    def __init__(self) -> None:
        self._staged: dict[Path, str] = {}   # target -> its temporary file, in staging order

    def __enter__(self) -> "StagedFiles":
        return self

    def __exit__(self, kind, error, traceback) -> None:
        if kind is None:
            self.commit()
        else:
            self.discard()

    def add(self, path: str | Path, data: bytes) -> Path:
        """Stage ``data`` for ``path`` (its directory must exist). Raises OSError, staging nothing
        for it, when the target is a directory or another non-regular file or the write fails;
        ValueError for a target staged twice. Returns the target's path."""
        path = Path(os.path.abspath(path))
        if path in self._staged:
            raise ValueError(f"{path} is staged twice")
        if path.is_dir() and not path.is_symlink():
            raise IsADirectoryError(f"{path} is a directory, not a regular file: nothing was written")
        if path.exists() and not path.is_symlink() and not path.is_file():
            raise OSError(f"{path} exists and is not a regular file: nothing was written")
        handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        self._staged[path] = temporary   # before the write: a failed one is discarded too
        with os.fdopen(handle, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(temporary, 0o644)
        return path

    def discard(self) -> None:
        """Remove every staged file; no target changes."""
        for temporary in self._staged.values():
            Path(temporary).unlink(missing_ok=True)
        self._staged.clear()

    def commit(self) -> list[Path]:
        """Rename every staged file over its target, in staging order, and fsync their
        directories; returns the targets. A rename that fails puts back those before it and
        discards the rest (the error goes on)."""
        tried: list[tuple[Path, str, bool, str | None]] = []   # (target, temporary, existed, old one's link)
        try:
            for target, temporary in self._staged.items():
                existed, backup = os.path.lexists(target), None
                if existed:
                    backup = temporary + ".old"
                    try:
                        os.link(target, backup, follow_symlinks=False)   # the symlink itself, if one
                    except OSError:   # no hard links on this file system: this one cannot be put back
                        backup = None
                tried.append((target, temporary, existed, backup))
                os.replace(temporary, target)   # replaces a symlink itself, not its target
        except BaseException:
            for target, temporary, existed, backup in reversed(tried):
                renamed = not os.path.exists(temporary)
                if renamed and backup is not None:
                    os.replace(backup, target)
                elif renamed and not existed:
                    target.unlink(missing_ok=True)
                elif backup is not None:
                    Path(backup).unlink(missing_ok=True)
            self.discard()
            raise
        for _, _, _, backup in tried:
            if backup is not None:
                Path(backup).unlink(missing_ok=True)
        targets = list(self._staged)
        self._staged.clear()
        for directory in {target.parent for target in targets}:   # the renames survive a power loss
            fd = os.open(directory, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        return targets


def write_files(files: dict, staged: StagedFiles | None = None) -> list[Path]:
    """{path: bytes} written all or none (``StagedFiles``); returns the targets. With ``staged``
    they are only added to it, for its owner to commit with its own files."""
    if staged is not None:
        return [staged.add(path, data) for path, data in files.items()]
    with StagedFiles() as own:
        targets = [own.add(path, data) for path, data in files.items()]
    return targets
