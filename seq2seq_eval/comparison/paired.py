"""Paired significance tests, per metric: sacrebleu's own PairedTest for bleu, chrf, chrf++ and ter
(its scores, p-values and 95% intervals to the last digit for the same seed and sample count), and
the same two tests, paired bootstrap resampling (bs) and approximate randomization (ar), over
per-example F-measures for ROUGE, drawing from the same seeded generator in the same order."""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple

import numpy as np

from ..errors import ConfigError, DataError, EvalError
from ..scoring import registry
from ..scoring.names import accepted_metric_names
from ..scoring.results import ROUGE_KEYS, SEED

def accepted() -> tuple[str, ...]:
    """What --metrics accepts: the run's names (the model metrics' from their registry); "rouge"
    stands for all of ``ROUGE_KEYS``, which may also be named alone."""
    return accepted_metric_names()


def example_mean_metrics() -> tuple[str, ...]:
    """Metrics whose corpus score is the mean of per-example scores computed elsewhere (the model
    metrics' main values): tested as ROUGE is, over those per-example scores."""
    return registry.names()


SACREBLEU_METRICS = ("bleu", "chrf", "chrf++", "ter")


LOWER_IS_BETTER = frozenset({"ter"})
"""The text metrics that are error rates; a model metric says its direction in its spec."""


def lower_is_better(metric: str) -> bool:
    """Whether a lower score is the better one: TER, and a model metric whose spec says so (MetricX)."""
    return metric in LOWER_IS_BETTER or (metric in example_mean_metrics() and not registry.higher_is_better(metric))


PAIRED_TESTS = ("bs", "ar")


DEFAULT_N_SAMPLES = {"bs": 1000, "ar": 10000}
"""sacrebleu's defaults: bootstrap resamples for bs, shuffling trials for ar."""


AR_CONFIDENCE_SAMPLES = 1000
"""With ar, the 95% intervals come from this many bootstrap resamples (sacrebleu's n_ar_confidence)."""


ALPHA = 0.05
"""Rows with p < ALPHA are marked significant."""


TOP_EXAMPLES = 10
"""How many examples with the largest per-example difference the report shows per system."""


N_BUCKETS = 5
"""Length buckets: quintiles of the baseline's source lengths."""


# Row chunks of resampled indices are sized to hold about this many elements at once, so a
# 100k-example corpus never builds the full (n_samples, n) index matrix.
_CHUNK_ELEMENTS = 1 << 22


class PairedResult(NamedTuple):
    """One system's figures for one metric."""

    score: float
    """The corpus score (ROUGE: the mean per-example F-measure x 100)."""
    ci_low: float
    """Lower end of the 95% interval: bootstrap mean minus sacrebleu's half-width."""
    ci_high: float
    """Upper end: bootstrap mean plus the half-width."""
    p_value: float | None
    """Paired test against the baseline; None for the baseline itself."""


def metric_names(spec: str | Sequence[str]) -> tuple[str, ...]:
    """``"bleu,chrf"`` or ``["bleu", "chrf"]`` -> ``("bleu", "chrf")``; "rouge" expands to
    ``ROUGE_KEYS``. Duplicates are dropped, the order is kept."""
    parts = [spec] if isinstance(spec, str) else list(spec)
    names: list[str] = []
    for part in parts:
        for name in (p.strip() for p in part.split(",")):
            if not name:
                continue
            lowered = name.lower()
            if lowered == "rouge":
                expanded: tuple[str, ...] = ROUGE_KEYS
            elif lowered in SACREBLEU_METRICS or lowered in example_mean_metrics():
                expanded = (lowered,)
            elif name in ROUGE_KEYS:
                expanded = (name,)
            else:
                raise ConfigError(
                    f"--metrics: unknown metric {name!r}; valid: {', '.join(accepted())} "
                    f"(or one of {', '.join(ROUGE_KEYS)})"
                )
            names.extend(n for n in expanded if n not in names)
    if not names:
        raise ConfigError(f"--metrics: no metric given; valid: {', '.join(accepted())}")
    return tuple(names)


def default_metrics(task: str) -> tuple[str, ...]:
    """bleu for translation tasks (any name containing "translation"), ROUGE for summarization."""
    if "translation" in task:
        return ("bleu",)
    if "summarization" in task:
        return ROUGE_KEYS
    raise ConfigError(f"--task {task!r}: expected a translation or summarization task")


