"""The model metrics there are: one registration line each in BUILTIN, and `register` for a
metric defined outside the package (a script's own, registered before it calls the tool on every
rank). Everything else reads them here: the metric names --metrics takes, EvalConfig's
metric_options and their checks, the run's, `score`'s and `compare`'s flags, the keywords of
score(), compare() and evaluate(), the summary, compare's lists and decimals, the docs' list,
and the one rule every entry point holds its inputs to (`check_inputs`: sources, references,
the most references per example), with what each metric is given of them and its signature."""

from __future__ import annotations

import argparse
import importlib
import re
from collections.abc import Mapping, Sequence
from typing import Any

from .. import numerics
from ..errors import ConfigError
from .model_metric import (
    MAX_TOKENS,
    OPTION_KINDS,
    Inputs,
    ModelMetric,
    ModelMetricSpec,
    Option,
    Ranks,
    columns,
    given_references,
    score_all,
    with_references,
)

BUILTIN = (
    "seq2seq_eval.scoring.comet",
    "seq2seq_eval.scoring.bertscore",
    "seq2seq_eval.scoring.metricx",
)
"""The package's model metrics: modules whose METRIC is a ModelMetricSpec, one line each."""

SHARED_OPTIONS = (MAX_TOKENS,)
"""Options every model metric reads (their names are not a metric's)."""

TEXT_METRIC_NAMES = ("bleu", "chrf", "chrf++", "ter", "rouge")
"""The text metrics' names, which no model metric may take (scoring/names.py's METRIC_NAMES)."""

_NAME = re.compile(r"[a-z][a-z0-9]*")  # also what the temp dir's claims/<metric>_<batch> accept (run/tmpdir.py)
_registered: dict[str, ModelMetricSpec] = {}
_loaded = False


def _builtins() -> None:
    global _loaded
    if not _loaded:
        _loaded = True
        for module in BUILTIN:
            register(importlib.import_module(module).METRIC)


def register(spec: ModelMetricSpec) -> None:
    """Adds a model metric. Its name and its options' names must be new: a name is lower-case
    letters and digits, not a text metric's; its options are named `<name>_<what>`."""
    _builtins()
    if not isinstance(spec, ModelMetricSpec):
        raise ConfigError(f"register: expected a ModelMetricSpec, got {type(spec).__name__}")
    if not _NAME.fullmatch(spec.name) or spec.name in TEXT_METRIC_NAMES or spec.name in _registered:
        raise ConfigError(f"register: metric name {spec.name!r} is taken or not lower-case letters and digits; "
                          f"taken: {', '.join(TEXT_METRIC_NAMES + tuple(_registered))}")
    if spec.aggregate not in ("mean",):
        raise ConfigError(f"register {spec.name}: aggregate {spec.aggregate!r}; expected mean")
    if not callable(spec.keys) and not callable(spec.records):
        _check_keys(spec, spec.value_keys({}), spec.record_keys({}))
    taken = set(option_names())
    for option in spec.options:
        names = (option.name, *option.aliases)
        bad = [n for n in names if not n.startswith(f"{spec.name}_") or n in taken or n == f"{spec.name}_signature"]
        if bad or option.kind not in OPTION_KINDS:
            raise ConfigError(f"register {spec.name}: option {bad[0] if bad else option.name!r}: expected a new "
                              f"name {spec.name}_<what> and a kind among str, int, float, bool")
        taken.update(names)
    _registered[spec.name] = spec


def _check_keys(spec: ModelMetricSpec, keys: tuple[str, ...], records: tuple[str, ...]) -> None:
    every = (*keys, *records)
    if not keys or len(set(every)) != len(every) or keys[0] != spec.name or any(
            not (k == spec.name or k.startswith(f"{spec.name}_")) or k == f"{spec.name}_signature" for k in every):
        shown = f"keys {keys}" + (f" and records {records}" if records else "")
        raise ConfigError(f"register {spec.name}: {shown}: expected distinct keys, "
                          f"{spec.name!r} first, the others named {spec.name}_<what>")


