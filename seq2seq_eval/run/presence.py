"""Which ranks still use the temp dir: rank 0 removes it (cleanup) only once every other rank has
left it, so no rank reads a rank file, a journal or a claim that may have been removed, nor writes
a file into a folder being removed, whoever finishes first.

A rank other than 0 holds a shared flock on its own `rank_<k>.present` from before it writes its
rank file (rank 0 cannot finish before every rank file is there) until its last use of the temp
dir: its model metrics' batches and, with --shared_tail, its slice of the outputs. Rank 0, once it
has written the outputs and said so (tmpdir.mark_done), waits until it can take each of those
files' lock: held means the rank is still at work there; free means it has left, or died (the
kernel drops a dead process's flock, however it died), so a lost rank holds nobody up."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import time
from pathlib import Path

from .tmpdir import DONE, LOCK, STOPPED

logger = logging.getLogger("seq2seq_eval")

POLL_S = 0.05
"""How often rank 0 tries the locks of ranks still at work: they leave as soon as they see
rank0.done (run/model_scores.py), so the wait is short; a try is an open and a flock."""


def presence_path(tmp_dir: Path, rank: int) -> Path:
    return tmp_dir / f"rank_{rank}.present"


class Presence:
    """This rank's hold on the temp dir (ranks other than 0): `release` at its last use."""

    def __init__(self, tmp_dir: Path, rank: int) -> None:
        self._fd: int | None = os.open(presence_path(tmp_dir, rank), os.O_RDWR | os.O_CREAT, 0o644)
        # Shared: rank 0 only tries an exclusive lock, never holds one while this is taken.
        fcntl.flock(self._fd, fcntl.LOCK_SH)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _present(tmp_dir: Path, rank: int) -> bool:
    try:
        fd = os.open(presence_path(tmp_dir, rank), os.O_RDWR)  # never O_CREAT: its rank made it
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # also drops the lock just taken
    return False


def wait_for_ranks_to_leave(tmp_dir: Path, world_size: int, timeout_s: float) -> list[int]:
    """Rank 0, after mark_done: waits until no other rank is in the temp dir. Returns the ranks
    still there after `timeout_s` (a rank stuck at work there: the caller leaves the folder)."""
    deadline = time.monotonic() + timeout_s
    waiting = list(range(1, world_size))
    while True:
        waiting = [r for r in waiting if _present(tmp_dir, r)]
        if not waiting or time.monotonic() >= deadline:
            return waiting
        time.sleep(POLL_S)


_HELD: list[int] = []  # the lock of a rank 0 that is gone, kept by the survivor that reports it


def main_rank_state(tmp_dir: Path) -> str:
    """What a rank other than 0 knows of rank 0 from the temp dir: "running" (it holds the run
    lock), "done" (it wrote the outputs), "stopped" (it, or a survivor, reports the end of the
    run) or "gone" (it died without a word: this process then holds its lock and marks the run
    stopped, so that exactly one survivor reports it)."""
    if (tmp_dir / DONE).exists():
        return "done"
    try:
        fd = os.open(tmp_dir / LOCK, os.O_RDWR)  # never O_CREAT: a temp dir cleaned up stays gone
    except FileNotFoundError:
        return "done"  # removed by rank 0 after the outputs were written
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return "running"
    if os.fstat(fd).st_nlink == 0:
        # The lock file was removed under this process between its open and its flock: rank 0
        # cleaned up and released the lock, its run done (cleanup removes rank0.done too).
        os.close(fd)
        return "done"
    if (tmp_dir / DONE).exists() or (tmp_dir / STOPPED).exists():
        os.close(fd)
        return "done" if (tmp_dir / DONE).exists() else "stopped"
    _HELD.append(fd)  # until this process exits
    with contextlib.suppress(OSError):
        (tmp_dir / STOPPED).write_bytes(b"")
    return "gone"


def main_is_done(tmp_dir: Path) -> bool:
    """Rank 0 has written the outputs (reliable only for a rank holding its presence, presence.py)."""
    return (tmp_dir / DONE).exists()


def mark_done(tmp_dir: Path) -> None:
    """Rank 0 has written the outputs (before cleanup, which removes this file with the rest).
    Never into a folder whose marker is gone (a cleanup cut short by a signal had begun): a file
    there would make the folder a user's to the next command. A failure to write it is a warning:
    the outputs are in place, and a waiting rank finds the lock file gone once cleanup is done."""
    from .tmpmarker import read_marker

    if read_marker(tmp_dir) is None:
        return
    try:
        (tmp_dir / DONE).write_bytes(b"")
    except OSError as e:
        logger.warning("%s: cannot write %s (%s); the outputs are in place", tmp_dir, DONE, e.strerror or e)