def _sacrebleu_metric(name: str, sentence: bool = False) -> Any:
    from sacrebleu.metrics import BLEU, CHRF, TER

    if name == "bleu":
        # Sentence BLEU is sacrebleu's sentence_bleu: effective order, else short segments get 0.
        return BLEU(effective_order=sentence)
    if name == "chrf":
        return CHRF()
    if name == "chrf++":
        return CHRF(word_order=2)
    return TER()


@contextmanager
def _sacrebleu_seed(seed: int) -> Iterator[None]:
    # PairedTest takes its seed from the SACREBLEU_SEED environment variable (read in its
    # __init__, and again for the baseline's interval), not from an argument. Set it for the
    # duration of the test only, and put back whatever was there.
    old = os.environ.get("SACREBLEU_SEED")
    os.environ["SACREBLEU_SEED"] = str(seed)
    try:
        yield
    finally:
        if old is None:
            del os.environ["SACREBLEU_SEED"]
        else:
            os.environ["SACREBLEU_SEED"] = old


def _sacrebleu_paired(
    systems: Mapping[str, Sequence[str]],
    refs: Sequence[Sequence[str]],
    metrics: Sequence[str],
    paired_test: str,
    n_samples: int,
    seed: int,
) -> tuple[dict[str, dict[str, PairedResult]], dict[str, str]]:
    from sacrebleu.significance import PairedTest

    objects = {name: _sacrebleu_metric(name) for name in metrics}
    with _sacrebleu_seed(seed):
        test = PairedTest(
            [(name, list(hyps)) for name, hyps in systems.items()],
            objects,
            references=[list(stream) for stream in refs],
            test_type=paired_test,
            n_samples=n_samples,
            n_ar_confidence=AR_CONFIDENCE_SAMPLES if paired_test == "ar" else -1,
        )
        signatures, table = test()
    # PairedTest keys its output by score name (BLEU, chrF2, chrF2++, TER), in the order the
    # metrics were given.
    score_names = list(test.metrics)
    if len(score_names) != len(metrics):
        raise EvalError(f"sacrebleu returned metrics {score_names} for {list(metrics)}")
    results: dict[str, dict[str, PairedResult]] = {name: {} for name in systems}
    sigs = {}
    for ours, theirs in zip(metrics, score_names):
        sigs[ours] = str(signatures[theirs].format())
        for system, res in zip(systems, table[theirs]):
            mean, half = float(res.mean), float(res.ci)
            p = None if res.p_value is None else float(res.p_value)
            results[system][ours] = PairedResult(float(res.score), mean - half, mean + half, p)
    return results, sigs


def _estimate_ci(scores: np.ndarray) -> tuple[float, float]:
    from sacrebleu.significance import estimate_ci

    # sacrebleu's convention, so ROUGE rows read like the others: the mean of the resampled
    # scores, and half the spread between the sorted scores at n // 40 and n - n // 40 - 1.
    mean, half = estimate_ci(scores)
    return float(mean) - float(half), float(mean) + float(half)


def _p_value(sample_stats: np.ndarray, observed: float) -> float:
    # As sacrebleu's _compute_p_value (from multeval): count strictly greater, +1 on both sides.
    return (int(np.sum(sample_stats > observed)) + 1) / (len(sample_stats) + 1)


