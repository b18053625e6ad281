"""Metrics that run a model on the ranks (COMET, BERTScore, MetricX): what one declares about
itself (`ModelMetricSpec`, its `Option`s), the interface of a loaded one (`ModelMetric`), and
their batches. A metric is one module (or subpackage) whose `METRIC` is its spec, plus its line in
`registry.BUILTIN`; the run, `score`, `compare`, the API and their flags read everything about it
from the registry.

What a spec declares, each either fixed or a function of the metric's own options (by name; the
same options its `load` gets), so that one module can hold a family whose variants differ:

* direction: `higher_is_better` (True for COMET, False for MetricX's error scale); compare's
  paired tests and report, the summary and the lowest-scoring examples follow it.
* inputs: `needs_sources` and `needs_references` (a reference-free variant, such as MetricX's
  --metricx_qe or a CometKiwi checkpoint, says False); a metric that needs no reference runs on
  inputs that have none, one that needs sources is refused without them. `reads_references`
  (default: as `needs_references`): whether it reads references where there are any; a metric
  that reads none is given none, and one that reads them without needing them (XCOMET) has
  its signature say which examples had them. `max_references`: the most it reads per example
  (None: any number); more are refused before any work (registry.check_inputs).
* keys: `keys`, its numeric per-example keys, the main one first (default: the name alone). Each
  goes into the examples file per example and, aggregated, into the metric file; compare tests
  the main one.
* records: `records`, per-example keys whose values are not numbers (XCOMET's error spans: per
  example a list of dicts, plain JSON): written per example in the examples file, never
  aggregated, compared nor put in the metric file.

A loaded metric's `score` returns per example a Value: with one key and no record a float, else a
tuple of the numeric keys' floats then the records' values, in the declared order. A model metric
is loaded once per rank on the rank's device, and its system score aggregates each numeric key's
values. Batches are cut from all examples by `model_batches` (on the ranks, then dealt to them),
so values do not depend on the world size nor on where they are scored; a metric whose forward
pass costs more per example than its input tokens (logits over a vocabulary) says so in
`ModelMetric.row_tokens`, and the batches are cut by that cost too."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

Value = float | tuple[Any, ...]
"""One example's value: a float, or with several keys (or any record) a tuple: the numeric keys'
floats, then the records' JSON values, in the declared order."""

Declared = Any
"""A declaration that may depend on the metric's options: the value itself, or a function of the
metric's own options (by name) that returns it."""


def _declared(value: Declared, options: Mapping[str, Any]) -> Any:
    return value(options) if callable(value) else value

OPTION_KINDS = (str, int, float, bool)


@dataclass(frozen=True)
class Option:
    """One setting of a model metric. Its name is its key in EvalConfig.metric_options, its flag
    (`--name` and `--name-with-dashes`) on the run, `score` and `compare`, and its keyword in
    score(), compare() and evaluate(); a metric's options are named `<metric>_<what>`."""

    name: str
    default: Any
    help: str
    """What it is, for --help and the docs (the default is added)."""
    kind: type = str
    """str, int, float or bool (a switch on the command line: given means True)."""
    valid: Callable[[Any], bool] | None = None
    """A check beyond the kind; `expected` says what it wants."""
    expected: str = ""
    aliases: tuple[str, ...] = ()
    """Earlier names, taken as this one by every entry point."""

    def check(self, value: Any, given_as: str | None = None) -> str | None:
        """None if `value` is fine, else the one-line error: what was given (under the name
        `given_as`, an alias), what was expected."""
        if value is None and self.default is None:
            return None
        ok = isinstance(value, bool) if self.kind is bool else (
            isinstance(value, self.kind) and not isinstance(value, bool)
            or (self.kind is float and isinstance(value, int) and not isinstance(value, bool)))
        if ok and (self.valid is None or self.valid(value)):
            return None
        what = self.expected or {str: "a text", int: "an integer", float: "a number", bool: "true or false"}[self.kind]
        return f"--{given_as or self.name} {value!r}: expected {what}"