def specs() -> dict[str, ModelMetricSpec]:
    """Every model metric, by name, in registration order (the package's first)."""
    _builtins()
    return dict(_registered)


def names() -> tuple[str, ...]:
    return tuple(specs())


def get(name: str) -> ModelMetricSpec:
    found = specs().get(name)
    if found is None:
        raise ConfigError(f"{name!r} is not a model metric; model metrics: {', '.join(specs())}")
    return found


def options() -> tuple[Option, ...]:
    """Every option: each metric's, then the shared ones."""
    return tuple(o for s in specs().values() for o in s.options) + SHARED_OPTIONS


def option_names() -> tuple[str, ...]:
    """Every name an option is given by, aliases included."""
    _builtins()
    return tuple(n for o in (*(o for s in _registered.values() for o in s.options), *SHARED_OPTIONS)
                 for n in (o.name, *o.aliases))


def resolve_options(given: Mapping[str, Any] | Sequence[tuple[str, Any]], where: str = "") -> tuple[tuple[str, Any], ...]:
    """Every option's value, by its name, in options() order: the given ones (an alias counts
    as its option; None is not given) checked, the others their defaults. An unknown name, a
    value of the wrong kind or one given under two names is a ConfigError."""
    pairs = list(given.items()) if isinstance(given, Mapping) else list(given)
    by_name = {n: o for o in options() for n in (o.name, *o.aliases)}
    values: dict[str, Any] = {}
    for key, value in pairs:
        option = by_name.get(key)
        if option is None:
            raise ConfigError(f"{where}unknown model-metric option {key!r}; options: {', '.join(o.name for o in options())}")
        if value is None:
            continue
        if option.name in values:
            raise ConfigError(f"{where}--{option.name} is given twice (as {', '.join((option.name, *option.aliases))})")
        error = option.check(value, key)
        if error is not None:
            raise ConfigError(where + error)
        values[option.name] = float(value) if option.kind is float else value
    return tuple((o.name, values.get(o.name, o.default)) for o in options())


def refuse_unused(resolved: Mapping[str, Any], metric_names: Sequence[str], shown: str) -> None:
    """An option that would change nothing is refused: one set (to other than its default) for a
    metric `metric_names` does not hold, or a shared one with no model metric among them."""
    used = [n for n in metric_names if n in specs()]
    for spec in specs().values():
        for option in spec.options if spec.name not in used else ():
            if resolved[option.name] != option.default:
                raise ConfigError(f"--{option.name} applies to --metrics {spec.name}, which {shown} does not name; "
                                  f"add it there, or leave out --{option.name}")
    for option in SHARED_OPTIONS if not used else ():
        if resolved[option.name] != option.default:
            raise ConfigError(f"--{option.name} applies to the model metrics ({', '.join(specs())}), none of which "
                              f"{shown} names; leave it out")


def split_options(values: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the entries that are not model-metric options, those that are) of keyword arguments."""
    known = set(option_names())
    return ({k: v for k, v in values.items() if k not in known}, {k: v for k, v in values.items() if k in known})


def own_options(spec: ModelMetricSpec, resolved: Mapping[str, Any]) -> dict[str, Any]:
    """The options a metric's load and check get: its own, never another metric's model."""
    return {o.name: resolved[o.name] for o in spec.options}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Every option as a flag (`--name` and `--name-with-dashes`, and its aliases), given ones
    only in the namespace (argparse.SUPPRESS), under its own name."""
    for option in options():
        flags = []
        for n in (option.name, *option.aliases):
            flags += [f"--{n}"] + ([f"--{n.replace('_', '-')}"] if "_" in n else [])
        default = f" (default: {option.default})" if option.default not in (None, "", False) else ""
        if option.kind is bool:
            parser.add_argument(*flags, dest=option.name, action="store_true", default=argparse.SUPPRESS,
                                help=option.help)
        else:
            parser.add_argument(*flags, dest=option.name, type=option.kind, default=argparse.SUPPRESS,
                                help=option.help + default)


