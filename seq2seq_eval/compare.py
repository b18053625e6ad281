"""Compare systems: paired significance tests, a table, JSON, and the data of an HTML report.

``python -m seq2seq_eval compare --predictions A B [C...]`` scores every system against the same
references and tests each one against the first (the baseline).

* bleu, chrf, chrf++ and ter go through sacrebleu's own ``PairedTest`` (paired bootstrap
  resampling, ``bs``, or approximate randomization, ``ar``), so the scores, p-values and 95%
  intervals are sacrebleu's to the last digit for the same seed and sample count.
* ROUGE has no sufficient statistics to resample, so the same two tests run over per-example
  F-measures (``metrics.rouge_example_scores``), with a corpus score that is the mean. They draw
  from the same seeded generator in the same order as sacrebleu does (``rouge_paired_test``).

A prediction is a generations file (one line per example) or the ``--save_dir`` of an earlier
run (``load_run``), whose references, sources, ids and task are then read from its provenance.

Library entry points, for the main run's ``--compare_to DIR``: ``load_run(save_dir)``,
``check_same_examples(run, ids, where)`` and ``compare_systems(systems, refs, ...)``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import types
import typing
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from .inputs.examples import ExampleId, Examples
from .inputs.files import load_jsonl, load_legacy, read_lines
from .errors import ConfigError, DataError, EvalError
from .scoring.results import ROUGE_KEYS, SEED
from .scoring.rouge import rouge_example_scores

__all__ = [
    "ALPHA",
    "AR_CONFIDENCE_SAMPLES",
    "DEFAULT_N_SAMPLES",
    "METRICS",
    "PAIRED_TESTS",
    "PairedResult",
    "Run",
    "check_same_examples",
    "compare_main",
    "compare_systems",
    "default_metrics",
    "format_table",
    "load_run",
    "metric_names",
    "report_details",
    "rouge_paired_test",
    "sentence_scores",
]

METRICS = ("bleu", "chrf", "chrf++", "ter", "rouge")
"""What --metrics accepts; "rouge" stands for all of ``ROUGE_KEYS``, which may also be named alone."""
SACREBLEU_METRICS = ("bleu", "chrf", "chrf++", "ter")
LOWER_IS_BETTER = frozenset({"ter"})
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


# ---------------------------------------------------------------------------
# Metric names
# ---------------------------------------------------------------------------


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
            elif lowered in SACREBLEU_METRICS:
                expanded = (lowered,)
            elif name in ROUGE_KEYS:
                expanded = (name,)
            else:
                raise ConfigError(
                    f"--metrics: unknown metric {name!r}; valid: {', '.join(METRICS)} "
                    f"(or one of {', '.join(ROUGE_KEYS)})"
                )
            names.extend(n for n in expanded if n not in names)
    if not names:
        raise ConfigError(f"--metrics: no metric given; valid: {', '.join(METRICS)}")
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


# ---------------------------------------------------------------------------
# Paired tests
# ---------------------------------------------------------------------------


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


def _check_seed(seed: int) -> None:
    # sacrebleu's PairedTest treats seed 0 as "no seed" (fresh OS entropy per system): refuse it
    # rather than give results that change from run to run.
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 1:
        raise ConfigError(f"--seed must be an integer >= 1 (sacrebleu reads 0 as unseeded), got {seed!r}")


def _rouge_matrix(preds: Sequence[str], refs: Sequence[Sequence[str]]) -> list[dict[str, float]]:
    """Per-example ROUGE; with several reference streams, the best F-measure per key over the
    references (what rouge-score's ``score_multi`` reports)."""
    per_stream = [rouge_example_scores(preds, stream) for stream in refs]
    return [{key: max(s[i][key] for s in per_stream) for key in ROUGE_KEYS} for i in range(len(preds))]


def _check_inputs(systems: Mapping[str, Sequence[str]], refs: Sequence[Sequence[str]]) -> int:
    if len(systems) < 2:
        raise ConfigError(f"--predictions needs at least 2 systems (the first is the baseline), got {len(systems)}")
    if isinstance(refs, str) or not refs or isinstance(refs[0], str):
        raise ConfigError("references must be a list of reference streams (a list of lists of strings)")
    n = len(refs[0])
    if n == 0:
        raise DataError("the references hold no examples")
    for k, stream in enumerate(refs[1:], start=2):
        if len(stream) != n:
            raise DataError(f"reference stream {k} has {len(stream)} lines but stream 1 has {n}")
    for name, hyps in systems.items():
        if len(hyps) != n:
            raise DataError(f"system {name}: {len(hyps)} predictions but the references have {n} lines")
    return n


def compare_systems(
    systems: Mapping[str, Sequence[str]],
    refs: Sequence[Sequence[str]],
    metrics: Sequence[str] = ("bleu",),
    paired_test: str = "bs",
    n_samples: int | None = None,
    seed: int = SEED,
    rouge_scores: Mapping[str, Sequence[Mapping[str, float]]] | None = None,
) -> dict[str, Any]:
    """Score every system and test each against the first (the baseline).

    ``systems``: name -> predictions, in example order, baseline first. ``refs``: reference
    streams (``[refs]`` for one reference per example). ``rouge_scores`` optionally gives
    per-example ROUGE already computed (name -> ``rouge_example_scores`` rows, e.g. a run's
    ``metric_stats``), so they are not computed again.

    Returns ``{"systems", "baseline", "metrics", "paired_test", "n_samples", "seed", "alpha",
    "n_examples", "n_references", "signatures", "results"}``, where
    ``results[system][metric]`` is ``{"score", "ci_low", "ci_high", "p_value", "significant"}``
    (``p_value`` None and ``significant`` False for the baseline).
    """
    n = _check_inputs(systems, refs)
    metrics = metric_names(metrics)
    n_samples = _check_samples(paired_test, n_samples)
    _check_seed(seed)
    names = list(systems)
    results: dict[str, dict[str, PairedResult]] = {name: {} for name in names}
    signatures: dict[str, str] = {}
    bleu_like = [m for m in metrics if m in SACREBLEU_METRICS]
    if bleu_like:
        sb_results, sb_sigs = _sacrebleu_paired(systems, refs, bleu_like, paired_test, n_samples, seed)
        signatures.update(sb_sigs)
        for name in names:
            results[name].update(sb_results[name])
    rouge_keys = [m for m in metrics if m in ROUGE_KEYS]
    if rouge_keys:
        per_example = {
            name: list(rouge_scores[name]) if rouge_scores and name in rouge_scores else _rouge_matrix(systems[name], refs)
            for name in names
        }
        for name, rows in per_example.items():
            if len(rows) != n:
                raise DataError(f"system {name}: {len(rows)} per-example ROUGE scores for {n} examples")
        base = names[0]
        for key in rouge_keys:
            columns = {name: [row[key] for row in per_example[name]] for name in names}
            results[base][key] = rouge_baseline_interval(columns[base], paired_test, n_samples, seed)
            for name in names[1:]:
                results[name][key] = rouge_paired_test(columns[base], columns[name], paired_test, n_samples, seed)
            signatures[key] = _rouge_signature(len(refs), paired_test, n_samples, seed)
    return {
        "systems": names,
        "baseline": names[0],
        "metrics": list(metrics),
        "paired_test": paired_test,
        "n_samples": n_samples,
        "seed": seed,
        "alpha": ALPHA,
        "n_examples": n,
        "n_references": len(refs),
        "signatures": {m: signatures[m] for m in metrics},
        "results": {
            name: {m: _result_dict(results[name][m], results[names[0]][m]) for m in metrics} for name in names
        },
    }


def _result_dict(result: PairedResult, baseline: PairedResult) -> dict[str, Any]:
    return {
        "score": result.score,
        "ci_low": result.ci_low,
        "ci_high": result.ci_high,
        "p_value": result.p_value,
        "significant": _significant(result, baseline),
    }


def _significant(result: PairedResult, baseline: PairedResult) -> bool:
    # sacrebleu counts only resampled differences strictly above the observed one, so a system
    # that scores exactly the baseline's score (e.g. the same outputs) gets p = 1 / (n_samples + 1).
    # The p-value is kept as sacrebleu's; a zero difference is just never called significant.
    return result.p_value is not None and result.p_value < ALPHA and result.score != baseline.score


def _rouge_signature(n_refs: int, paired_test: str, n_samples: int, seed: int) -> str:
    from importlib import metadata

    try:
        version = metadata.version("rouge-score")
    except metadata.PackageNotFoundError:
        version = "unknown"
    parts = [f"nrefs:{n_refs}", f"{paired_test}:{n_samples}"]
    if paired_test == "ar":
        parts.append(f"bs:{AR_CONFIDENCE_SAMPLES}")
    parts += [f"seed:{seed}", "stem:yes", "split:punkt", "mean-f", f"rouge-score:{version}"]
    return "|".join(parts)


# ---------------------------------------------------------------------------
# Earlier runs
# ---------------------------------------------------------------------------


class Run(NamedTuple):
    """What ``load_run`` reads from an earlier run's save_dir."""

    predictions: list[str]
    """``{type_path}_generations.txt``, one line per example, in example order."""
    references: list[list[str]] | None
    """Reference streams (one here), or None when they cannot be found."""
    sources: list[str] | None
    """The sources, when the run's data can be read."""
    ids: list[ExampleId] | None
    """The example ids, when the run's data can be read."""
    task: str | None
    """The run's --task, from its provenance."""
    type_path: str
    path: Path
    """The save_dir."""
    references_note: str
    """Where the references came from, or why there are none."""


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise DataError(f"{path}: unreadable JSON ({e})") from e


def _run_config(save_dir: Path, type_path: str) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """The run's provenance config and data block, from its metric file."""
    # The metric file is {type_path}_{metric}.json (or _run_info.json); pseudolabel files
    # are the only other JSON a run writes there, and they have no provenance.
    for path in sorted(save_dir.glob(f"{type_path}_*.json")):
        if path.name.endswith("pseudolabels.json"):
            continue
        data = _read_json(path)
        provenance = data.get("provenance") if isinstance(data, dict) else None
        if isinstance(provenance, dict) and isinstance(provenance.get("config"), dict):
            return provenance["config"], provenance.get("data") or {}
    return None, {}


def _run_examples(config: Mapping[str, Any], type_path: str) -> tuple[Examples | None, str]:
    """The run's examples read again from its data (as ``data.load_examples`` reads them), or
    None and the reason."""
    if config.get("dataset"):
        return None, f"its data is the dataset {config['dataset']!r}, which compare does not load"
    data_dir = config.get("data_dir")
    if not data_dir:
        return None, "its provenance names no data_dir"
    path = Path(data_dir)
    try:
        if path.suffix == ".jsonl" or path.is_file():
            examples = load_jsonl(path, need_targets=False)
        else:
            examples = load_legacy(path, type_path, need_targets=False)
    except DataError as e:
        return None, f"its data cannot be read ({e})"
    n_obs = config.get("n_obs")
    if isinstance(n_obs, int) and not isinstance(n_obs, bool):
        examples = Examples(examples.items[:n_obs], examples.origin)
    return examples, f"{path}"


def load_run(save_dir: str | Path) -> Run:
    """Read an earlier run's predictions, and its references, sources, ids and task.

    The predictions are ``{type_path}_generations.txt``. The rest comes from the provenance
    config in its metric file: the data (``data_dir`` with ``{type_path}.source/.target``, or a
    .jsonl file), truncated to ``n_obs`` as the run did. The data must still have the
    fingerprint the run recorded; otherwise (or for a --dataset run) the references fall back
    to the ``{type_path}_references.txt`` that --debug writes into the save_dir, or are None.
    """
    save_dir = Path(save_dir)
    if not save_dir.is_dir():
        raise DataError(f"{save_dir}: not a directory")
    generations = sorted(save_dir.glob("*_generations.txt"))
    if not generations:
        raise DataError(f"{save_dir}: no *_generations.txt; expected the --save_dir of an earlier run")
    if len(generations) > 1:
        splits = ", ".join(p.name[: -len("_generations.txt")] for p in generations)
        raise ConfigError(
            f"{save_dir}: holds generations of several splits ({splits}); "
            "pass the generations file itself, with --references"
        )
    gen_path = generations[0]
    type_path = gen_path.name[: -len("_generations.txt")]
    preds = read_lines(gen_path)
    config, data_info = _run_config(save_dir, type_path)
    examples_file = save_dir / f"{type_path}_examples.jsonl"
    if examples_file.is_file():
        # Written by the run itself, in data order: ids, sources and references as it scored them.
        rows = [json.loads(line) for line in read_lines(examples_file) if line.strip()]
        if len(rows) != len(preds):
            raise DataError(f"{gen_path}: {len(preds)} lines but {examples_file} has {len(rows)}")
        k = max(len(r["references"]) for r in rows)
        return Run(
            predictions=preds,
            references=[[r["references"][j] if j < len(r["references"]) else None for r in rows] for j in range(k)],
            sources=[r["source"] for r in rows], ids=[r["id"] for r in rows],
            task=config.get("task") if config else None, type_path=type_path, path=save_dir,
            references_note=str(examples_file),
        )
    examples: Examples | None = None
    note = "no metric file with provenance"
    if config is not None:
        examples, note = _run_examples(config, type_path)
    if examples is not None:
        expected = data_info.get("sha256")
        from .inputs.store import fingerprint

        if expected and fingerprint(examples.items) != expected:
            examples, note = None, f"its data {note} has changed since the run (sha256 differs from its provenance)"
    if examples is not None and len(examples) != len(preds):
        raise DataError(f"{gen_path}: {len(preds)} lines but the run's data {note} has {len(examples)} examples")
    refs: list[list[str]] | None = None
    if examples is not None and all(e.target is not None for e in examples.items):
        refs = [[e.target for e in examples.items]]  # type: ignore[misc]
    debug_target = save_dir / f"{type_path}_references.txt"
    if refs is None and debug_target.exists():
        refs, note = [read_lines(debug_target)], str(debug_target)
        if len(refs[0]) != len(preds):
            raise DataError(f"{gen_path}: {len(preds)} lines but {debug_target} has {len(refs[0])}")
    return Run(
        predictions=preds,
        references=refs,
        sources=[e.source for e in examples.items] if examples is not None else None,
        ids=examples.ids if examples is not None else None,
        task=config.get("task") if config else None,
        type_path=type_path,
        path=save_dir,
        references_note=note,
    )


def check_same_examples(
    run: Run, ids: Sequence[ExampleId] | None, where: str, references: Sequence[str] | None = None
) -> None:
    """Raise DataError unless ``run`` covers the examples of ``where``: as many as ``ids`` (and,
    when the run knows its ids too, the same ids in the same order), and, when ``references``
    and the run's references are both known, the same references."""
    if ids is not None:
        if len(run.predictions) != len(ids):
            raise DataError(f"{run.path}: {len(run.predictions)} examples but {where} has {len(ids)}")
        if run.ids is not None:
            for i, (a, b) in enumerate(zip(run.ids, ids)):
                if a != b:
                    raise DataError(
                        f"{run.path}: example {i} has id {a!r} but {where} has id {b!r}; "
                        "the systems must cover the same examples in the same order"
                    )
    if references is not None and run.references is not None:
        for i, (a, b) in enumerate(zip(run.references[0], references)):
            if a != b:
                raise DataError(
                    f"{run.path}: reference {i} differs from {where}'s; the runs were scored on different data"
                )


# ---------------------------------------------------------------------------
# Per-example scores, buckets and examples for the report
# ---------------------------------------------------------------------------


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
) -> dict[str, Any]:
    """What the HTML report draws besides the table: per metric, each system's score by length
    bucket and its sentence-score histogram; per non-baseline system, the ``TOP_EXAMPLES``
    examples whose sentence score (first metric) differs most from the baseline's.

    Lengths are whitespace tokens of the sources, or of the first reference stream when there
    are no sources (``length_basis`` says which). Bucket scores are corpus scores of the bucket
    (ROUGE: the mean).
    """
    names = list(comparison["systems"])
    metrics = list(comparison["metrics"])
    n = comparison["n_examples"]
    basis = "source" if sources is not None else "reference"
    lengths = [len(t.split()) for t in (sources if sources is not None else refs[0])]
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
    for metric in metrics:
        for name in names:
            if metric in ROUGE_KEYS:
                scores = [row[metric] for row in rouge_rows[name]]
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
        upper = 100.0
        histograms[metric] = {
            "bins": [f"{int(upper * k / 10)}–{int(upper * (k + 1) / 10)}" for k in range(10)],
            "percent": {name: _histogram(per_sentence[metric][name], upper) for name in names},
        }
        if metric in LOWER_IS_BETTER:
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
                "references": [stream[i] for stream in refs],
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