AGGREGATES: dict[str, Callable[[Sequence[float]], float]] = {
    # math.fsum: the same value whatever order the examples were scored in.
    "mean": lambda values: math.fsum(values) / len(values) if values else float("nan"),
}
"""How a system score is made from per-example values. compare's paired tests resample the mean."""


@dataclass(frozen=True)
class ModelMetricSpec:
    """What a model metric declares about itself; nothing else in the package names it."""

    name: str
    """Its name in --metrics: lower-case letters and digits."""
    what: str
    """One line: what is computed (the metric names' help)."""
    load: Callable[[Mapping[str, Any], Any], ModelMetric]
    """(its options by name, a torch device) -> the loaded metric."""
    check: Callable[[Mapping[str, Any]], None]
    """Its options by name -> None, or a typed error; finds the model without loading it (before any work)."""
    options: tuple[Option, ...] = ()
    needs_sources: bool | Callable[[Mapping[str, Any]], bool] = False
    """Whether it reads each example's source (fixed, or a function of its own options)."""
    needs_references: bool | Callable[[Mapping[str, Any]], bool] = True
    """Whether it reads each example's references: False for a reference-free (quality
    estimation) metric or variant, which then runs on inputs that have none."""
    reads_references: bool | Callable[[Mapping[str, Any]], bool] | None = None
    """Whether it reads an example's references where there are any (None: as needs_references).
    False: it is given none, whatever the inputs hold. True beside needs_references False: they are
    optional (XCOMET falls back to [mt, src] on an example without one), and its signature says
    which examples had them (`refs:all`, `refs:none`, `refs:K/N`)."""
    max_references: int | Callable[[Mapping[str, Any]], int | None] | None = None
    """The most references per example it reads (None: any number); inputs with more are refused
    before any work."""
    keys: tuple[str, ...] | Callable[[Mapping[str, Any]], tuple[str, ...]] = ()
    """Its numeric per-example keys, the main one first (default: the name alone). Each goes into
    the examples file per example and, aggregated, into the metric file; compare tests the main one."""
    records: tuple[str, ...] | Callable[[Mapping[str, Any]], tuple[str, ...]] = ()
    """Its per-example keys that are not numbers (plain JSON, such as a list of dicts): written per
    example in the examples file, after the numeric keys; never aggregated nor compared."""
    higher_is_better: bool = True
    """The direction of every numeric key: False for an error scale (MetricX: 0 best, 25 worst)."""
    aggregate: str = "mean"
    """The system score of each key from its per-example values: a name in AGGREGATES."""
    decimals: int = 4
    """Digits after the point in compare's table."""
    scale: float = 1.0
    """The upper end of its usual range, from 0 (compare's report bins its histograms over it)."""

    def inputs(self, options: Mapping[str, Any]) -> Inputs:
        """What it reads of each example under these (its own) options."""
        return Inputs(bool(_declared(self.needs_sources, options)), bool(_declared(self.needs_references, options)))

    def reads_refs(self, options: Mapping[str, Any]) -> bool:
        """Whether it reads references where there are any, under these (its own) options."""
        declared = self.needs_references if self.reads_references is None else self.reads_references
        return bool(_declared(declared, options))

    def most_references(self, options: Mapping[str, Any]) -> int | None:
        """The most references per example it reads under these (its own) options (None: any)."""
        most = _declared(self.max_references, options)
        return None if most is None else int(most)

    def value_keys(self, options: Mapping[str, Any]) -> tuple[str, ...]:
        """Its numeric keys under these (its own) options, the main one first."""
        return tuple(_declared(self.keys, options)) or (self.name,)

    def record_keys(self, options: Mapping[str, Any]) -> tuple[str, ...]:
        """Its non-numeric per-example keys under these (its own) options."""
        return tuple(_declared(self.records, options))

    def system_score(self, values: Sequence[float]) -> float:
        return AGGREGATES[self.aggregate](values)


