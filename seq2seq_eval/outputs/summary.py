"""What a finished run prints and records about itself: the summary table, the lowest-scoring
examples, package versions and the date for the provenance."""

from __future__ import annotations

import platform
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from importlib import metadata
from typing import Any

from ..scoring import registry
from ..scoring.totals import MetricTotals, worst
from ..version import __version__

VERSIONED = ("torch", "transformers", "datasets", "sacrebleu", "rouge-score", "seq2seq_eval")


def package_versions() -> dict[str, str]:
    versions = {}
    for name in VERSIONED:
        if name == "seq2seq_eval":
            # The code that ran, also from a checkout on PYTHONPATH (no installed metadata there),
            # and not another installed copy's.
            versions[name] = __version__
            continue
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    versions["python"] = platform.python_version()
    return versions


def lowest_scoring_line(store: Any, totals: MetricTotals | None, k: int = 5, first: str | None = None,
                        model_scores: Mapping[str, Any] | None = None) -> str | None:
    """The summary line naming the `k` worst examples by the first metric --metrics names (`first`),
    worst first in its direction (for TER or MetricX the highest: error scales): a model
    metric's main value from `model_scores` (run.model_scores'), else the first text metric's
    sentence score from `totals`. None when there is nothing to rank by."""
    entry = (model_scores or {}).get(first) if first is not None else None
    if entry is not None:
        key, decimals = first, registry.get(first).decimals
        positions, values = worst(entry["values"][first], entry["higher_is_better"], k)
    elif totals is not None:
        (key, positions, values), decimals = totals.lowest(k), 1
    else:
        return None
    shown = ", ".join(f"{i} ({v:.{decimals}f})" for i, v in zip(store.ids(positions), values))
    return f"{'lowest ' + key + ' ids':<28}{shown}"


def now_iso() -> str:
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat()


def summary_table(metrics: Mapping[str, Any], per_rank: Sequence[Mapping[str, Any]]) -> str:
    """A short human summary; the JSON file holds the full figures."""
    width = 28
    lines = []
    # The model metrics' numeric keys (named <metric> or <metric>_<what>), as the metric file holds them.
    model_keys = tuple(k for k, v in metrics.items() if isinstance(v, float) and any(
        k == n or k.startswith(f"{n}_") for n in registry.names()))
    shown = [k for k in ("bleu", "chrf", "chrf++", "ter", "rouge1", "rouge2", "rougeL", "rougeLsum", *model_keys)
             if k in metrics]
    for key in shown:
        ci = ""
        if f"{key}_ci_low" in metrics:
            ci = f"  (95% CI {metrics[f'{key}_ci_low']:.2f}-{metrics[f'{key}_ci_high']:.2f})"
        lines.append(f"{key:<{width}}{metrics[key]:>12.4f}{ci}")
    tp = metrics.get("throughput", {})
    lines.append(f"{'n_obs':<{width}}{metrics.get('n_obs', 0):>12d}")
    if tp.get("generated_examples") == 0:
        # A resumed run whose batches were all journaled: nothing was timed, so no rates.
        lines.append(f"{'newly generated':<{width}}{0:>12d}  (every batch came from the journal)")
    for key, fmt in (("samples_per_second", ".2f"), ("generated_tokens_per_second", ".1f")):
        if tp.get(key) is not None:
            lines.append(f"{key:<{width}}{tp[key]:>12{fmt}}")
    if tp.get("split_batches"):
        # Said only when it happened: a split batch's outputs may differ in the last bits (run/oom.py).
        lines.append(f"{'split_batches':<{width}}{tp['split_batches']:>12d}  (out of memory: split in halves and retried)")
    if tp.get("moved_batches"):
        lines.append(f"{'moved_batches':<{width}}{tp['moved_batches']:>12d}  (taken by a rank that ran out of work from a slower one)")
    if per_rank:
        lines.append(f"{'rank':>6}{'examples':>10}{'batches':>9}{'taken':>7}{'resumed':>9}{'tokens':>9}{'gen s':>9}")
        for r in per_rank:
            lines.append(
                f"{r['rank']:>6}{r['examples']:>10}{r['batches']:>9}{r.get('stolen_batches', 0):>7}{r['resumed_batches']:>9}"
                f"{r['generated_tokens']:>9}{r['generation_seconds']:>9.2f}"
            )
    return "\n".join(lines)