# ---------------------------------------------------------------------------
# Table
# ---------------------------------------------------------------------------

_TEST_NAMES = {"bs": "paired bootstrap resampling", "ar": "paired approximate randomization"}


def describe_test(comparison: Mapping[str, Any]) -> str:
    test = comparison["paired_test"]
    what = f"{comparison['n_samples']} {'resamples' if test == 'bs' else 'trials'}"
    if test == "ar":
        what += f", intervals from {AR_CONFIDENCE_SAMPLES} bootstrap resamples"
    return (
        f"{_TEST_NAMES[test]} ({what}, seed {comparison['seed']}); {comparison['n_examples']} examples, "
        f"{comparison['n_references']} reference(s); baseline: {comparison['baseline']}"
    )


def table_rows(comparison: Mapping[str, Any]) -> list[list[str]]:
    """Rows of [system, metric, score, 95% CI, p-value, mark], grouped by metric."""
    rows = []
    for metric in comparison["metrics"]:
        for name in comparison["systems"]:
            r = comparison["results"][name][metric]
            p = "baseline" if r["p_value"] is None else f"{r['p_value']:.4f}"
            rows.append([name, metric, f"{r['score']:.2f}", f"[{r['ci_low']:.2f}, {r['ci_high']:.2f}]", p,
                         "*" if r["significant"] else ""])
    return rows


