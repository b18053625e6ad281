"""Every system scored and each tested against the first (the baseline): `compare_systems` over
prediction lists, `compare` (the Python API's `seq2seq_eval.compare(...)`) over one reference list
or several streams."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import ConfigError, DataError
from ..scoring import registry
from ..scoring.results import ROUGE_KEYS, SEED
from ..scoring.rouge import rouge_example_scores
from .paired import (
    ALPHA,
    AR_CONFIDENCE_SAMPLES,
    SACREBLEU_METRICS,
    PairedResult,
    _check_samples,
    _sacrebleu_paired,
    default_metrics,
    example_mean_metrics,
    lower_is_better,
    metric_names,
    rouge_baseline_interval,
    rouge_paired_test,
)


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


def _check_inputs(systems: Mapping[str, Sequence[str]], refs: Sequence[Sequence[str | None]],
                  metrics: Sequence[str]) -> int:
    if len(systems) < 2:
        raise ConfigError(f"--predictions needs at least 2 systems (the first is the baseline), got {len(systems)}")
    if isinstance(refs, str) or (refs and isinstance(refs[0], str)):
        raise ConfigError("references must be a list of reference streams (a list of lists of strings)")
    # The text metrics are scored here, on every example's references; the model metrics' values are given.
    registry.check_inputs([m for m in metrics if m not in example_mean_metrics()], {}, f"metrics {','.join(metrics)}",
                          no_references=None if refs and all(r is not None for r in refs[0]) else
                          "no reference streams given" if not refs else "an example has no reference")
    n = len(refs[0]) if refs else len(next(iter(systems.values())))
    if n == 0:
        raise DataError(f"the {'references' if refs else 'predictions'} hold no examples")
    for k, stream in enumerate(refs[1:], start=2):
        if len(stream) != n:
            raise DataError(f"reference stream {k} has {len(stream)} lines but stream 1 has {n}")
    for name, hyps in systems.items():
        if len(hyps) != n:
            raise DataError(f"system {name}: {len(hyps)} predictions but the {'references have' if refs else 'baseline has'} "
                            f"{n} lines")
    return n


def compare_systems(
    systems: Mapping[str, Sequence[str]],
    refs: Sequence[Sequence[str | None]] | None,
    metrics: Sequence[str] = ("bleu",),
    paired_test: str = "bs",
    n_samples: int | None = None,
    seed: int = SEED,
    rouge_scores: Mapping[str, Sequence[Mapping[str, float]]] | None = None,
    example_scores: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """Score every system and test each against the first (the baseline).

    ``systems``: name -> predictions, in example order, baseline first. ``refs``: reference
    streams (``[refs]`` for one reference per example; none, ``[]`` or None, where every metric is
    a model metric whose values are given). ``rouge_scores`` optionally gives
    per-example ROUGE already computed (name -> ``rouge_example_scores`` rows, e.g. a run's
    ``metric_stats``), so they are not computed again. ``example_scores`` gives the per-example
    main values of the model metrics (paired.example_mean_metrics): metric -> ``{"values":
    {system name: values}, "signature": the metric's signature}``.

    Returns ``{"systems", "baseline", "metrics", "paired_test", "n_samples", "seed", "alpha",
    "n_examples", "n_references", "signatures", "results"}``, where
    ``results[system][metric]`` is ``{"score", "ci_low", "ci_high", "p_value", "significant"}``
    (``p_value`` None and ``significant`` False for the baseline).
    """
    metrics = metric_names(metrics)
    refs = list(refs or [])
    n = _check_inputs(systems, refs, metrics)
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
    for metric in (m for m in metrics if m in example_mean_metrics()):
        entry = (example_scores or {}).get(metric) or {}
        given = entry.get("values") or {}
        if any(name not in given for name in names):
            raise ConfigError(f"--metrics {metric}: needs per-example {metric} scores of every system "
                              "(compare and compare() score them; compare_systems: example_scores)")
        columns = {name: list(given[name]) for name in names}
        for name, col in columns.items():
            if len(col) != n:
                raise DataError(f"system {name}: {len(col)} per-example {metric} scores for {n} examples")
        results[names[0]][metric] = rouge_baseline_interval(columns[names[0]], paired_test, n_samples, seed)
        for name in names[1:]:
            results[name][metric] = rouge_paired_test(columns[names[0]], columns[name], paired_test, n_samples, seed)
        parts = [str(entry.get("signature", metric)), f"{paired_test}:{n_samples}"]
        signatures[metric] = "|".join(parts + ([f"bs:{AR_CONFIDENCE_SAMPLES}"] if paired_test == "ar" else []) + [f"seed:{seed}"])
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
            name: {m: _result_dict(results[name][m], results[names[0]][m], lower_is_better(m)) for m in metrics}
            for name in names
        },
        # Per metric, the system with the best score in the metric's direction (the first on a tie).
        "best": {m: (min if lower_is_better(m) else max)(names, key=lambda name: results[name][m].score)
                 for m in metrics},
    }


def _result_dict(result: PairedResult, baseline: PairedResult, lower: bool) -> dict[str, Any]:
    """`better`: whether the system scores better than the baseline in the metric's direction
    (None for the baseline itself)."""
    return {
        "score": result.score,
        "ci_low": result.ci_low,
        "ci_high": result.ci_high,
        "p_value": result.p_value,
        "significant": _significant(result, baseline),
        "better": None if result.p_value is None else (result.score < baseline.score if lower
                                                       else result.score > baseline.score),
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


def compare(
    systems: Mapping[str, Sequence[str]],
    references: Sequence[str] | Sequence[Sequence[str]] | None,
    *,
    task: str | None = "translation",
    metrics: str | Sequence[str] | None = None,
    paired_test: str | None = "bs",
    n_samples: int | None = None,
    seed: int | None = SEED,
    rouge_scores: Mapping[str, Sequence[Mapping[str, float]]] | None = None,
    reference_layout: str | None = None,
    example_scores: Mapping[str, Mapping[str, Any]] | None = None,
    sources: Sequence[str] | None = None,
    **metric_options: Any,
) -> dict[str, Any]:
    """`seq2seq_eval compare` over lists (the Python API's `seq2seq_eval.compare(...)`): every
    system scored, each tested against the first (the baseline). ``systems``: a dict (any
    mapping) of name -> predictions in example order, baseline first. ``references``: as
    `score` takes them (one text or list of texts per example, or reference streams;
    ``reference_layout`` for the shape that fits both; None where every metric is reference-free,
    as `score` takes it). ``metrics``: default the task's; a model metric scores every system here, as ``compare --metrics comet`` does, with its options by
    name (``comet_model=...``, as `score` takes them) and ``sources`` (one per example) where it
    needs them; ``example_scores`` gives its values instead. Returns what ``compare --json``
    prints, less "inputs" (see compare_systems). ``sources``, when given, are checked as a run
    checks them (one text per example). None for any keyword means not given: its default."""
    from ..inputs.memory import source_texts, texts
    from ..scoring.names import parse_metric_names
    from ..scoring.references import per_example

    task = "translation" if task is None else task
    paired_test = "bs" if paired_test is None else paired_test
    seed = SEED if seed is None else seed
    options = dict(registry.resolve_options(metric_options, "compare(): "))
    default_metrics(task)  # checks the task even when metrics are given
    if not isinstance(systems, Mapping):
        raise ConfigError(f"compare(systems): expected a dict of name -> predictions (baseline first), got "
                          f"{type(systems).__name__}; e.g. {{'baseline': preds_a, 'new': preds_b}}")
    for name, hyps in systems.items():
        if not isinstance(name, str):
            raise ConfigError(f"compare(systems): system names must be strings, got {name!r}")
        if isinstance(hyps, str) or not isinstance(hyps, Sequence) or not all(isinstance(h, str) for h in hyps):
            raise DataError(f"compare(systems): system {name}: expected a list of predictions (texts), "
                            f"got {type(hyps).__name__}")
        texts(hyps, f"compare(systems): system {name}: predictions")  # UTF-8 text, as score()'s
    names = metric_names(parse_metric_names(metrics, task))  # "rouge": its four keys
    registry.refuse_unused(options, names, f"metrics={metrics!r}")
    n = len(next(iter(systems.values()))) if systems else 0
    rows = per_example(references, n, reference_layout) if n and references is not None else None
    if rows is None:
        streams: list[list[Any]] = [list(references)] if isinstance(references, Sequence) else []
    else:
        k = max(len(r) for r in rows)
        streams = [[r[j] if j < len(r) else None for r in rows] for j in range(k)]
    srcs = source_texts(sources, n) if sources is not None else None
    if example_scores is None:
        # The run's, score's and the command's rule, before any model loads.
        registry.check_inputs(names, options, f"compare(metrics={','.join(names)})",
                              no_sources=None if srcs is not None else "sources=, one per example",
                              no_references=None if references is not None else "references=, one or more per example",
                              references=len(streams), references_from=f"references= gives {len(streams)} for an example")
        example_scores = model_metric_values(names, options, srcs, systems, streams)
    comparison = compare_systems(systems, streams, names, paired_test, n_samples, seed, rouge_scores=rouge_scores,
                                 example_scores=example_scores)
    comparison["task"] = task
    return comparison


def model_metric_values(metrics: Sequence[str], options: Mapping[str, Any], sources: Sequence[str] | None,
                        predictions: Mapping[str, Sequence[str]], refs: Sequence[Sequence[str | None]]) -> dict[str, Any] | None:
    """Every model metric among `metrics` scored on every system (registry.example_values), or
    None when there is none; the inputs are checked first (registry.check_inputs)."""
    wanted = [m for m in metrics if m in example_mean_metrics()]
    if not wanted:
        return None
    n = len(next(iter(predictions.values()))) if predictions else 0
    texts = sources if sources is not None else [""] * n
    return {m: registry.example_values(m, options, texts, predictions, refs) for m in wanted}
