"""Metrics that run a model on the ranks (COMET; BERTScore would be the next): one interface, so
that the run, `score`, `compare` and the API treat them alike, and a new one is one module plus
its line in MODEL_METRICS.

A model metric is loaded once per rank on the rank's device, scores batches of examples
(source, prediction, references) into one value per example, and its system score is an
aggregate of those values. Batches are cut from all examples by `model_batches` (on the ranks,
then dealt to them), so values do not depend on the world size nor on where they are scored."""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError

MODEL_METRICS = {"comet": ("seq2seq_eval.scoring.comet", "comet_model")}
"""Name in --metrics -> (the module whose `load(name_or_path, device)` returns a ModelMetric and
whose `check(name_or_path)` finds the model without loading it, the EvalConfig field naming it)."""


class ModelMetric(ABC):
    """One loaded model metric."""

    name: str
    """The key of its per-example values and of its system score."""

    @property
    @abstractmethod
    def signature(self) -> str:
        """What identifies the scores (the model and the tool's version), as sacrebleu's signatures."""

    @abstractmethod
    def lengths(self, sources: Sequence[str], predictions: Sequence[str],
                references: Sequence[Sequence[str]]) -> list[int]:
        """Per example, the tokens its longest input costs: what batches are planned from."""

    @abstractmethod
    def score(self, sources: Sequence[str], predictions: Sequence[str],
              references: Sequence[Sequence[str]], max_tokens: int | None = None) -> list[float]:
        """One batch: a value per example (with several references, their mean); the model's
        forward passes over at most `max_tokens` padded tokens each."""

    def aggregate(self, values: Sequence[float]) -> float:
        """The system score: the mean, as comet-score prints it. math.fsum: the same value
        whatever order the examples were scored in."""
        import math

        return math.fsum(values) / len(values) if values else float("nan")


DEFAULT_MAX_TOKENS = {"cpu": 4096, "cuda": 32768}
"""Padded tokens per forward pass of the model (--comet_max_tokens)."""

FORWARDS_PER_BATCH = 4
"""A planned batch (what is dealt, stolen and journaled) holds the examples of about this many
forward passes per input kind: within it the metric sorts all texts by length and pads little,
while a run still has batches enough to share among ranks."""


def model_batches(lengths: Sequence[int], max_tokens: int) -> list[tuple[int, ...]]:
    """Example positions, longest first (ties by position), cut into batches of at most
    FORWARDS_PER_BATCH * `max_tokens` padded tokens (an example longer than that alone). Pure:
    the same cut on every rank and in `score`/`compare`, whatever the world size."""
    import numpy as np

    order = np.argsort(-np.asarray(lengths, dtype=np.int64), kind="stable").tolist()
    batches: list[tuple[int, ...]] = []
    current: list[int] = []
    for i in order:
        # Longest first, so the first member fixes the batch's padded length.
        if current and (len(current) + 1) * lengths[current[0]] > FORWARDS_PER_BATCH * max_tokens:
            batches.append(tuple(current))
            current = []
        current.append(i)
    if current:
        batches.append(tuple(current))
    return batches


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
              ranks: Ranks | None = None) -> list[float]:
    """Every example's value, in the batches the ranks of a run would use. With `ranks`, each
    rank scores every world_size-th batch (longest first, so the shares cost about the same) and
    every rank gets all values; a batch's values do not depend on which rank scored it."""
    budget = max_tokens or DEFAULT_MAX_TOKENS.get(device_type, DEFAULT_MAX_TOKENS["cpu"])
    batches = model_batches(metric.lengths(sources, predictions, references), budget)
    rank, world = (ranks.rank, ranks.world_size) if ranks is not None else (0, 1)
    mine = {}
    for i in range(rank, len(batches), world):
        members = batches[i]
        mine[i] = metric.score([sources[m] for m in members], [predictions[m] for m in members],
                               [references[m] for m in members], max_tokens=budget)
    scored = {k: v for part in ranks.gather(mine) for k, v in part.items()} if ranks is not None else mine
    values = [0.0] * len(sources)
    for i, members in enumerate(batches):
        for m, v in zip(members, scored[i]):
            values[m] = v
    return values


def corpus_scores(names: Sequence[str], model: str, sources: Sequence[str], predictions: Sequence[str],
                  references: Sequence[Sequence[str]], max_tokens: int | None = None,
                  ranks: Ranks | None = None) -> dict[str, Any]:
    """`score`'s model metrics (the first GPU, else the CPU; under torchrun, the rank's device
    and a share of the batches): each system score (the mean over examples of the mean over each
    example's `references`) and its signature."""
    import torch

    from ..errors import DataError

    if len(sources) != len(predictions):
        raise DataError(f"sources: {len(sources)} texts but {len(predictions)} predictions; expected one source per prediction")
    device = ranks.device if ranks is not None else "cuda" if torch.cuda.is_available() else "cpu"
    device_type = torch.device(device).type
    per_example = [tuple(r) for r in references]
    out: dict[str, Any] = {}
    for name in names:
        metric = load_model_metric(name, model, device)
        out[name] = metric.aggregate(score_all(metric, sources, predictions, per_example, max_tokens,
                                               device_type=device_type, ranks=ranks))
        out[f"{name}_signature"] = metric.signature
    return out


def is_model_metric(name: str) -> bool:
    return name in MODEL_METRICS


def load_model_metric(name: str, model: str, device: Any = "cpu") -> ModelMetric:
    return _module(name).load(model, device)


def check_model_metric(name: str, model: str) -> None:
    """Before any work: the model can be found and is of a supported kind (typed error if not)."""
    _module(name).check(model)


def model_option(name: str) -> str:
    """The EvalConfig field that names the metric's model (comet_model)."""
    return MODEL_METRICS[name][1]


def _module(name: str) -> Any:
    if name not in MODEL_METRICS:
        raise ConfigError(f"{name!r} is not a model metric; model metrics: {', '.join(MODEL_METRICS)}")
    return importlib.import_module(MODEL_METRICS[name][0])
