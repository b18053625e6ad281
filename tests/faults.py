"""Helpers for fault tests (and benchmarks/steal.py): find a torchrun worker by rank, signal it,
slow it down from outside."""

from __future__ import annotations

import os
import signal
import threading
import time
import subprocess
from pathlib import Path


def find_worker(tag: str, rank: int, timeout: float = 60) -> int:
    """PID of the worker whose environment carries our test tag and RANK=rank."""
    deadline = time.monotonic() + timeout
    want_tag, want_rank = f"S2S_TEST_TAG={tag}".encode(), f"RANK={rank}".encode()
    while time.monotonic() < deadline:
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                env = (entry / "environ").read_bytes().split(b"\0")
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if want_tag in env and want_rank in env and b"torch.distributed.run" not in cmdline:
                return int(entry.name)
        time.sleep(0.05)
    raise TimeoutError(f"no worker with rank {rank} appeared")


def wait_for_lines(path: Path, n: int, timeout: float = 120) -> None:
    """Until `path` holds at least n complete lines (n finished batches in a journal)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_bytes().count(b"\n") >= n:
            return
        time.sleep(0.02)
    raise TimeoutError(f"{path} never reached {n} lines")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


class Throttle(threading.Thread):
    """Stops and continues a process in turns (SIGSTOP, SIGCONT), so it runs about half the time:
    a throttled GPU or a shared node, made from outside, with no hook in the tool."""

    def __init__(self, pid: int, period: float = 0.1) -> None:
        super().__init__(daemon=True)
        self.pid, self.period, self._done = pid, period, threading.Event()

    def run(self) -> None:
        try:
            while not self._done.is_set():
                os.kill(self.pid, signal.SIGSTOP)
                self._done.wait(self.period)
                os.kill(self.pid, signal.SIGCONT)
                self._done.wait(self.period)
        except ProcessLookupError:
            pass  # it ended

    def finish(self) -> None:
        """Stops the turns and leaves the process running."""
        self._done.set()
        self.join()
        try:
            os.kill(self.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


def stop_all(proc: subprocess.Popen, throttle: Throttle | None = None) -> None:
    """After a test or benchmark, whatever happened: the throttled process runs again, and the
    launched process group (a torchrun agent and its workers) is gone."""
    if throttle is not None:
        throttle.finish()
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