def inputs(name: str, resolved: Mapping[str, Any]) -> Inputs:
    """What a model metric reads of each example under the options: sources, references."""
    spec = get(name)
    return spec.inputs(own_options(spec, resolved))


def value_keys(name: str, resolved: Mapping[str, Any]) -> tuple[str, ...]:
    """A model metric's numeric per-example keys under the options, the main one first."""
    spec = get(name)
    keys, records = spec.value_keys(own_options(spec, resolved)), spec.record_keys(own_options(spec, resolved))
    _check_keys(spec, keys, records)
    return keys


def record_keys(name: str, resolved: Mapping[str, Any]) -> tuple[str, ...]:
    """A model metric's non-numeric per-example keys under the options (written, never averaged)."""
    spec = get(name)
    keys, records = spec.value_keys(own_options(spec, resolved)), spec.record_keys(own_options(spec, resolved))
    _check_keys(spec, keys, records)
    return records


def needing_sources(metric_names: Sequence[str], resolved: Mapping[str, Any]) -> tuple[str, ...]:
    """The model metrics among `metric_names` that read sources under the options."""
    return tuple(n for n in metric_names if n in specs() and inputs(n, resolved).sources)


def needing_references(metric_names: Sequence[str], resolved: Mapping[str, Any]) -> tuple[str, ...]:
    """The metrics among `metric_names` that read references under the options: every text metric,
    and the model metrics that say so."""
    return tuple(n for n in metric_names if n not in specs() or inputs(n, resolved).references)


def reads_references(name: str, resolved: Mapping[str, Any]) -> bool:
    """Whether a model metric reads references where there are any, under the options."""
    spec = get(name)
    return spec.reads_refs(own_options(spec, resolved))


def _given(spec: ModelMetricSpec, resolved: Mapping[str, Any]) -> str:
    """The metric with its options set to other than their defaults, as flags."""
    flags = [f"--{o.name}" + ("" if o.kind is bool else f" {resolved[o.name]}")
             for o in spec.options if resolved[o.name] != o.default]
    return " ".join([spec.name, "with", *flags]) if flags else spec.name


def _need(names: Sequence[str]) -> str:
    return f"{', '.join(names)} {'needs' if len(names) == 1 else 'need'}"


def check_inputs(metric_names: Sequence[str], resolved: Mapping[str, Any], shown: str, *,
                 no_sources: str | None = None, no_references: str | None = None,
                 references: int = 0, references_from: str = "") -> None:
    """The one rule every entry point (the run, `score`, `compare`, evaluate(), score(),
    compare()) holds its inputs to before any model loads, as a one-line ConfigError: a metric
    that reads sources is refused where there are none, one that needs references where there
    are none, and one that reads at most k references per example where an example has more.
    `no_sources`, `no_references`: None where the inputs hold them, else why they do not (or how
    to give them), in the entry point's words; `references`: the most references an example has,
    `references_from`: where they come from (`--references gives 2 per example`)."""
    problem = missing_inputs(metric_names, resolved, shown, no_sources=no_sources, no_references=no_references,
                             references=references, references_from=references_from)
    if problem is not None:
        raise ConfigError(problem)


def missing_inputs(metric_names: Sequence[str], resolved: Mapping[str, Any], shown: str, *,
                   no_sources: str | None = None, no_references: str | None = None,
                   references: int = 0, references_from: str = "") -> str | None:
    """check_inputs' one line, or None where the inputs give every metric what it reads (for a
    reader that raises its own error type with it)."""
    needing = needing_sources(metric_names, resolved)
    if needing and no_sources is not None:
        return f"{shown}: {_need(needing)} sources ({no_sources})"
    needing = needing_references(metric_names, resolved)
    if needing and no_references is not None:
        return (f"{shown}: {_need(needing)} references ({no_references}); only reference-free metrics run without "
                "them (docs/metrics.md#model-metrics)")
    for name in (n for n in metric_names if n in specs()):
        spec = get(name)
        most = spec.most_references(own_options(spec, resolved))
        if most is not None and references > most and reads_references(name, resolved):
            return (f"{shown}: {_given(spec, resolved)} reads at most {most} reference{'s' if most != 1 else ''} per example, and "
                    f"{references_from}; give at most {most}")
    return None