def format_table(comparison: Mapping[str, Any]) -> str:
    header = ["system", "metric", "score", "95% CI", "p-value", ""]
    rows = table_rows(comparison)
    widths = [max(len(r[k]) for r in [header, *rows]) for k in range(len(header))]
    right = {2, 3, 4}

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if k in right else c.ljust(w) for k, (c, w) in enumerate(zip(cells, widths))).rstrip()

    out = [describe_test(comparison), line(header)]
    previous = None
    for row in rows:
        if previous is not None and row[1] != previous:
            out.append("")
        out.append(line(row))
        previous = row[1]
    out.append(f"* p < {comparison['alpha']}: significantly different from the baseline")
    return "\n".join(out)


# ---------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """argparse that raises ConfigError instead of printing usage and exiting."""

    def error(self, message: str) -> typing.NoReturn:
        raise ConfigError(f"compare: {message}")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="seq2seq_eval compare",
        allow_abbrev=False,
        description="Score systems against the same references and test each against the first "
        "(the baseline) with a paired test: sacrebleu's for bleu/chrf/chrf++/ter, the same tests over "
        "per-example scores for ROUGE.",
    )
    p.add_argument("--predictions", nargs="+", required=True,
                   help="generations files (one line per example) or --save_dir folders of earlier runs; "
                   "the first is the baseline")
    p.add_argument("--references", nargs="+", help="reference files, one stream each (default: from the run folders)")
    p.add_argument("--sources", help="source file, for the report's length buckets (default: from the run folders)")
    p.add_argument("--task", help="translation or summarization (default: the runs' --task); picks the default metrics")
    p.add_argument("--metrics", nargs="+",
                   help=f"comma- or space-separated, from {', '.join(METRICS)} "
                   "(default: bleu for translation, rouge for summarization)")
    p.add_argument("--paired_test", "--paired-test", dest="paired_test", choices=PAIRED_TESTS, default="bs",
                   help="bs: paired bootstrap resampling; ar: approximate randomization (default: bs)")
    p.add_argument("--n_samples", "--n-samples", dest="n_samples", type=int,
                   help="resamples (bs) or trials (ar) (default: 1000 for bs, 10000 for ar)")
    p.add_argument("--seed", type=int, default=SEED, help=f"seed of the resampling (default: {SEED})")
    p.add_argument("--names", nargs="+", help="system names, one per prediction (default: file or folder names)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--report", help="write a self-contained HTML report to this file")
    return p


