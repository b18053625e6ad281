"""The task's metric (BLEU for translation, ROUGE for summarization) through one pair of calls:
``score(task, preds, refs) == combine(task, example_statistics(task, preds, refs))``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Union

from .bleu import (
    bleu_from_statistics,
    bleu_statistics,
)
from .results import (
    ROUGE_KEYS,
    BleuResult,
    MetricResult,
    RougeResult,
    check_pairs,
    check_task,
)
from .rouge import (
    rouge_example_scores,
    rouge_from_example_scores,
)


def metric_dict(result: MetricResult) -> dict[str, Union[float, str]]:
    """Flat keys for the metrics JSON file.

    Translation: ``bleu``, ``bleu_signature``. Summarization: each ROUGE key, plus
    ``<key>_ci_low`` and ``<key>_ci_high``.
    """
    if isinstance(result, BleuResult):
        return {"bleu": result.bleu, "bleu_signature": result.signature}
    if isinstance(result, RougeResult):
        out: dict[str, Union[float, str]] = {}
        for key in ROUGE_KEYS:
            out[key] = result.scores[key]
        for key in ROUGE_KEYS:
            out[f"{key}_ci_low"] = result.ci_low[key]
            out[f"{key}_ci_high"] = result.ci_high[key]
        return out
    raise TypeError(f"result must be a BleuResult or RougeResult, got {type(result).__name__}")


def example_statistics(task: str, preds: Sequence[str], refs: Sequence[str]) -> list:
    """What a rank computes for its own examples, JSON-serialisable.

    translation: ``bleu_statistics`` rows; summarization: ``rouge_example_scores`` dicts.
    """
    check_task(task)
    if task == "translation":
        return bleu_statistics(preds, refs)
    return rouge_example_scores(preds, refs)


def combine(task: str, per_example: Sequence) -> dict[str, Union[float, str]]:
    """The flat metric dict from per-example statistics of all ranks, in example order."""
    check_task(task)
    if task == "translation":
        return metric_dict(bleu_from_statistics(per_example))
    return metric_dict(rouge_from_example_scores(per_example))


def score(task: str, preds: Sequence[str], refs: Sequence[str]) -> dict[str, Union[float, str]]:
    """Score a whole corpus in one place; equals ``combine`` over any split of it."""
    check_task(task)
    check_pairs(preds, refs)
    return combine(task, example_statistics(task, preds, refs))
