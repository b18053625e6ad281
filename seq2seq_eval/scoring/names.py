"""Metric names and the task defaults, without importing any metric library.

The config checks ``--metrics`` at parse time, before torch, sacrebleu or rouge-score are
imported, so a typo costs no start-up time; ``metrics.py`` builds the metrics themselves.
"""

from __future__ import annotations

from ..errors import ConfigError

METRIC_NAMES = ("bleu", "chrf", "chrf++", "ter", "rouge")
"""The text metrics: sacrebleu's BLEU(), CHRF(), CHRF(word_order=2), TER(), and rouge-score,
pure functions of strings."""

MODEL_METRIC_NAMES = ("comet",)
"""Metrics that run a model on the ranks (scoring/model_metric.py's MODEL_METRICS)."""

ACCEPTED_METRIC_NAMES = METRIC_NAMES + MODEL_METRIC_NAMES
"""Every name ``--metrics`` accepts."""

TASK_DEFAULT_METRIC = {"translation": "bleu", "summarization": "rouge"}
"""The task's main metric: what an empty ``--metrics`` means, and what names the metric file."""


def parse_metric_names(text: str, task: str) -> tuple[str, ...]:
    """``"bleu, chrf"`` -> ``("bleu", "chrf")``; an empty text gives the task's main metric.

    Names are case-insensitive and keep the order given (the first one orders the summary's
    lowest-scoring examples). An unknown or repeated name is a ConfigError.
    """
    if not isinstance(text, str):
        raise ConfigError(f"--metrics must be a comma-separated list of names, got {text!r}")
    if not text.strip():
        return (TASK_DEFAULT_METRIC[task],)
    names: list[str] = []
    for raw in text.split(","):
        name = raw.strip().lower()
        if name not in ACCEPTED_METRIC_NAMES:
            shown = repr(raw.strip()) if raw.strip() else "an empty name"
            raise ConfigError(f"--metrics {text!r}: unknown metric {shown}; valid names: {', '.join(ACCEPTED_METRIC_NAMES)}")
        if name in names:
            raise ConfigError(f"--metrics {text!r}: {name} is given twice")
        names.append(name)
    return tuple(names)


def split_metric_names(names: tuple[str, ...], task: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(text metrics, model metrics) of parsed names. The text metrics are never empty: with
    model metrics alone (``--metrics comet``) the task's main metric is computed beside them, as
    it names the metric file and ranks the lowest-scoring examples."""
    text = tuple(n for n in names if n not in MODEL_METRIC_NAMES)
    model = tuple(n for n in names if n in MODEL_METRIC_NAMES)
    return (text or (TASK_DEFAULT_METRIC[task],)), model