class _System(NamedTuple):
    path: Path
    predictions: list[str]
    run: Run | None


def _load_system(arg: str) -> _System:
    path = Path(arg)
    if path.is_dir():
        run = load_run(path)
        return _System(path, run.predictions, run)
    if not path.exists():
        raise DataError(f"--predictions {arg}: no such file or directory")
    return _System(path, read_lines(path), None)


def _system_names(systems: Sequence[_System], names: Sequence[str] | None) -> list[str]:
    if names is not None:
        if len(names) != len(systems):
            raise ConfigError(f"--names: {len(names)} names for {len(systems)} predictions")
        if len(set(names)) != len(names):
            dup = next(x for x in names if names.count(x) > 1)
            raise ConfigError(f"--names: {dup!r} given twice; names must be unique")
        return list(names)
    out: list[str] = []
    for s in systems:
        # A run folder by its name, a file by its name without the extension.
        base = (s.path.resolve().name if s.run is not None else s.path.stem) or str(s.path)
        name, k = base, 2
        while name in out:
            name, k = f"{base} ({k})", k + 1
        out.append(name)
    return out


def _task(arg: str | None, runs: Sequence[Run]) -> str:
    if arg is not None:
        return arg
    tasks = {r.task for r in runs if r.task}
    if len(tasks) > 1:
        raise ConfigError(f"the runs disagree on the task ({', '.join(sorted(tasks))}); pass --task")
    if not tasks:
        raise ConfigError("--task is required when no prediction is a run folder with provenance")
    return tasks.pop()


