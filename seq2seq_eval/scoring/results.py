"""What every metric shares: the result types, the constants, and the input checks that turn a
mismatched list into a one-line error."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Union

SEED = 12345

"""Seed of the bootstrap resampling: the same scores give the same interval, byte for byte."""


ROUGE_KEYS = ("rouge1", "rouge2", "rougeL", "rougeLsum")


TASKS = ("translation", "summarization")


@dataclass(frozen=True)
class BleuResult:
    """Corpus BLEU, as sacrebleu's default ``BLEU()`` computes it."""

    bleu: float
    """sacrebleu's ``.score``, unrounded (0-100)."""
    signature: str
    """sacrebleu's signature, e.g. ``nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0``."""
    precisions: tuple[float, ...]
    """n-gram precisions (0-100), n = 1..4."""
    bp: float
    """Brevity penalty."""
    sys_len: int
    """Total hypothesis length in 13a tokens."""
    ref_len: int
    """Total reference length in 13a tokens."""


@dataclass(frozen=True)
class RougeResult:
    """Mean ROUGE F-measure over examples, with a seeded bootstrap 95% interval.

    The score is the plain mean. (Hugging Face's legacy ``calculate_rouge`` reports
    rouge-score's BootstrapAggregator "mid", the median of unseeded bootstrap means, which
    differs from the mean in the last digits and from run to run.)
    """

    scores: dict[str, float]
    """Per key of ``ROUGE_KEYS``: mean F-measure x 100 (unrounded)."""
    ci_low: dict[str, float]
    """Per key: 2.5th percentile of the bootstrap means."""
    ci_high: dict[str, float]
    """Per key: 97.5th percentile of the bootstrap means."""
    num_examples: int


MetricResult = Union[BleuResult, RougeResult]


def check_strings(name: str, values: Any) -> None:
    # A bare str is a Sequence[str] too; scoring its characters is never what was meant.
    if isinstance(values, str) or not isinstance(values, Sequence):
        raise TypeError(f"{name} must be a sequence of strings, got {type(values).__name__}")
    for i, value in enumerate(values):
        if not isinstance(value, str):
            raise TypeError(f"{name}[{i}] must be a str, got {type(value).__name__}: {value!r}")


def check_pairs(preds: Sequence[str], refs: Sequence[str]) -> None:
    check_strings("preds", preds)
    check_strings("refs", refs)
    if len(preds) != len(refs):
        raise ValueError(
            f"preds and refs must have the same length, got {len(preds)} predictions "
            f"and {len(refs)} references"
        )


def check_references(preds: Sequence[str], refs: Any) -> list[tuple[str, ...]]:
    """Per example a tuple of one or more reference strings, from a str or a sequence of str."""
    check_strings("preds", preds)
    if isinstance(refs, str) or not isinstance(refs, Sequence):
        raise TypeError(f"refs must be a sequence with one entry per prediction, got {type(refs).__name__}")
    out = []
    for i, entry in enumerate(refs):
        if isinstance(entry, str):
            out.append((entry,))
            continue
        if (
            isinstance(entry, (bytes, Mapping))
            or not isinstance(entry, Sequence)
            or not entry
            or not all(isinstance(r, str) for r in entry)
        ):
            raise TypeError(
                f"refs[{i}] must be a str or a non-empty sequence of str, got {type(entry).__name__}: {entry!r}"
            )
        out.append(tuple(entry))
    if len(preds) != len(out):
        raise ValueError(
            f"preds and refs must have the same length, got {len(preds)} predictions "
            f"and {len(out)} references"
        )
    return out


def check_task(task: str) -> None:
    if task not in TASKS:
        raise ValueError(f"task must be one of {', '.join(TASKS)}, got {task!r}")
