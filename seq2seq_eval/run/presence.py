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

import fcntl
import os
import time
from pathlib import Path

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