def _references(args: argparse.Namespace, runs: Sequence[Run]) -> tuple[list[list[str]], str]:
    if args.references:
        return [read_lines(Path(r)) for r in args.references], " ".join(args.references)
    known = [r for r in runs if r.references is not None]
    if not known:
        why = "; ".join(f"{r.path}: {r.references_note}" for r in runs)
        reason = f"no references found for the runs ({why})" if runs else "a prediction is a bare file"
        raise ConfigError(f"--references is required: {reason}")
    # The first run's; compare_main checks that the other runs' agree.
    return known[0].references, str(known[0].path)  # type: ignore[return-value]


def _check_lengths(named: Mapping[str, _System], refs: Sequence[Sequence[str]], ref_names: Sequence[str],
                   sources: Sequence[str] | None, source_name: str) -> None:
    n = len(refs[0])
    if n == 0:
        raise DataError(f"{ref_names[0]}: no lines; expected one reference per example")
    for stream, name in zip(refs[1:], ref_names[1:]):
        if len(stream) != n:
            raise DataError(f"{name}: {len(stream)} lines but {ref_names[0]} has {n}")
    for system in named.values():
        if len(system.predictions) != n:
            what = system.path / f"{system.run.type_path}_generations.txt" if system.run else system.path
            raise DataError(
                f"{what}: {len(system.predictions)} lines but {ref_names[0]} has {n}; expected one prediction per reference"
            )
    if sources is not None and len(sources) != n:
        raise DataError(f"{source_name}: {len(sources)} lines but {ref_names[0]} has {n}")


