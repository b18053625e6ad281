"""Files that appear complete or not at all: written beside their target, fsynced, renamed over it.

Every file a run leaves for someone else to read (manifest, rank files, outputs, converted
models' markers) goes through here, so no reader, and no crash, ever sees half of one.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
from pathlib import Path
from typing import Any

from .errors import EvalError, RunFailed


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_error(path: Path, e: OSError) -> EvalError:
    reason = "disk full" if e.errno == errno.ENOSPC else (e.strerror or str(e))
    return EvalError(f"{path}: cannot write ({reason}); the previous version, if any, is unchanged")


def resumable_write_error(path: Path, e: OSError) -> RunFailed:
    """A write during generation failed: the batches journaled so far are safe, so the message
    says how to go on (the journal, the rank file and the claims all fail this way)."""
    reason = "disk full" if e.errno == errno.ENOSPC else (e.strerror or str(e))
    return RunFailed(f"{path}: cannot write ({reason}); the batches journaled before this one are kept: "
                     "make room, then rerun the same command with --resume")


def write_atomic(path: Path, data: bytes) -> None:
    """Write to a temporary name in the same folder, fsync, then rename over `path`.

    A reader sees the old file or the new one, never half of one; if the disk fills up the
    temporary file is removed and the old file stays as it was. The rename is atomic only within
    one filesystem, hence the temporary file beside the target rather than in /tmp.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        # The rename itself is durable only once the directory entry is flushed.
        _fsync_dir(path.parent)
    except OSError as e:
        # Cleaning up must not replace the real reason (a save_dir that is a file makes the
        # unlink fail too).
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise write_error(path, e) from e


class AtomicFile:
    """A file written in pieces that appears complete or not at all: the pieces go to a
    temporary name beside it, which `commit` fsyncs and renames over the target (as
    write_atomic does in one piece). Used for outputs too large to build in memory."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            self._f = open(self._tmp, "wb")
        except OSError as e:
            raise write_error(path, e) from e

    def write(self, data: bytes) -> None:
        try:
            self._f.write(data)
        except OSError as e:
            self.discard()
            raise write_error(self.path, e) from e

    def commit(self) -> None:
        try:
            self._f.flush()
            os.fsync(self._f.fileno())
            self._f.close()
            os.replace(self._tmp, self.path)
            _fsync_dir(self.path.parent)
        except OSError as e:
            self.discard()
            raise write_error(self.path, e) from e

    def discard(self) -> None:
        with contextlib.suppress(OSError):
            self._f.close()
        with contextlib.suppress(OSError):
            self._tmp.unlink()


class AdoptedFile:
    """A complete, fsynced file written elsewhere (the shared tail's outputs, assembled in the
    temp dir) that `commit` moves over the target, as AtomicFile does its temporary; across
    filesystems, where no rename reaches, it is copied beside the target first."""

    def __init__(self, path: Path, source: Path) -> None:
        self.path = path
        self.source = source

    def commit(self) -> None:
        try:
            os.replace(self.source, self.path)
            _fsync_dir(self.path.parent)
        except OSError as e:
            if e.errno != errno.EXDEV:
                raise write_error(self.path, e) from e
            copy = AtomicFile(self.path)
            try:
                with open(self.source, "rb") as f:
                    while block := f.read(COPY_BYTES):
                        copy.write(block)
            except OSError as e:
                copy.discard()
                raise write_error(self.path, e) from e
            copy.commit()

    def discard(self) -> None:
        """Nothing to undo: the source stays in the temp dir, whose cleanup removes it."""


COPY_BYTES = 16 << 20
"""Bytes copied at a time across filesystems: memory stays at this, whatever the file's size."""


def dumps(obj: Any) -> bytes:
    return (json.dumps(obj, ensure_ascii=False, sort_keys=True, indent=1) + "\n").encode("utf-8")


def write_json_atomic(path: Path, obj: Any) -> None:
    write_atomic(path, dumps(obj))
