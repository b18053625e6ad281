"""Helpers for fault tests: find a torchrun worker by rank and signal it."""

from __future__ import annotations

import os
import time
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
