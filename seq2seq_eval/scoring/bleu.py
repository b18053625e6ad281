"""BLEU in two steps, for sharded runs: per-example statistics on each rank, combined on rank 0
to exactly what sacrebleu's corpus_bleu gives on all the strings at once."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sacrebleu.metrics import BLEU

from .results import (
    BleuResult,
    check_pairs,
)

# sacrebleu's per-segment statistics: [sys_len, ref_len, correct_1..4, total_1..4].
_BLEU_MAX_NGRAM_ORDER = 4


_BLEU_STATS_LEN = 2 + 2 * _BLEU_MAX_NGRAM_ORDER


def bleu_statistics(preds: Sequence[str], refs: Sequence[str]) -> list[list[int]]:
    """Per-example BLEU sufficient statistics (one reference per prediction).

    Each row is sacrebleu's ``[sys_len, ref_len, correct_1..4, total_1..4]`` under the
    default settings (13a tokenizer, mixed case). They are integers, so summing rows from
    any number of ranks, in any grouping, gives exactly the single-process totals.
    An empty input gives an empty list: a rank may legitimately own no examples.
    """
    check_pairs(preds, refs)
    if not preds:
        return []
    # A fresh metric per call: _extract_corpus_statistics records num_refs on the object,
    # and building one costs microseconds.
    stats = BLEU()._extract_corpus_statistics(preds, [refs])
    return [[int(x) for x in row] for row in stats]


def check_bleu_row(i: int, row: Any) -> list[int]:
    if (
        isinstance(row, (str, bytes))
        or not isinstance(row, Sequence)
        or len(row) != _BLEU_STATS_LEN
        or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in row)
    ):
        raise ValueError(
            f"BLEU statistics of example {i} must be {_BLEU_STATS_LEN} non-negative integers "
            f"[sys_len, ref_len, correct_1..4, total_1..4], got {row!r}"
        )
    return list(row)


def bleu_from_statistics(stats: Sequence[Sequence[int]]) -> BleuResult:
    """Corpus BLEU from per-example statistics (sum, then sacrebleu's formula)."""
    if isinstance(stats, (str, bytes)) or not isinstance(stats, Sequence):
        raise TypeError(f"stats must be a sequence of rows, got {type(stats).__name__}")
    if not stats:
        raise ValueError("cannot compute BLEU of 0 examples: stats is empty")
    totals = [0] * _BLEU_STATS_LEN
    for i, row in enumerate(stats):
        for j, x in enumerate(check_bleu_row(i, row)):
            totals[j] += x
    metric = BLEU()
    # sacrebleu only learns the reference count while caching references, which this
    # path skips; every example here has exactly one reference.
    metric.num_refs = 1
    result = metric._compute_score_from_stats(totals)
    return BleuResult(
        bleu=float(result.score),
        signature=str(metric.get_signature()),
        precisions=tuple(float(p) for p in result.precisions),
        bp=float(result.bp),
        sys_len=int(result.sys_len),
        ref_len=int(result.ref_len),
    )


def corpus_bleu(preds: Sequence[str], refs: Sequence[str]) -> BleuResult:
    """Corpus BLEU; ``.bleu == sacrebleu.corpus_bleu(preds, [refs]).score`` exactly."""
    return bleu_from_statistics(bleu_statistics(preds, refs))
