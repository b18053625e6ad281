"""Metric names and the task defaults, without importing any metric library.

The config checks ``--metrics`` at parse time, before torch, sacrebleu or rouge-score are
imported, so a typo costs no start-up time; ``metrics.py`` builds the metrics themselves.
The run, ``score`` and ``compare`` (command line and Python) all read names here, so they
accept the same names and refuse the same mistakes.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import ConfigError
from . import registry

METRIC_NAMES = registry.TEXT_METRIC_NAMES
"""The text metrics: sacrebleu's BLEU(), CHRF(), CHRF(word_order=2), TER(), and rouge-score,
pure functions of strings."""


def accepted_metric_names() -> tuple[str, ...]:
    """Every name ``--metrics`` accepts: the text metrics, then the model metrics (registry.py)."""
    return METRIC_NAMES + registry.names()

TASK_DEFAULT_METRIC = {"translation": "bleu", "summarization": "rouge"}
"""The task's main metric: what a missing ``--metrics`` means, and what names the metric file."""

_ROUGE_PARTS = ("rouge1", "rouge2", "rougeL", "rougeLsum")


def parse_metric_names(spec: str | Sequence[str] | None, task: str) -> tuple[str, ...]:
    """``"bleu, chrf"`` (or ``["bleu", "chrf"]``, ``["bleu,chrf"]``) -> ``("bleu", "chrf")``;
    None (not given) gives the task's main metric.

    Names are case-insensitive and keep the order given (the first one orders the summary's
    lowest-scoring examples). An unknown, empty or repeated name, or no name at all (``''``),
    is a ConfigError: a typo never falls back to another metric.
    """
    if spec is None:
        family = "translation" if "translation" in task else "summarization" if "summarization" in task else None
        if family is None:
            raise ConfigError(f"--task {task!r}: expected a translation or summarization task")
        return (TASK_DEFAULT_METRIC[family],)
    parts = [spec] if isinstance(spec, str) else spec
    if not isinstance(parts, Sequence) or not all(isinstance(p, str) for p in parts):
        raise ConfigError(f"--metrics must be a comma-separated list of names, got {spec!r}")
    text = ",".join(parts)
    accepted = accepted_metric_names()
    if not text.strip():
        raise ConfigError(f"--metrics {text!r}: no metric given; valid names: {', '.join(accepted)} "
                          "(leave --metrics out for the task's metric)")
    names: list[str] = []
    for raw in text.split(","):
        name = raw.strip().lower()
        if name not in accepted:
            shown = repr(raw.strip()) if raw.strip() else "an empty name"
            hint = "; rouge reports rouge1, rouge2, rougeL and rougeLsum" if raw.strip() in _ROUGE_PARTS else ""
            raise ConfigError(f"--metrics {text!r}: unknown metric {shown}; valid names: {', '.join(accepted)}{hint}")
        if name in names:
            raise ConfigError(f"--metrics {text!r}: {name} is given twice")
        names.append(name)
    return tuple(names)


def split_metric_names(names: tuple[str, ...], task: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(text metrics, model metrics) of parsed names. The text metrics are never empty: with
    model metrics alone (``--metrics comet``) the task's main metric is computed beside them, as
    it names the metric file and ranks the lowest-scoring examples."""
    model_names = registry.names()
    text = tuple(n for n in names if n not in model_names)
    model = tuple(n for n in names if n in model_names)
    return (text or (TASK_DEFAULT_METRIC[task],)), model
