"""Files that appear complete or not at all: written beside their target, fsynced, renamed over it.

Every file a run leaves for someone else to read (manifest, rank files, the record and intent of
a publish, converted models' markers) goes through here, so no reader, and no crash, ever sees
half of one. The outputs themselves are published as a set (outputs/publish.py).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
from pathlib import Path
from typing import Any

from .errors import EvalError, RunFailed


def fsync_dir(path: Path) -> None:
    """Make the renames and removals in a folder durable (its entries flushed)."""
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


def write_atomic(path: Path, data: bytes, scratch: Path | None = None, name: str | None = None) -> None:
    """Write to a temporary name in the same folder (or in `scratch`, a folder of the tool's on
    the same filesystem, where a crash leaves nothing in the target's folder), fsync, then rename
    over `path`.

    A reader sees the old file or the new one, never half of one; if the disk fills up the
    temporary file is removed and the old file stays as it was. The rename is atomic only within
    one filesystem, hence the temporary file beside the target rather than in /tmp. `name`: the
    temporary file's name, where the caller must know it by more than this process's pid.
    """
    tmp = (scratch or path.parent) / (name or f".{path.name}.{os.getpid()}.tmp")
    made = False
    try:
        # O_NOFOLLOW: a link planted at the temporary name is refused (ELOOP), never written through.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o666)
        made = True
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        # The rename itself is durable only once the directory entry is flushed.
        fsync_dir(path.parent)
    except OSError as e:
        # Cleaning up must not replace the real reason (a save_dir that is a file makes the
        # unlink fail too).
        if made:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
        raise write_error(path, e) from e


COPY_BYTES = 16 << 20
"""Bytes copied at a time across filesystems: memory stays at this, whatever the file's size."""


def dumps(obj: Any) -> bytes:
    return (json.dumps(obj, ensure_ascii=False, sort_keys=True, indent=1) + "\n").encode("utf-8")


def write_json_atomic(path: Path, obj: Any) -> None:
    write_atomic(path, dumps(obj))
