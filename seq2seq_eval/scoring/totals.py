"""Several metrics at once (``--metrics``), each example with one or several references: per-example
statistics keyed by metric name, sentence scores, and their running combination on rank 0
(``MetricTotals``), equal to scoring every string in one place."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Union

import numpy as np

from .names import METRIC_NAMES
from .results import (
    ROUGE_KEYS,
    check_references,
)
from .rouge import (
    check_rouge_row,
    rouge_example_scores,
    rouge_from_example_scores,
    rouge_from_matrix,
)
from .sacre import SACREBLEU_METRICS, reference_count
from .task import metric_dict


def _check_names(names: Sequence[str]) -> tuple[str, ...]:
    if isinstance(names, str) or not isinstance(names, Sequence) or not names:
        raise TypeError(f"names must be a non-empty sequence of metric names, got {names!r}")
    unknown = [n for n in names if n not in METRIC_NAMES]
    if unknown:
        raise ValueError(f"unknown metric {unknown[0]!r}; valid names: {', '.join(METRIC_NAMES)}")
    if len(set(names)) != len(names):
        raise ValueError(f"metric names must be distinct, got {', '.join(names)}")
    return tuple(names)


def sentence_keys(name: str) -> tuple[str, ...]:
    """The per-example score keys a metric writes: its name, or the four ROUGE keys."""
    return ROUGE_KEYS if name == "rouge" else (name,)


def ranking_key(name: str) -> tuple[str, bool]:
    """(sentence score key, higher is better) that ranks examples for a metric.

    ROUGE ranks by rougeL; TER is an error rate, so its worst examples are the highest.
    """
    if name == "rouge":
        return "rougeL", True
    return name, SACREBLEU_METRICS[name].higher_is_better


def reference_tuples(refs: Sequence[Union[str, Sequence[str]]]) -> list[tuple[str, ...]]:
    """Per-example references as tuples; a str is one reference."""
    return [(r,) if isinstance(r, str) else tuple(r) for r in refs]


def sacrebleu_num_refs(refs: Sequence[Union[str, Sequence[str]]]) -> int:
    """What sacrebleu's signature reports for these per-example references (-1: variable)."""
    return reference_count(reference_tuples(refs))


def metric_statistics(
    names: Sequence[str], preds: Sequence[str], refs: Sequence[Union[str, Sequence[str]]]
) -> list[dict[str, Any]]:
    """What a rank computes for its own examples: per example ``{name: statistics}``.

    ``refs`` holds one entry per prediction: a reference string, or a sequence of several.
    sacrebleu metrics give their segment statistics rows (see ``sacre_metrics``); ``rouge``
    gives ``rouge_example_scores``' dict. All of it is plain JSON.
    """
    names = _check_names(names)
    ref_tuples = check_references(preds, refs)
    columns = {
        name: rouge_example_scores(preds, ref_tuples) if name == "rouge"
        else SACREBLEU_METRICS[name].statistics(preds, ref_tuples)
        for name in names
    }
    return [{name: columns[name][i] for name in names} for i in range(len(preds))]


def _column(name: str, per_example: Sequence[Mapping[str, Any]]) -> list[Any]:
    if isinstance(per_example, (str, bytes, Mapping)) or not isinstance(per_example, Sequence):
        raise TypeError(f"per_example must be a sequence of mappings, got {type(per_example).__name__}")
    column = []
    for i, row in enumerate(per_example):
        if not isinstance(row, Mapping) or name not in row:
            raise ValueError(f"statistics of example {i} have no {name!r} entry, got {row!r}")
        column.append(row[name])
    return column


def sentence_scores(names: Sequence[str], per_example: Sequence[Mapping[str, Any]]) -> list[dict[str, float]]:
    """Each example's sentence-level scores from its statistics: ``{key: score}`` with the
    keys of ``sentence_keys``. sacrebleu metrics give ``sentence_score(pred, refs).score``
    (BLEU with effective order, as ``sacrebleu.sentence_bleu``); ROUGE its F-measures x 100.
    """
    names = _check_names(names)
    out: list[dict[str, float]] = [{} for _ in per_example]
    for name in names:
        column = _column(name, per_example)
        if name == "rouge":
            for i, row in enumerate(column):
                out[i].update(zip(ROUGE_KEYS, check_rouge_row(i, row)))
        else:
            for i, value in enumerate(SACREBLEU_METRICS[name].sentence_scores(column)):
                out[i][name] = value
    return out