def compare(
    systems: Mapping[str, Sequence[str]],
    references: Sequence[str] | Sequence[Sequence[str]],
    *,
    task: str = "translation",
    metrics: str | Sequence[str] | None = None,
    paired_test: str = "bs",
    n_samples: int | None = None,
    seed: int = SEED,
    rouge_scores: Mapping[str, Sequence[Mapping[str, float]]] | None = None,
) -> dict[str, Any]:
    """`seq2seq_eval compare` over lists (the Python API's `seq2seq_eval.compare(...)`): every
    system scored, each tested against the first (the baseline). ``systems``: name ->
    predictions in example order, baseline first. ``references``: one text per example, or
    reference streams as sacrebleu takes them. ``metrics``: default the task's. Returns what
    ``compare --json`` prints, less "inputs" (see compare_systems)."""
    default = default_metrics(task)  # checks the task even when metrics are given
    if isinstance(references, str) or not isinstance(references, Sequence):
        raise DataError(f"references: expected a list of texts or of reference streams, got {type(references).__name__}")
    streams = [references] if all(isinstance(r, str) for r in references) else list(references)
    names = metric_names(metrics) if metrics else default
    comparison = compare_systems(systems, streams, names, paired_test, n_samples, seed, rouge_scores=rouge_scores)
    comparison["task"] = task
    return comparison


