"""The comparison as text: the test's description and the table the command prints (the HTML
report shows the same rows)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..scoring.registry import decimals
from .paired import (
    AR_CONFIDENCE_SAMPLES,
    lower_is_better,
)

_TEST_NAMES = {"bs": "paired bootstrap resampling", "ar": "paired approximate randomization"}


def describe_test(comparison: Mapping[str, Any]) -> str:
    test = comparison["paired_test"]
    what = f"{comparison['n_samples']} {'resamples' if test == 'bs' else 'trials'}"
    if test == "ar":
        what += f", intervals from {AR_CONFIDENCE_SAMPLES} bootstrap resamples"
    return (
        f"{_TEST_NAMES[test]} ({what}, seed {comparison['seed']}); {comparison['n_examples']} examples, "
        f"{str(comparison['n_references']) + ' reference(s)' if comparison['n_references'] else 'no references'}; "
        f"baseline: {comparison['baseline']}"
    )


def table_rows(comparison: Mapping[str, Any]) -> list[list[str]]:
    """Rows of [system, metric, score, 95% CI, p-value, mark], grouped by metric."""
    rows = []
    for metric in comparison["metrics"]:
        for name in comparison["systems"]:
            r = comparison["results"][name][metric]
            p = "baseline" if r["p_value"] is None else f"{r['p_value']:.4f}"
            d = decimals(metric)  # a model metric's own; the text metrics' 0-100 scales: 2
            rows.append([name, metric, f"{r['score']:.{d}f}", f"[{r['ci_low']:.{d}f}, {r['ci_high']:.{d}f}]", p,
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
    if comparison.get("best"):
        out.append("best: " + "; ".join(f"{m} {name}" + (" (lower is better)" if lower_is_better(m) else "")
                                        for m, name in comparison["best"].items()))
    out += [f"not compared: {why}" for why in (comparison.get("not_compared") or {}).values()]
    return "\n".join(out)
