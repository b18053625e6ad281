"""Sentence chrF of every (hypothesis, reference) pair of a set of texts, in numpy: pure.

What `CHRF().sentence_score(texts[i], [texts[j]])` gives for every i and j, bit for bit
(sacrebleu 2.x's defaults, which mbrs' `MetricChrF` keeps: character n-grams of order 1 to 6,
whitespace removed, no word n-grams, beta 2, effective-order averaging, no epsilon smoothing),
for an MBR matrix at a small fraction of the cost of sacrebleu's per-pair loop over n-gram
Counters, which spends most of a chrF selection's time in Python.

The statistics are sacrebleu's integers: per order n, the hypothesis' n-gram count (0 where the
reference has no n-gram of that order, as sacrebleu counts it), the reference's n-gram count,
and the clipped matches, the sum over n-grams of min(count in hypothesis, count in reference).
Each text's n-grams are counted once, as columns of a count matrix per order, and every pair's
matches come from one elementwise minimum over those rows. The score then follows
`CHRF._compute_f_score` operation by operation in float64 (the same divisions, products and
left-to-right sums over the orders), so each entry is the same float sacrebleu computes;
tests/test_selection.py holds them equal to sacrebleu's own sentence scores.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

CHAR_ORDER = 6
"""sacrebleu's CHRF.CHAR_ORDER: n-grams of 1 to 6 characters."""
BETA = 2
"""sacrebleu's CHRF.BETA: recall weighs beta**2 = 4 times precision."""
BLOCK = 1 << 22
"""The most count cells one elementwise minimum makes at once (32 MiB of int64): rows of the
pair matrix are taken in blocks under it, so long candidates do not need d x d x n-grams cells."""


def pair_statistics(texts: Sequence[str], order: int = CHAR_ORDER) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(hyp, ref, match), each an (order, d, d) int64 array: entry [n - 1, i, j] is sacrebleu's
    statistic for n-grams of n characters with texts[i] as the hypothesis and texts[j] as the
    reference (CHRF._get_match_statistics of their Counters)."""
    # sacrebleu's extract_all_char_ngrams removes whitespace as str.split() finds it.
    stripped = ["".join(t.split()) for t in texts]
    d = len(stripped)
    lengths = np.array([len(s) for s in stripped], dtype=np.int64)
    # One code point per character (UTF-32), all texts end to end; surrogatepass keeps a lone
    # surrogate, a character to Python and to sacrebleu, one code unit here too.
    codes = np.frombuffer("".join(stripped).encode("utf-32-le", "surrogatepass"), dtype="<u4")
    owner = np.repeat(np.arange(d, dtype=np.int64), lengths)  # the text each position belongs to
    end = np.repeat(np.cumsum(lengths), lengths)  # where that text ends (exclusive)
    counts = np.maximum(lengths[None, :] - np.arange(order, dtype=np.int64)[:, None], 0)  # [n - 1, i]: n-grams of text i
    hyp = np.where(counts[:, None, :] > 0, counts[:, :, None], 0)
    ref = np.broadcast_to(counts[:, None, :], (order, d, d)).copy()
    match = np.zeros((order, d, d), dtype=np.int64)
    _, chars = np.unique(codes, return_inverse=True)
    chars = chars.astype(np.int64).ravel()
    alphabet = int(chars.max()) + 1 if chars.size else 0
    grams = chars
    for n in range(1, order + 1):
        if n > 1:
            # The n-gram at p is the (n-1)-gram at p followed by character p + n - 1: numbering
            # the pairs densely numbers the n-grams, equal numbers for equal strings, and the
            # key stays under positions x alphabet (no overflow from a power of the alphabet).
            _, grams = np.unique(grams[:-1] * alphabet + chars[n - 1:], return_inverse=True)
            grams = grams.astype(np.int64).ravel()
        windows = grams.size
        if windows == 0:
            break
        # Windows that run past the end of their text into the next are no n-grams: dropped.
        inside = np.arange(windows) + n <= end[:windows]
        width = int(grams.max()) + 1
        table = np.bincount(owner[:windows][inside] * width + grams[inside], minlength=d * width).reshape(d, width)
        step = max(1, BLOCK // max(1, d * width))
        for i in range(0, d, step):
            match[n - 1, i:i + step] = np.minimum(table[i:i + step, None, :], table[None, :, :]).sum(axis=2)
    return hyp, ref, match


def f_scores(hyp: np.ndarray, ref: np.ndarray, match: np.ndarray, beta: int = BETA) -> np.ndarray:
    """CHRF._compute_f_score (eps_smoothing=False) of every pair at once, as float64: an order
    counts where both the hypothesis and the reference have n-grams of it (effective order), its
    precision and recall are averaged over those orders left to right, and the F-beta of the two
    averages, times 100, is the score (0 where both are 0)."""
    factor = beta**2
    shape = hyp.shape[1:]
    avg_prec = np.zeros(shape)
    avg_rec = np.zeros(shape)
    effective = np.zeros(shape, dtype=np.int64)
    for n_hyp, n_ref, n_match in zip(hyp, ref, match):
        both = (n_hyp > 0) & (n_ref > 0)
        # Adding 0.0 where the order does not count leaves the sum's bits as sacrebleu's skip does.
        avg_prec = avg_prec + np.where(both, n_match / np.where(both, n_hyp, 1), 0.0)
        avg_rec = avg_rec + np.where(both, n_match / np.where(both, n_ref, 1), 0.0)
        effective += both
    some = effective > 0
    avg_prec = np.where(some, avg_prec / np.where(some, effective, 1), 0.0)
    avg_rec = np.where(some, avg_rec / np.where(some, effective, 1), 0.0)
    total = avg_prec + avg_rec
    nonzero = total != 0
    score = (1 + factor) * avg_prec * avg_rec
    score = score / np.where(nonzero, factor * avg_prec + avg_rec, 1.0)
    return np.where(nonzero, 100 * score, 0.0)


def chrf_matrix(texts: Sequence[str]) -> np.ndarray:
    """The d x d float64 matrix of sentence chrF: row i, column j = texts[i] against texts[j]."""
    return f_scores(*pair_statistics(texts))
