"""The temp dir: manifest, run lock, per-rank batch journals, and the final rank files.

Layout of {tmp_dir}:
    manifest.json           what run these files belong to (model, data, settings, batch plan)
    run.lock                flock'ed by rank 0 while a run is live
    journal_rank_<k>.jsonl  one line per batch rank k finished, appended and fsynced as it finishes
                            (and, for a batch split after running out of memory, one line per
                            split and per finished sub-batch: see JournaledBatch); a batch taken
                            from another rank's share says whose ("from_rank")
    claims/<batch>          which rank runs which batch in this attempt (steal.py)
    rank_<k>_output.arrow   rank k's records, one Arrow record batch per planned batch, renamed into place when done
    rank_<k>_output.json    rank k's stats, written atomically last: its presence means rank k is done
    cache/                  the examples as Arrow and the tokenized sources (see store.py, tokens.py)
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..atomic import write_json_atomic
from ..errors import RunStateError
from .journal import journal_files
from .steal import CLAIMS, claims_dir

MANIFEST = "manifest.json"
LOCK = "run.lock"
STOPPED = "rank0.stopped"  # rank 0 was interrupted and reports for itself (see runner)


def compare_manifests(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    keys = sorted(set(old) | set(new))
    return [k for k in keys if old.get(k) != new.get(k)]


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
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
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
        os.write(fd, f"pid {os.getpid()} on {os.uname().nodename}\n".encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def refuse_earlier_run(tmp_dir: Path, resume: bool) -> None:
    """Before anything is written into the temp dir: without --resume, an earlier run's files
    are an error (check_tmp_dir compares the manifests once this run's is known)."""
    journals = journal_files(tmp_dir)
    if not (tmp_dir / MANIFEST).exists():
        if journals:
            raise RunStateError(f"{tmp_dir} holds journals but no manifest; remove {tmp_dir} to start over")
        return
    if not resume:
        raise RunStateError(
            f"{tmp_dir} holds an earlier run's files ({len(journals)} journal(s)); "
            f"pass --resume to continue it, or remove {tmp_dir} to start over"
        )


def check_tmp_dir(tmp_dir: Path, manifest: Mapping[str, Any], resume: bool) -> bool:
    """Whether the temp dir already belongs to this run (read-only; raises if it may not be used).

    Without --resume a temp dir holding an earlier run's files is an error, so two unrelated runs
    can never be merged; with --resume its manifest must match this run's exactly.
    """
    path = tmp_dir / MANIFEST
    refuse_earlier_run(tmp_dir, resume)
    if not path.exists():
        return False
    try:
        old = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise RunStateError(f"{path}: unreadable manifest ({e}); remove {tmp_dir} to start over") from e
    differ = compare_manifests(old, manifest)
    if differ:
        raise RunStateError(
            f"--resume: {tmp_dir} belongs to a run with different {', '.join(differ)}; "
            f"rerun with the same settings, or remove {tmp_dir} to start over"
        )
    return True


def prepare_tmp_dir(tmp_dir: Path, manifest: Mapping[str, Any], resume: bool) -> int:
    """Rank 0, holding the lock: make the temp dir ready for this run. Returns how many journal
    files a resumed run found."""
    path = tmp_dir / MANIFEST
    if not check_tmp_dir(tmp_dir, manifest, resume):
        write_json_atomic(path, dict(manifest))
    journals = journal_files(tmp_dir)
    # Rank files are re-derived from the journals at the end of every run; an old one left by a
    # run with another world size must never be merged into this one.
    for stale in [*tmp_dir.glob("rank_*_output.*"), tmp_dir / STOPPED]:
        stale.unlink(missing_ok=True)
    # Claims belong to one attempt: a batch claimed by a rank that died before journaling it
    # must be free to run again; a journaled one is reused by whoever claims it.
    claims = claims_dir(tmp_dir)
    if claims.is_dir():
        for stale in claims.iterdir():
            stale.unlink(missing_ok=True)
    claims.mkdir(exist_ok=True)
    return len(journals)


def cleanup_tmp_dir(tmp_dir: Path) -> None:
    """Remove the files a run made in its temp dir, then the folder if nothing else is left.
    Never rmtree: --tmp_dir may name a folder that holds the user's own files."""
    for pattern in (MANIFEST, LOCK, STOPPED, "journal_rank_*.jsonl", "rank_*_output.*", ".*.tmp", "cache/*", "cache/.*",
                    f"{CLAIMS}/*"):
        for path in tmp_dir.glob(pattern):
            with contextlib.suppress(OSError):
                path.unlink()
    for folder in (tmp_dir / "cache", claims_dir(tmp_dir), tmp_dir):
        with contextlib.suppress(OSError):
            folder.rmdir()