class Inputs(NamedTuple):
    """What a model metric reads of each example besides the prediction."""

    sources: bool
    references: bool


MAX_TOKENS = Option(
    "model_metric_max_tokens", None, "padded tokens per forward pass of every model metric's model (default: 4096 "
    "on CPU, 32768 on a GPU); a batch dealt to a rank holds about 4 passes' examples",
    kind=int, valid=lambda v: v >= 1, expected="an integer >= 1", aliases=("comet_max_tokens",))
"""The budget every model metric shares (--comet_max_tokens is its earlier name)."""


class ModelMetric(ABC):
    """One loaded model metric."""

    name: str
    """The metric's name (its spec's)."""
    row_tokens: int = 0
    """What one example costs a forward pass beyond its input tokens, in tokens: a metric that
    takes logits over a vocabulary of V for each example (or each of its tokens) counts about
    V / hidden size of them; batches are cut so that examples x (longest + row_tokens) stays
    within the budget. 0: the input tokens alone."""

    @property
    @abstractmethod
    def signature(self) -> str:
        """What identifies the scores (the model, its settings and the tool's version), as sacrebleu's signatures."""

    @abstractmethod
    def lengths(self, sources: Sequence[str], predictions: Sequence[str],
                references: Sequence[Sequence[str]]) -> list[int]:
        """Per example, the tokens its longest input costs: what batches are planned from.
        `references` holds a tuple per example, empty where the inputs have none (a metric that
        needs no reference); `sources` holds empty texts where it needs none and none were given."""

    @abstractmethod
    def score(self, sources: Sequence[str], predictions: Sequence[str],
              references: Sequence[Sequence[str]], max_tokens: int | None = None) -> list[Any]:
        """One batch: a Value per example; the model's forward passes over at most `max_tokens`
        padded tokens each."""

    def prepare(self, sources: Sequence[str], predictions: Sequence[str], references: Sequence[Sequence[str]]) -> None:
        """Called once with every example before any batch is scored, the same on every rank
        (a statistic of the whole corpus, such as BERTScore's idf weights, is taken here)."""

    def aggregate(self, values: Sequence[float]) -> float:
        """The system score of the main key: the mean, as comet-score prints it."""
        return AGGREGATES["mean"](values)


DEFAULT_MAX_TOKENS = {"cpu": 4096, "cuda": 32768}
"""Padded tokens per forward pass of the model (--model_metric_max_tokens)."""

FORWARDS_PER_BATCH = 4
"""A planned batch (what is dealt, stolen and journaled) holds the examples of about this many
forward passes per input kind: within it the metric sorts all texts by length and pads little,
while a run still has batches enough to share among ranks."""


def given_references(reads: bool, references: Sequence[Sequence[str | None]]) -> list[tuple[str, ...]]:
    """What a metric is given of each example's references: its texts (a stream's None past an
    example's last dropped) where it reads them, else none."""
    return [tuple(r for r in refs if r is not None) if reads else () for refs in references]


def with_references(signature: str, references: Sequence[Sequence[str]]) -> str:
    """The signature of a metric whose references are optional, with which examples had them:
    `refs:all`, `refs:none` or `refs:K/N` (K of N examples), before the tool's version."""
    had = sum(1 for r in references if r)
    part = "refs:all" if had == len(references) and had else "refs:none" if not had else f"refs:{had}/{len(references)}"
    parts = signature.split("|")
    at = next((i for i, p in enumerate(parts) if p.startswith("seq2seq_eval:")), len(parts))
    return "|".join([*parts[:at], part, *parts[at:]])


def default_budget(max_tokens: int | None, device_type: str) -> int:
    return max_tokens or DEFAULT_MAX_TOKENS.get(device_type, DEFAULT_MAX_TOKENS["cpu"])


