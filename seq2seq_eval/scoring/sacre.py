"""sacrebleu's corpus metrics, split into per-example statistics and a combine step.

``BLEU()``, ``CHRF()``, ``CHRF(word_order=2)`` (chrF++) and ``TER()``, each with sacrebleu's
defaults. A corpus score in sacrebleu is a function of the sum of per-segment statistics
(``Metric._extract_corpus_statistics`` then ``_compute_score_from_stats``), so:

* each rank extracts the statistics of its own examples (``SacreMetric.statistics``);
* rank 0 adds up the rows of all ranks in example order and applies sacrebleu's formula
  (``SacreMetric.combine``).

BLEU and chrF rows are integers, so their sum does not depend on the grouping at all. A TER row
is ``[edits (int), average reference length (float)]``: the float column is summed left to right
in example order starting from 0, exactly as sacrebleu's ``sum_of_lists`` does in
``corpus_score``, so the result is the same bits whatever the number of ranks. JSON round-trips
both kinds exactly (Python writes the shortest repr that reads back as the same float).

References are given per example: a tuple of one or more strings. sacrebleu wants them as
reference *streams* (stream k = every example's k-th reference); ``reference_streams`` makes
that layout, padding with ``None`` where an example has fewer references, which sacrebleu
reads as "no reference here" (its signature then says ``nrefs:var``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Optional

from sacrebleu.metrics import BLEU, CHRF, TER
from sacrebleu.metrics.base import Metric

__all__ = ["SACREBLEU_METRICS", "SacreMetric", "reference_count", "reference_streams"]


def reference_streams(refs: Sequence[Sequence[str]]) -> list[list[Optional[str]]]:
    """Per-example references -> sacrebleu's list of reference streams (None-padded)."""
    width = max((len(r) for r in refs), default=0)
    return [[r[k] if k < len(r) else None for r in refs] for k in range(width)]


def reference_count(refs: Sequence[Sequence[str]]) -> int:
    """sacrebleu's ``num_refs`` for the signature: the count when every example has the same
    number of references, else -1 (printed ``nrefs:var``)."""
    counts = {len(r) for r in refs}
    return counts.pop() if len(counts) == 1 else -1


@dataclass(frozen=True)
class SacreMetric:
    """One sacrebleu metric with its defaults, as statistics + combine + sentence scores."""

    name: str
    """The --metrics name, also the metric file key (``<name>_signature`` holds the signature)."""
    build: Callable[[], Metric]
    """A fresh sacrebleu metric object with the settings we report."""
    row_len: int
    """Length of one example's statistics row."""
    float_columns: tuple[int, ...] = ()
    """Columns that hold non-integers (TER's average reference length); all others are ints."""
    build_sentence: Optional[Callable[[], Metric]] = None
    """The metric for sentence-level scores, where it differs from ``build``."""
    higher_is_better: bool = True

    def statistics(self, preds: Sequence[str], refs: Sequence[Sequence[str]]) -> list[list[Any]]:
        """One row per example, computed as ``corpus_score`` computes them."""
        if not preds:
            return []  # a rank may own no examples
        # A fresh metric per call: _extract_corpus_statistics records num_refs on the object.
        rows = self.build()._extract_corpus_statistics(list(preds), reference_streams(refs))
        return [[float(x) if j in self.float_columns else int(x) for j, x in enumerate(row)] for row in rows]

    def check_row(self, i: int, row: Any) -> list[Any]:
        def ok(j: int, x: Any) -> bool:
            if isinstance(x, bool):
                return False
            if j in self.float_columns:
                return isinstance(x, (int, float)) and math.isfinite(x) and x >= 0
            return isinstance(x, int) and x >= 0

        if (
            isinstance(row, (str, bytes))
            or not isinstance(row, Sequence)
            or len(row) != self.row_len
            or not all(ok(j, x) for j, x in enumerate(row))
        ):
            kinds = "non-negative numbers" if self.float_columns else "non-negative integers"
            raise ValueError(f"{self.name} statistics of example {i} must be {self.row_len} {kinds}, got {row!r}")
        return list(row)

    def totals(self, stats: Sequence[Sequence[Any]]) -> list[Any]:
        """Column sums, left to right in the given (example) order, as sacrebleu's sum_of_lists."""
        if isinstance(stats, (str, bytes)) or not isinstance(stats, Sequence):
            raise TypeError(f"{self.name} statistics must be a sequence of rows, got {type(stats).__name__}")
        if not stats:
            raise ValueError(f"cannot compute {self.name} of 0 examples: statistics are empty")
        totals: list[Any] = [0] * self.row_len
        for i, row in enumerate(stats):
            for j, x in enumerate(self.check_row(i, row)):
                totals[j] += x
        return totals

    def combine(self, stats: Sequence[Sequence[Any]], num_refs: int = 1) -> dict[str, Any]:
        """``{name: score, name_signature: signature}`` from the rows of all examples.

        ``num_refs`` is what the signature reports (``reference_count``): sacrebleu learns it
        while reading references, which this path never does.
        """
        return self.score_from_totals(self.totals(stats), num_refs)

    def score_from_totals(self, totals: Sequence[Any], num_refs: int = 1) -> dict[str, Any]:
        """``combine`` from column sums already added up (see metrics.MetricTotals)."""
        metric = self.build()
        result = metric._compute_score_from_stats(list(totals))
        metric.num_refs = num_refs
        return {self.name: float(result.score), f"{self.name}_signature": str(metric.get_signature())}

    def sentence_scores(self, stats: Sequence[Sequence[Any]]) -> list[float]:
        """Each example's ``sentence_score``, from its own row (no second pass over the text).

        ``Metric.sentence_score(hyp, refs)`` extracts exactly this row and scores it alone.
        """
        metric = (self.build_sentence or self.build)()
        return [float(metric._compute_score_from_stats(self.check_row(i, row)).score) for i, row in enumerate(stats)]


SACREBLEU_METRICS: dict[str, SacreMetric] = {
    # Rows: BLEU [sys_len, ref_len, correct_1..4, total_1..4]; chrF [hyp, ref, match] per
    # character n-gram order 1..6, chrF++ the same then per word n-gram order 1..2; TER
    # [edits, average reference length].
    # Sentence BLEU uses effective order, as sacrebleu.sentence_bleu() does by default and as
    # BLEU.sentence_score() recommends (it logs a warning per call without it): without it
    # most short sentences with no 4-gram match would score 0.
    "bleu": SacreMetric("bleu", BLEU, 10, build_sentence=lambda: BLEU(effective_order=True)),
    "chrf": SacreMetric("chrf", CHRF, 3 * 6),
    "chrf++": SacreMetric("chrf++", lambda: CHRF(word_order=2), 3 * (6 + 2)),
    "ter": SacreMetric("ter", TER, 2, float_columns=(1,), higher_is_better=False),
}
"""--metrics name -> metric. chrF and chrF++ keep sacrebleu's default smoothing (effective
order, ``eps_smoothing=False``); the official chrF++.py corresponds to ``eps_smoothing=True``."""