def _index_chunks(rng: np.random.Generator, n: int, n_samples: int) -> Iterator[np.ndarray]:
    """``rng.choice(n, size=(n_samples, n))`` in row chunks. Drawing rows in several calls gives
    the same indices as one call (choice draws integers one after another, C order); the test
    suite checks it. sacrebleu draws them in one call."""
    rows = max(1, _CHUNK_ELEMENTS // n)
    for start in range(0, n_samples, rows):
        yield rng.choice(n, size=(min(rows, n_samples - start), n), replace=True)


def _resampled_means(values: np.ndarray, rng: np.random.Generator, n_samples: int) -> np.ndarray:
    # values[idx] is C-contiguous (rows, n), so each row's mean is numpy's pairwise sum of that row.
    return np.concatenate([values[idx].mean(axis=1) for idx in _index_chunks(rng, len(values), n_samples)])


def rouge_paired_test(
    baseline: Sequence[float],
    system: Sequence[float],
    paired_test: str = "bs",
    n_samples: int | None = None,
    seed: int = SEED,
) -> PairedResult:
    """A paired test of ``system`` against ``baseline`` over per-example scores; the corpus
    score is the mean. It is sacrebleu's test with the mean in place of the corpus metric, and
    draws from ``numpy.random.default_rng(seed)`` exactly as sacrebleu does:

    * ``bs``: ``rng.choice(n, size=(n_samples, n))`` resamples example indices; on each resample
      both systems' means are taken; with d = |mean_sys - mean_base| per resample,
      p = (#{d - mean(d) > observed difference} + 1) / (n_samples + 1). The interval is the
      bootstrap mean of the system's resampled means +- sacrebleu's half-width
      (``significance.estimate_ci``).
    * ``ar``: ``rng.integers(2, size=(n_samples, n), dtype=bool)`` picks, per trial and example,
      which system's score goes to pseudo-system A (the other to B);
      p = (#{|mean_A - mean_B| > observed difference} + 1) / (n_samples + 1). The same ``rng`` then
      draws ``AR_CONFIDENCE_SAMPLES`` bootstrap resamples for the interval.

    ``score`` is ``math.fsum(system) / n``, the main run's ROUGE; the interval of the baseline
    itself is ``rouge_baseline_interval``.
    """
    base = np.asarray(baseline, dtype=np.float64)
    sys_ = np.asarray(system, dtype=np.float64)
    n = len(base)
    if n == 0 or len(sys_) != n:
        raise DataError(f"paired test needs the same non-zero number of scores, got {n} and {len(sys_)}")
    n_samples = _check_samples(paired_test, n_samples)
    score = math.fsum(sys_.tolist()) / n
    observed = abs(score - math.fsum(base.tolist()) / n)
    rng = np.random.default_rng(seed)
    if paired_test == "bs":
        # Both systems see the same resamples: the chunks are drawn once and applied to both.
        means_b, means_s = [], []
        for idx in _index_chunks(rng, n, n_samples):
            means_b.append(base[idx].mean(axis=1))
            means_s.append(sys_[idx].mean(axis=1))
        resampled_base, resampled_sys = np.concatenate(means_b), np.concatenate(means_s)
        diffs = np.abs(resampled_sys - resampled_base)
        p = _p_value(diffs - diffs.mean(), observed)
        low, high = _estimate_ci(resampled_sys)
        return PairedResult(score, low, high, p)
    # One call, as sacrebleu: unlike choice(), bool draws in several calls are not the same bits.
    pick_base = rng.integers(2, size=(n_samples, n), dtype=bool)
    rows = max(1, _CHUNK_ELEMENTS // n)
    trial_diffs = []
    for start in range(0, n_samples, rows):
        sel = pick_base[start:start + rows]
        trial_diffs.append(np.abs(np.where(sel, base, sys_).mean(axis=1) - np.where(sel, sys_, base).mean(axis=1)))
    p = _p_value(np.concatenate(trial_diffs), observed)
    low, high = _estimate_ci(_resampled_means(sys_, rng, AR_CONFIDENCE_SAMPLES))
    return PairedResult(score, low, high, p)


def rouge_baseline_interval(
    baseline: Sequence[float], paired_test: str = "bs", n_samples: int | None = None, seed: int = SEED
) -> PairedResult:
    """The baseline's row: its mean and interval from a fresh ``default_rng(seed)`` (for bs,
    the very resamples of the paired test; for ar, ``AR_CONFIDENCE_SAMPLES`` of them), as
    sacrebleu computes the baseline's interval."""
    base = np.asarray(baseline, dtype=np.float64)
    if len(base) == 0:
        raise DataError("paired test needs at least one score")
    n_samples = _check_samples(paired_test, n_samples)
    count = n_samples if paired_test == "bs" else AR_CONFIDENCE_SAMPLES
    low, high = _estimate_ci(_resampled_means(base, np.random.default_rng(seed), count))
    return PairedResult(math.fsum(base.tolist()) / len(base), low, high, None)


def _check_samples(paired_test: str, n_samples: int | None) -> int:
    if paired_test not in PAIRED_TESTS:
        raise ConfigError(f"--paired_test must be one of {', '.join(PAIRED_TESTS)}, got {paired_test!r}")
    if n_samples is None:
        return DEFAULT_N_SAMPLES[paired_test]
    if isinstance(n_samples, bool) or not isinstance(n_samples, int) or n_samples < 1:
        raise ConfigError(f"--n_samples must be an integer >= 1, got {n_samples!r}")
    return n_samples