def columns(keys: Sequence[str], values: Sequence[Any], records: Sequence[str] = ()) -> dict[str, list[Any]]:
    """Per-example Values -> {key: a float per example} for the numeric keys, then {record: each
    example's JSON value} for the records."""
    if len(keys) == 1 and not records:
        return {keys[0]: [float(v) for v in values]}
    names = (*keys, *records)
    out: dict[str, list[Any]] = {k: [] for k in names}
    for v in values:
        if not isinstance(v, (tuple, list)) or len(v) != len(names):
            raise ValueError(f"expected {len(names)} values per example ({', '.join(names)}), got {v!r}")
        for k, x in zip(keys, v):
            out[k].append(float(x))
        for k, x in zip(records, v[len(keys):]):
            out[k].append(x)
    return out


def model_batches(lengths: Sequence[int], max_tokens: int, row_tokens: int = 0) -> list[tuple[int, ...]]:
    """Example positions, longest first (ties by position), cut into batches whose examples x
    (longest + `row_tokens`) stay within FORWARDS_PER_BATCH * `max_tokens` (an example over that
    alone). Pure: the same cut on every rank and in `score`/`compare`, whatever the world size."""
    import numpy as np

    order = np.argsort(-np.asarray(lengths, dtype=np.int64), kind="stable").tolist()
    batches: list[tuple[int, ...]] = []
    current: list[int] = []
    for i in order:
        # Longest first, so the first member fixes the batch's padded length.
        if current and (len(current) + 1) * (lengths[current[0]] + row_tokens) > FORWARDS_PER_BATCH * max_tokens:
            batches.append(tuple(current))
            current = []
        current.append(i)
    if current:
        batches.append(tuple(current))
    return batches


def forward_passes(lengths: Sequence[int], max_tokens: int, row_tokens: int = 0) -> list[list[int]]:
    """Positions of texts (or examples) cut into one batch's forward passes: longest first (ties by
    position), each pass of at most `max_tokens` for rows x (its longest + `row_tokens`), a text
    over that alone. What a metric's `score` uses to stay within the budget it is given."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    passes: list[list[int]] = []
    for i in order:
        if passes and (len(passes[-1]) + 1) * (lengths[passes[-1][0]] + row_tokens) <= max_tokens:
            passes[-1].append(i)
        else:
            passes.append([i])
    return passes


@dataclass(frozen=True)
class Ranks:
    """`score` under torchrun: this process's place among the ranks and a way to gather one
    object from every rank (ProcessGroup.all_gather), so that they share a metric's batches."""

    rank: int
    world_size: int
    gather: Callable[[Any], list[Any]]
    device: str = "cpu"


def score_all(metric: ModelMetric, sources: Sequence[str], predictions: Sequence[str],
              references: Sequence[Sequence[str]], max_tokens: int | None = None, device_type: str = "cpu",
              ranks: Ranks | None = None) -> list[Any]:
    """Every example's Value, in the batches the ranks of a run would use. With `ranks`, each
    rank scores every world_size-th batch (longest first, so the shares cost about the same) and
    every rank gets all values; a batch's values do not depend on which rank scored it."""
    budget = default_budget(max_tokens, device_type)
    metric.prepare(sources, predictions, references)
    batches = model_batches(metric.lengths(sources, predictions, references), budget, metric.row_tokens)
    rank, world = (ranks.rank, ranks.world_size) if ranks is not None else (0, 1)
    mine = {}
    for i in range(rank, len(batches), world):
        members = batches[i]
        mine[i] = metric.score([sources[m] for m in members], [predictions[m] for m in members],
                               [references[m] for m in members], max_tokens=budget)
    scored = {k: v for part in ranks.gather(mine) for k, v in part.items()} if ranks is not None else mine
    values: list[Any] = [0.0] * len(sources)
    for i, members in enumerate(batches):
        for m, v in zip(members, scored[i]):
            values[m] = v
    return values
