"""Metric names and the task defaults, without importing any metric library.

The config checks ``--metrics`` at parse time, before torch, sacrebleu or rouge-score are
imported, so a typo costs no start-up time; ``metrics.py`` builds the metrics themselves.
"""

from __future__ import annotations

from ..errors import ConfigError

METRIC_NAMES = ("bleu", "chrf", "chrf++", "ter", "rouge")
"""Every name ``--metrics`` accepts: sacrebleu's BLEU(), CHRF(), CHRF(word_order=2), TER(), and rouge-score."""

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
        if name not in METRIC_NAMES:
            shown = repr(raw.strip()) if raw.strip() else "an empty name"
            raise ConfigError(f"--metrics {text!r}: unknown metric {shown}; valid names: {', '.join(METRIC_NAMES)}")
        if name in names:
            raise ConfigError(f"--metrics {text!r}: {name} is given twice")
        names.append(name)
    return tuple(names)
