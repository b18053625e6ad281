"""The plan's split of its costliest batches: each token-budget batch above its share of the set's
bound cost (every output at the length limit: plan.bound_costs) cut into pieces. Pure functions of the batches, the
lengths and the generation settings, never of the world size (plan.py says why that matters).
"""

from __future__ import annotations

import numpy as np


MAX_BATCH_SHARE = 16
"""A token budget's cut leaves no batch above 1/MAX_BATCH_SHARE of the set's bound cost
(plan.bound_costs) where it can be split (split_costly). Why: a rank waits at the end for at most the
batch another rank is running, so on a small set a few large batches leave a rank idle for a large
part of the run (issue 63: 240 examples in 5 batches at CTranslate2's 2048 tokens, the ranks
finished 9.9 s apart). At most 1/16 of the set a batch, 2 ranks wait for at most 1/8 of a rank's
work, whatever the outputs turn out to be; the cut never depends on the world size. A set whose
batches are all below the share (a large set of sentences) keeps the token cut as it was; a
batch of very short sources (many rows, few tokens) may be split in a large set too."""

MIN_PIECE_ROWS = 64
"""A split batch's pieces keep at least this many decoder rows (examples x beams), and at least
PIECE_STEP_RATIO times the step's fixed cost (STEP_OVERHEAD) in rows: in the estimate's terms a
piece's rows cost at least that many times its steps' fixed cost, which bounds what a cut adds
(on CPU the generation seconds of docs/stealing.md's jobs did not grow beyond the noise), and on a
GPU, whose step costs hundreds of rows, a set of any usual size is not cut."""

PIECE_STEP_RATIO = 4


def split_costly(bounds: np.ndarray, bound: np.ndarray, beams: int, step_overhead: float) -> np.ndarray:
    """`bounds` with each batch above MAX_BATCH_SHARE of the set's bound cost (`bound`, per batch)
    cut into consecutive pieces in length order, as even in members as can be, of at most that
    share where the pieces keep MIN_PIECE_ROWS (and PIECE_STEP_RATIO * step_overhead) rows each.
    A pure function of the batches and their bounds, so of the lengths and the generation
    settings, never of the world size."""
    total = float(bound.sum())
    if len(bound) == 0 or total <= 0:
        return bounds
    least = max(1, -(-int(max(MIN_PIECE_ROWS, PIECE_STEP_RATIO * step_overhead)) // max(1, beams)))
    sizes = np.diff(bounds)
    pieces = np.minimum(np.ceil(bound * MAX_BATCH_SHARE / total), sizes // least).astype(np.int64)
    split = np.flatnonzero(pieces > 1)
    if not len(split):
        return bounds
    extra = [bounds[i] + (sizes[i] * np.arange(1, pieces[i])) // pieces[i] for i in split.tolist()]
    return np.unique(np.concatenate([bounds, *extra])).astype(np.int64)