def combine_metrics(
    names: Sequence[str], per_example: Sequence[Mapping[str, Any]], num_refs: int = 1
) -> dict[str, Union[float, str]]:
    """The flat metric dict from every example's ``metric_statistics``, in example order.

    Keys: ``bleu``/``chrf``/``chrf++``/``ter`` with ``<name>_signature``, and for ``rouge``
    the keys of ``metric_dict``. ``num_refs`` goes into sacrebleu's signatures (``num_refs``
    of the references: -1 when it varies between examples).
    """
    names = _check_names(names)
    out: dict[str, Union[float, str]] = {}
    for name in names:
        column = _column(name, per_example)
        if name == "rouge":
            out.update(metric_dict(rouge_from_example_scores(column)))
        else:
            out.update(SACREBLEU_METRICS[name].combine(column, num_refs))
    return out


def score_metrics(
    names: Sequence[str], preds: Sequence[str], refs: Sequence[Union[str, Sequence[str]]]
) -> dict[str, Union[float, str]]:
    """Score a whole corpus in one place; equals ``combine_metrics`` over any split of it."""
    stats = metric_statistics(names, preds, refs)
    return combine_metrics(names, stats, sacrebleu_num_refs(refs))


def lowest_scoring(name: str, scores: Sequence[Mapping[str, float]], k: int = 5) -> list[int]:
    """Positions of the ``k`` worst examples by ``ranking_key(name)``, worst first; ties keep
    example order."""
    key, higher_is_better = ranking_key(name)
    sign = 1.0 if higher_is_better else -1.0
    return sorted(range(len(scores)), key=lambda i: sign * scores[i][key])[:k]


class MetricTotals:
    """``combine_metrics`` over examples that arrive in chunks, in example order, with the same
    arithmetic (sacrebleu's column sums left to right; ROUGE scores kept as float64 columns for
    the mean and the bootstrap), so rank 0 never holds every example's statistics as objects.
    It also keeps each example's ranking score, for the lowest-scoring examples."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = _check_names(names)
        self.n = 0
        self._totals = {n: [0] * SACREBLEU_METRICS[n].row_len for n in self.names if n != "rouge"}
        self._rouge: list[np.ndarray] = []
        self._key, self._higher_is_better = ranking_key(self.names[0])
        self._ranking: list[np.ndarray] = []

    def add(self, per_example: Sequence[Mapping[str, Any]], sentence: Sequence[Mapping[str, float]]) -> None:
        for name, totals in self._totals.items():
            metric = SACREBLEU_METRICS[name]
            for i, row in enumerate(_column(name, per_example)):
                for j, x in enumerate(metric.check_row(self.n + i, row)):
                    totals[j] += x
        if "rouge" in self.names:
            rows = [check_rouge_row(self.n + i, row) for i, row in enumerate(_column("rouge", per_example))]
            self._rouge.append(np.asarray(rows, dtype=np.float64).reshape(len(rows), len(ROUGE_KEYS)))
        self._ranking.append(np.asarray([s[self._key] for s in sentence], dtype=np.float64))
        self.n += len(per_example)

    def result(self, num_refs: int = 1) -> dict[str, Union[float, str]]:
        if self.n == 0:
            raise ValueError("cannot compute metrics of 0 examples")
        out: dict[str, Union[float, str]] = {}
        for name in self.names:
            if name == "rouge":
                out.update(metric_dict(rouge_from_matrix(np.concatenate(self._rouge))))
            else:
                out.update(SACREBLEU_METRICS[name].score_from_totals(self._totals[name], num_refs))
        return out

    def lowest(self, k: int = 5) -> tuple[str, list[int], list[float]]:
        """(key, positions, scores) of the k worst examples by the first text metric, worst first;
        ties keep example order."""
        values = np.concatenate(self._ranking) if self._ranking else np.zeros(0)
        return (self._key, *worst(values, self._higher_is_better, k))


def worst(values: Sequence[float], higher_is_better: bool, k: int = 5) -> tuple[list[int], list[float]]:
    """(positions, scores) of the k worst of per-example scores in a metric's direction (the
    lowest, or the highest of an error scale such as TER or MetricX), worst first; ties keep
    example order."""
    array = np.asarray(values, dtype=np.float64)
    order = np.argsort(array if higher_is_better else -array, kind="stable")[:k]
    return order.tolist(), array[order].tolist()
