"""Minimum Bayes risk (MBR) selection with a sacrebleu utility: pure.

Every candidate is scored as the hypothesis against every candidate as the single
pseudo-reference, itself and duplicates included (an N x N matrix, computed once per example);
its expected utility is the mean of its row under uniform weights, as mbrs 0.1.8's `DecoderMBR`
computes it with the hypotheses as the references. The utilities are the project's sentence
scores (scoring/sacre.py), which are sacrebleu's `sentence_score` with the settings mbrs'
`MetricChrF` and `MetricBLEU` default to: `CHRF()` (character order 6, no word n-grams, beta 2,
no epsilon smoothing) and `BLEU(effective_order=True)` (13a, exp smoothing). chrF's matrix is
computed in numpy (chrf.py), each text's n-grams counted once, the same floats as sacrebleu's.

The mean is taken in float64 over an exactly rounded sum (math.fsum): mbrs holds the matrix and
its mean in float32, which moves a mean by up to about 1e-5 on the 100-point scale; the float64
mean is the reference (docs/selection.md). Because the sum is exact, a row's mean does not depend
on the order of its values, so two candidates with the same texts (duplicates) get bit-identical
expected utilities and the tie rule decides between them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..scoring.sacre import SACREBLEU_METRICS
from .chrf import chrf_matrix

MBR_UTILITIES = ("chrf", "bleu")
"""The --select_metric names `mbr` computes here (mbrs' chrF and BLEU with their defaults)."""


@dataclass(frozen=True)
class Selection:
    """One example's choice: the index of the selected candidate and every candidate's score."""

    index: int
    scores: tuple[float, ...]
    """The expected utilities, in candidate order (higher is better)."""


def utility_matrix(candidates: Sequence[str], utility: str) -> np.ndarray:
    """The N x N float64 matrix: row i, column j = candidate i scored against candidate j as its
    one reference. Each distinct pair of texts is scored once (beam and sampled candidates repeat
    themselves), then spread over the positions that hold those texts."""
    distinct = list(dict.fromkeys(candidates))
    d = len(distinct)
    if utility == "chrf":
        scores = chrf_matrix(distinct)
    else:
        metric = SACREBLEU_METRICS[utility]
        rows = metric.statistics([h for h in distinct for _ in range(d)], [(r,) for _ in range(d) for r in distinct])
        scores = np.array(metric.sentence_scores(rows), dtype=np.float64).reshape(d, d)
    where = {text: k for k, text in enumerate(distinct)}
    at = np.array([where[c] for c in candidates], dtype=np.intp)
    return scores[np.ix_(at, at)]


def expected_utilities(matrix: np.ndarray) -> tuple[float, ...]:
    """Each row's mean under uniform weights: an exact sum (fsum) divided by N, in float64."""
    n = matrix.shape[1]
    return tuple(math.fsum(row) / n for row in matrix.tolist())


def best(scores: Sequence[float]) -> int:
    """The index of the highest score; of equal ones, the earlier candidate (the beam's, or the
    sampler's, earlier output), so the choice never depends on a sort's stability."""
    top = max(scores)
    return next(i for i, s in enumerate(scores) if s == top)


def select_mbr(candidates: Sequence[str], utility: str) -> Selection:
    """MBR over one example's candidates (2 or more; the reader checks that before any work)."""
    if utility not in MBR_UTILITIES:
        raise ValueError(f"MBR utility must be one of {', '.join(MBR_UTILITIES)}, got {utility!r}")
    if len(candidates) < 2:
        raise ValueError(f"MBR needs 2 or more candidates, got {len(candidates)}")
    scores = expected_utilities(utility_matrix(candidates, utility))
    return Selection(best(scores), scores)
