"""Which rank runs which planned batch, settled while the run goes: claims in the temp dir.

The plan deals whole batches to ranks by an estimate from source lengths (plan.assign_batches).
The estimate cannot see how long the outputs turn out, nor a throttled GPU or a node shared with
another job, so without help every rank waits for the slowest. Here each rank starts on its own
share, as dealt, and claims each batch just before running it; a rank whose share is used up
claims unstarted batches from the END of the share with the most estimated work left. The owner
works from the front of its share, so owner and thief meet only at the last batch between them.

A claim is a file created with O_CREAT|O_EXCL in {tmp_dir}/claims/: the filesystem hands it to
exactly one process, on a local disk as on NFS (v3 and later) or Lustre, the shared filesystems a
multi-node run already needs for its temp dir. No collective call is made during generation, so a
slow or stopped rank holds nobody up, and a dead rank holds only the batch it had claimed.

Claims live for one attempt: rank 0 removes them before the ranks start (tmpdir.prepare_tmp_dir),
so a batch claimed by a rank that was killed, and never journaled, runs again on resume or
restart; a journaled batch is taken from the journal by whichever rank claims it, never generated
again. The batches are the plan's whichever rank runs them, so outputs do not change.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..atomic import resumable_write_error
from ..errors import RunFailed

CLAIMS = "claims"


def claims_dir(tmp_dir: Path) -> Path:
    return tmp_dir / CLAIMS


@dataclass(frozen=True)
class Claimed:
    """A batch this rank claimed: its index and the rank whose share it was planned in."""

    index: int
    planned_rank: int

    def stolen_by(self, rank: int) -> bool:
        return self.planned_rank != rank


def pick_victim(left: Sequence[tuple[float, int, int]], rank: int) -> int | None:
    """The rank to take from: the other share with the most estimated cost left, then the most
    batches left, then the lowest rank; None when no other share has a batch left. `left[r]` is
    share r's (cost left, batches left, rank). Pure, so it is tested without files."""
    candidates = [entry for entry in left if entry[2] != rank and entry[1] > 0]
    if not candidates:
        return None
    return max(candidates, key=lambda e: (e[0], e[1], -e[2]))[2]


class Claims:
    """This rank's claims in {tmp_dir}/claims/. Iterating gives the batches to run, in order:
    the rank's own share from the front, then (with stealing) batches taken from other shares.

    Owners claim from the front and thieves from the back, so the unclaimed batches of a share
    are always one run, [lo, hi): a thief's view of each share is two pointers moved past claim
    files as it finds them (a stat each, amortized over the run), not a listing per steal, which
    a million-example run's tens of thousands of claim files would make slow. A stale view (an
    NFS client's cached "no such file") only costs a failed O_EXCL claim, which moves the pointer."""

    def __init__(self, tmp_dir: Path, shares: Sequence[Sequence[int]], rank: int, cost: Sequence[float],
                 steal: bool = True, prefix: str = "") -> None:
        self.dir = claims_dir(tmp_dir)
        # Another phase's batches (a model metric's, after generation) claim under a prefix of
        # their own, so their indices never meet generation's.
        self.prefix = prefix
        self.shares, self.rank, self.steal = shares, rank, steal
        self._lo = [0] * len(shares)
        self._hi = [len(s) for s in shares]
        # Cost of share[r][:k] for every k, so the cost left in [lo, hi) is one subtraction
        # (numpy's cumsum adds left to right, as the Python loop it replaced).
        cost = np.asarray(cost, np.float64)
        self._prefix = [np.r_[0.0, np.cumsum(cost[np.asarray(share, np.int64)])].tolist() for share in shares]

    def _path(self, index: int) -> Path:
        return self.dir / f"{self.prefix}{index}"

    def claim(self, index: int) -> bool:
        """True when this rank got batch `index`; False when another rank had it first. The file
        stays empty: creating it is the whole claim, and a full disk that still has an inode
        left lets the run go on to journal what it can (the journal then says the disk is full)."""
        path = self._path(index)
        try:
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        except FileExistsError:
            return False
        except FileNotFoundError:
            # Rank 0 creates the folder before any rank starts; it is gone only if someone
            # removed the temp dir under a live run.
            raise RunFailed(f"{self.dir}: the claims folder disappeared during the run; was {self.dir.parent} removed?") from None
        except OSError as e:
            raise resumable_write_error(path, e) from e
        return True

    def _left(self, r: int) -> tuple[float, int, int]:
        share, lo, hi = self.shares[r], self._lo[r], self._hi[r]
        while lo < hi and self._path(share[lo]).exists():
            lo += 1
        while hi > lo and self._path(share[hi - 1]).exists():
            hi -= 1
        self._lo[r], self._hi[r] = lo, hi
        return self._prefix[r][hi] - self._prefix[r][lo], hi - lo, r

    def __iter__(self) -> Iterator[Claimed]:
        for index in self.shares[self.rank]:
            if self.claim(index):
                yield Claimed(index, self.rank)
        if not self.steal:
            return
        self._lo[self.rank] = self._hi[self.rank]  # our own share is done
        while True:
            victim = pick_victim([self._left(r) for r in range(len(self.shares))], self.rank)
            if victim is None:
                return
            self._hi[victim] -= 1  # taken now, or by someone else first: either way no longer left
            index = self.shares[victim][self._hi[victim]]
            if self.claim(index):
                yield Claimed(index, victim)
