"""What the HTML report shows beyond the table: sentence scores, the examples that moved most,
scores by source length, and histograms."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..inputs.examples import ExampleId
from ..scoring import registry
from ..scoring.results import ROUGE_KEYS
from .paired import (
    LOWER_IS_BETTER,
    TOP_EXAMPLES,
    _sacrebleu_metric,
    example_mean_metrics,
)
from .systems import (
    _rouge_matrix,
)


def sentence_scores(metric: str, hyps: Sequence[str], refs: Sequence[Sequence[str]]) -> tuple[list[list], list[float]]:
    """A sacrebleu metric's per-example statistics and sentence scores (bleu: sacrebleu's
    ``sentence_bleu``, with effective order; chrf, chrf++, ter: their ``sentence_score``)."""
    corpus = _sacrebleu_metric(metric)
    stats = corpus._extract_corpus_statistics(list(hyps), [list(s) for s in refs])
    sentence = _sacrebleu_metric(metric, sentence=True)
    return stats, [float(sentence._compute_score_from_stats(row).score) for row in stats]


def _length_buckets(lengths: Sequence[int]) -> list[tuple[str, list[int]]]:
    """Quintile buckets: (label, example indices). Edges are the 20/40/60/80th percentiles
    (numpy's "lower" method, so they are lengths that occur); bucket k holds lengths in
    (edge_k-1, edge_k]. Repeated edges merge buckets; empty buckets are dropped."""
    arr = np.asarray(lengths)
    edges = sorted(set(int(e) for e in np.quantile(arr, [0.2, 0.4, 0.6, 0.8], method="lower")))
    bounds = [-1, *edges, int(arr.max())]
    buckets = []
    for lo, hi in zip(bounds, bounds[1:]):
        members = [i for i, x in enumerate(lengths) if lo < x <= hi]
        if members:
            seen = [lengths[i] for i in members]
            buckets.append((f"{min(seen)}–{max(seen)}", members))
    return buckets


def _histogram(values: Sequence[float], upper: float, bins: int = 10) -> list[float]:
    """Percent of examples per bin of [0, upper]; values above ``upper`` (TER can exceed 100)
    count in the last bin."""
    counts = [0] * bins
    for v in values:
        counts[min(bins - 1, max(0, int(v / upper * bins)))] += 1
    return [100 * c / len(values) for c in counts]


def report_details(
    comparison: Mapping[str, Any],
    systems: Mapping[str, Sequence[str]],
    refs: Sequence[Sequence[str]],
    sources: Sequence[str] | None = None,
    ids: Sequence[ExampleId] | None = None,
    rouge_scores: Mapping[str, Sequence[Mapping[str, float]]] | None = None,
    example_scores: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """What the HTML report draws besides the table: per metric, each system's score by length
    bucket and its sentence-score histogram; per non-baseline system, the ``TOP_EXAMPLES``
    examples whose sentence score (first metric) differs most from the baseline's.

    Lengths are whitespace tokens of the sources, or of the first reference stream when there
    are no sources, or of the baseline's predictions when there is neither (``length_basis``
    says which). Bucket scores are corpus scores of the bucket
    (ROUGE: the mean).
    """
    names = list(comparison["systems"])
    metrics = list(comparison["metrics"])
    n = comparison["n_examples"]
    basis = "source" if sources is not None else "reference" if refs else "prediction"
    texts = sources if sources is not None else refs[0] if refs else systems[names[0]]
    lengths = [len(t.split()) if t is not None else 0 for t in texts]
    buckets = _length_buckets(lengths)
    per_sentence: dict[str, dict[str, list[float]]] = {m: {} for m in metrics}
    by_bucket: dict[str, dict[str, list[float]]] = {m: {} for m in metrics}
    rouge_keys = [m for m in metrics if m in ROUGE_KEYS]
    rouge_rows = {}
    if rouge_keys:
        rouge_rows = {
            name: list(rouge_scores[name]) if rouge_scores and name in rouge_scores else _rouge_matrix(systems[name], refs)
            for name in names
        }
    model_metrics = example_mean_metrics()
    for metric in metrics:
        for name in names:
            if metric in ROUGE_KEYS or metric in model_metrics:
                scores = ([row[metric] for row in rouge_rows[name]] if metric in ROUGE_KEYS
                          else [float(x) for x in (example_scores or {})[metric]["values"][name]])
                per_sentence[metric][name] = scores
                by_bucket[metric][name] = [math.fsum(scores[i] for i in members) / len(members) for _, members in buckets]
            else:
                stats, scores = sentence_scores(metric, systems[name], refs)
                per_sentence[metric][name] = scores
                corpus = _sacrebleu_metric(metric)
                by_bucket[metric][name] = [
                    float(corpus._compute_score_from_stats([sum(col) for col in zip(*(stats[i] for i in members))]).score)
                    for _, members in buckets
                ]
    histograms = {}
    for metric in metrics:
        upper = registry.get(metric).scale if metric in model_metrics else 100.0
        histograms[metric] = {
            "bins": [f"{upper * k / 10:g}–{upper * (k + 1) / 10:g}" for k in range(10)],
            "percent": {name: _histogram(per_sentence[metric][name], upper) for name in names},
        }
        if metric in LOWER_IS_BETTER:  # TER: the one metric whose values go past its scale
            histograms[metric]["bins"][-1] = f"{int(upper * 0.9)}+"
    primary = metrics[0]
    base = names[0]
    examples = {}
    for name in names[1:]:
        deltas = [s - b for s, b in zip(per_sentence[primary][name], per_sentence[primary][base])]
        order = sorted(range(n), key=lambda i: (-abs(deltas[i]), i))[:TOP_EXAMPLES]
        examples[name] = [
            {
                "index": i,
                "id": ids[i] if ids is not None else i,
                "source": sources[i] if sources is not None else None,
                "references": [stream[i] for stream in refs if stream[i] is not None],
                "baseline": systems[base][i],
                "system": systems[name][i],
                "baseline_score": per_sentence[primary][base][i],
                "system_score": per_sentence[primary][name][i],
                "delta": deltas[i],
            }
            for i in order
        ]
    return {
        "length_basis": basis,
        "buckets": [{"label": label, "n": len(members)} for label, members in buckets],
        "bucket_scores": by_bucket,
        "histograms": histograms,
        "primary_metric": primary,
        "examples": examples,
    }
