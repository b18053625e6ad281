"""Duplicate ids in a stream of a hundred million, at 8 bytes an id.

A dict of every id seen costs about a hundred bytes an id, held while the input is read: at 10^8
JSON Lines examples, more than the rest of the run. Here each id is a 64-bit hash; hashes are
kept in sorted numpy runs (merged as a binary counter, so the work is N log N), and a block of
new hashes is checked against them all at once. A match is only a suspicion (two ids may share a
hash): the caller reads the input again up to that point with a dict, to name the duplicate and
where it first appeared, or to learn it was a collision and go on.
"""

from __future__ import annotations

from typing import Any

import numpy as np

BLOCK = 1 << 16


class SeenIds:
    def __init__(self) -> None:
        self._runs: list[np.ndarray] = []
        self._block: set[int] = set()
        self.count = 0

    def add(self, ex_id: Any) -> bool:
        """Records an id; True when it may have been seen before (then check exactly)."""
        self.count += 1
        h = hash((type(ex_id) is str, ex_id))
        if h in self._block:
            return True
        self._block.add(h)
        return self.flush() if len(self._block) >= BLOCK else False

    def flush(self) -> bool:
        """Moves the block into the sorted runs; True when one of its hashes was there already."""
        if not self._block:
            return False
        new = np.fromiter(self._block, np.int64, len(self._block))
        new.sort()
        self._block = set()
        suspect = False
        for run in self._runs:
            at = np.minimum(np.searchsorted(run, new), len(run) - 1)
            suspect = suspect or bool((run[at] == new).any())
        self._runs.append(new)
        while len(self._runs) > 1 and len(self._runs[-2]) <= len(self._runs[-1]):
            b, a = self._runs.pop(), self._runs.pop()
            merged = np.concatenate([a, b])
            merged.sort(kind="stable")
            self._runs.append(merged)
        return suspect