def signature(name: str, resolved: Mapping[str, Any], metric: ModelMetric, references: Sequence[Sequence[str]]) -> str:
    """The signature of a model metric's scores on these (given) references: its own, and for a
    metric whose references are optional (read where there are any, needed nowhere: XCOMET)
    which examples had them (model_metric.with_references)."""
    spec = get(name)
    own = own_options(spec, resolved)
    optional = spec.reads_refs(own) and not spec.inputs(own).references
    return with_references(metric.signature, references) if optional else metric.signature


def higher_is_better(metric: str) -> bool:
    """A model metric's direction (False: an error scale, lower is better)."""
    return get(metric).higher_is_better


def decimals(metric: str) -> int:
    """Digits compare's table shows: a model metric's own, 2 for the text metrics (0-100 scales)."""
    return specs()[metric].decimals if metric in specs() else 2


def load(name: str, resolved: Mapping[str, Any], device: Any = "cpu") -> ModelMetric:
    # Before the metric's model first runs: MKL takes its mode once, at its first call.
    numerics.pin(str(device).split(":")[0])
    spec = get(name)
    metric = spec.load(own_options(spec, resolved), device)
    # A checkpoint's narrow layers on one MKL thread: bits independent of the layout (numerics.py), recorded.
    if narrow := numerics.narrow_on_one_mkl_thread(metric, str(device).split(":")[0]):
        metric.narrow_layers = narrow
    return metric


def check(name: str, resolved: Mapping[str, Any]) -> None:
    """Before any work: the model can be found and is of a supported kind (typed error if not)."""
    spec = get(name)
    spec.check(own_options(spec, resolved))


def corpus_scores(metric_names: Sequence[str], resolved: Mapping[str, Any], sources: Sequence[str],
                  predictions: Sequence[str], references: Sequence[Sequence[str]],
                  ranks: Ranks | None = None) -> dict[str, Any]:
    """`score`'s model metrics (the first GPU, else the CPU; under torchrun, the rank's device
    and a share of the batches): each key's system score and the metric's signature."""
    import torch

    from ..errors import DataError

    if len(sources) != len(predictions):
        raise DataError(f"sources: {len(sources)} texts but {len(predictions)} predictions; expected one source per prediction")
    device = ranks.device if ranks is not None else "cuda" if torch.cuda.is_available() else "cpu"
    device_type = torch.device(device).type
    out: dict[str, Any] = {}
    for name in metric_names:
        spec = get(name)
        per_example = given_references(reads_references(name, resolved), references)
        metric = load(name, resolved, device)
        values = score_all(metric, sources, predictions, per_example, resolved[MAX_TOKENS.name],
                           device_type=device_type, ranks=ranks)
        # The records (non-numeric, per example) have no system score.
        for key, column in columns(value_keys(name, resolved), values, record_keys(name, resolved)).items():
            if key not in record_keys(name, resolved):
                out[key] = spec.system_score(column)
        out[f"{name}_signature"] = signature(name, resolved, metric, per_example)
    return out


def example_values(name: str, resolved: Mapping[str, Any], sources: Sequence[str],
                   predictions: Mapping[str, Sequence[str]], refs: Sequence[Sequence[str | None]]) -> dict[str, Any]:
    """compare's model metric: every system's per-example main value, in one process on the
    first GPU or the CPU, in length-sorted token-budget batches: {"values", "signature"}."""
    import torch

    spec = get(name)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    metric = load(name, resolved, device)
    per_example = given_references(reads_references(name, resolved), [[s[i] for s in refs] for i in range(len(sources))])
    keys, records = value_keys(name, resolved), record_keys(name, resolved)
    values = {system: columns(keys, score_all(metric, sources, preds, per_example, resolved[MAX_TOKENS.name],
                                              device_type=device), records)[spec.name]
              for system, preds in predictions.items()}
    return {"values": values, "signature": signature(name, resolved, metric, per_example)}
