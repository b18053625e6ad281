"""Which selections exist: one Selector per (mode, metric), registered here by one line each, built
once per process and handed every example's candidates.

A selector is what `select` and a run's `--select` call; neither knows how a selection is computed.
The sacrebleu utilities (mbr.py) register below; a model metric's selection (COMET, MetricX,
BERTScore as MBR utilities, CometKiwi and MetricX-QE as QE rerankers) is one module and its line.
A factory receives the model-metric options as resolved (scoring/registry.resolve_options) and a
`load(name)` that returns the process's one loaded ModelMetric of that name, so a model used both
to select and by --metrics is loaded once per rank.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..errors import ConfigError
from .base import Selector
from .candidates import CandidateSet
from .mbr import MBR_UTILITIES, Selection, select_mbr

MODES = ("mbr", "qe")


class TextMBR(Selector):
    """MBR with a sacrebleu sentence score as the utility (mbr.py): pure, no model."""

    def __init__(self, metric: str) -> None:
        self.mode, self.metric = "mbr", metric

    def signature(self) -> str:
        import sacrebleu

        return f"mbr:{self.metric}|sacrebleu:{sacrebleu.__version__}|uniform|float64"

    def select(self, sets: Sequence[CandidateSet]) -> list[Selection]:
        return [select_mbr(s.candidates, self.metric) for s in sets]


Factory = Callable[[Mapping[str, Any], Callable[[str], Any]], Selector]
"""(resolved model-metric options, load) -> Selector."""

_SELECTORS: dict[tuple[str, str], Factory] = {}


def register(mode: str, metric: str, factory: Factory) -> None:
    if mode not in MODES:
        raise ValueError(f"selection mode must be one of {', '.join(MODES)}, got {mode!r}")
    if (mode, metric) in _SELECTORS:
        raise ValueError(f"a selector for --select {mode} --select_metric {metric} is registered already")
    _SELECTORS[(mode, metric)] = factory


for _utility in MBR_UTILITIES:
    register("mbr", _utility, lambda resolved, load, _u=_utility: TextMBR(_u))


def _model(mode: str, metric: str) -> Factory:
    """A model metric's selection (models.py), imported when built: it subclasses Selector."""
    def factory(resolved: Mapping[str, Any], load: Callable[[str], Any]) -> Selector:
        from .models import ModelSelector

        return ModelSelector(mode, metric, resolved, load)
    return factory


register("mbr", "comet", _model("mbr", "comet"))
register("qe", "comet", _model("qe", "comet"))
register("mbr", "metricx", _model("mbr", "metricx"))
register("qe", "metricx", _model("qe", "metricx"))
register("mbr", "bertscore", _model("mbr", "bertscore"))


def metrics_for(mode: str) -> tuple[str, ...]:
    return tuple(m for (md, m) in _SELECTORS if md == mode)


def check_selection(mode: str, metric: str) -> None:
    """The mode and its metric by name, before anything is read: one line each for what cannot
    work and for what is not built. Every metric name the tool knows (scoring/names.py) is judged
    by its kind, so a model metric without a selector is named as not built, never run."""
    from ..scoring import registry
    from ..scoring.names import accepted_metric_names

    if mode not in MODES:
        raise ConfigError(f"--select {mode!r}: expected one of {', '.join(MODES)}")
    if (mode, metric) in _SELECTORS:
        return
    models = registry.names()
    texts = [n for n in accepted_metric_names() if n not in models]
    usable = metrics_for(mode)
    expected = f"expected {' or '.join(usable)}" if usable else "no metric is built for it yet"
    if mode == "qe" and metric in texts:
        raise ConfigError(f"--select qe --select_metric {metric}: {metric} needs a reference, and qe scores each "
                          f"candidate against its source alone; {expected} (a reference-free model)")
    if metric in models:
        raise ConfigError(f"--select {mode} --select_metric {metric}: {mode} with {metric} is not built; {expected}")
    kind = f"is not a {mode} metric here" if metric in texts else "is not a metric the tool knows"
    raise ConfigError(f"--select {mode} --select_metric {metric!r} {kind}; {expected}")


def make_selector(mode: str, metric: str, resolved: Mapping[str, Any] | None = None,
                  load: Callable[[str], Any] | None = None) -> Selector:
    """The checked selector. `load(name)` returns the process's loaded ModelMetric `name`; the
    default loads it on the CPU once for this selector."""
    check_selection(mode, metric)
    resolved = dict(resolved or {})
    if load is None:
        from ..scoring import registry

        cache: dict[str, Any] = {}

        def load(name: str) -> Any:
            if name not in cache:
                cache[name] = registry.load(name, resolved)
            return cache[name]

    selector = _SELECTORS[(mode, metric)](resolved, load)
    selector.check()
    return selector