def compare_main(argv: Sequence[str]) -> str:
    """``seq2seq_eval compare ...``: returns the text to print (the table, or JSON); writes
    the --report page. Raises ConfigError/DataError, which the CLI prints as one line."""
    args = build_parser().parse_args(list(argv))
    systems = [_load_system(p) for p in args.predictions]
    runs = [s.run for s in systems if s.run is not None]
    names = _system_names(systems, args.names)
    named = dict(zip(names, systems))
    task = _task(args.task, runs)
    metrics = metric_names(args.metrics) if args.metrics else default_metrics(task)
    n_samples = _check_samples(args.paired_test, args.n_samples)
    _check_seed(args.seed)
    refs, ref_origin = _references(args, runs)
    ref_names = list(args.references) if args.references else [ref_origin] * len(refs)
    sources: list[str] | None = None
    source_name = ""
    if args.sources:
        sources, source_name = read_lines(Path(args.sources)), args.sources
    else:
        with_sources = [r for r in runs if r.sources is not None]
        if with_sources:
            sources, source_name = with_sources[0].sources, str(with_sources[0].path)
    _check_lengths(named, refs, ref_names, sources, source_name)
    # Every run folder whose data could be read must list the same ids in the same order, and
    # (unless --references replaces them) the same references.
    with_ids = [r for r in runs if r.ids is not None]
    ids = with_ids[0].ids if with_ids else None
    for run in runs:
        check_same_examples(run, ids, str(with_ids[0].path) if with_ids else "")
        if not args.references:
            check_same_examples(run, None, ref_origin, refs[0])

    predictions = {name: s.predictions for name, s in named.items()}
    rouge_keys = [m for m in metrics if m in ROUGE_KEYS]
    rouge_rows = {name: _rouge_matrix(preds, refs) for name, preds in predictions.items()} if rouge_keys else None
    comparison = compare(predictions, refs, task=task, metrics=metrics, paired_test=args.paired_test,
                         n_samples=n_samples, seed=args.seed, rouge_scores=rouge_rows)
    comparison["inputs"] = {name: str(s.path) for name, s in named.items()}
    out = json.dumps(comparison, indent=1, ensure_ascii=False) if args.json else format_table(comparison)
    if args.report:
        from .html_report import render_report
        from .atomic import write_atomic

        details = report_details(comparison, predictions, refs, sources, ids, rouge_rows)
        write_atomic(Path(args.report), render_report(comparison, details).encode("utf-8"))
        if not args.json:
            out += f"\nreport: {args.report}"
    return out


class _CallableModule(types.ModuleType):
    """`seq2seq_eval.compare` names both this module (the subcommand, compare_systems, ...) and the
    Python API's `compare()` function: calling the module calls the function, so the package
    exports one name and `from seq2seq_eval import compare` keeps working both ways."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return compare(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
