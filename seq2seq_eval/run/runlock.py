"""The run lock: an exclusive flock on {tmp_dir}/run.lock, held by rank 0 for the whole run."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from ..errors import RunStateError

LOCK = "run.lock"


class RunLock:
    """An exclusive flock on {tmp_dir}/run.lock, held by rank 0 for the whole run.

    flock rather than a pid file: the kernel drops it when the holder dies, however it dies
    (SIGKILL, OOM, node reboot), so a crashed run never blocks the next one.
    """

    def __init__(self, tmp_dir: Path) -> None:
        self.path = tmp_dir / LOCK
        self._fd: int | None = None

    def acquire(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError as e:
            raise RunStateError(f"{self.path}: cannot create the run lock ({e.strerror}); is --tmp_dir writable?") from e
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as e:
            os.close(fd)
            holder = ""
            try:
                holder = f" (held by {self.path.read_text().strip()})"
            except OSError:
                pass
            raise RunStateError(
                f"{self.path.parent}: another run is using this temp dir{holder}; wait for it to finish, "
                "or give this run another --save_dir/--tmp_dir"
            ) from e
        os.ftruncate(fd, 0)
        from .tmpmarker import folder_token  # the temp dir's token: the lock says whose folder it locks

        os.write(fd, f"pid {os.getpid()} on {os.uname().nodename}, temp dir {folder_token(self.path.parent)}\n".encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
