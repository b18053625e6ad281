"""Selection with a model metric (scoring/registry.py): MBR with COMET, MetricX or BERTScore as the
utility, and QE reranking with a reference-free model (CometKiwi, MetricX-QE).

Both are the project's own scorer (the metric's `score`) applied to one example at a time:

- `mbr`: every distinct candidate scored as the translation against every distinct candidate
  as its one reference, with the example's source, in ONE call of the metric's `score` per
  example (the D x D pairs of its D distinct texts), then spread over the N x N positions that
  hold those texts; a candidate's expected utility is the mean of its row under uniform weights
  (itself and duplicates included), as mbrs 0.1.8's `DecoderMBR` with the hypotheses as the
  references. One call per example is what makes COMET's MBR cheap: COMET's `score` encodes each
  distinct text of its batch once (the D candidates and the source: D + 1 encoder inputs, not
  3 x D^2) and runs only its small estimator on the D^2 pairs, as mbrs' MetricCOMET and COMET's
  own MBR command reuse their embeddings; BERTScore's `score` likewise encodes each distinct text
  once. MetricX reads each pair as one joined input, so it pays D^2 encoder inputs (as mbrs does).
- `qe`: every distinct candidate scored against the source alone, in one call per example.

Why per example and not across examples: a float32 forward pass's rows move in their last bits
with what else is in the pass (its width, its number of rows): measured on the tiny COMET
checkpoint, 8 candidate texts each embedded alone and beside one other text, 4 of those 16
embeddings differed bitwise from the same text's in one pass over 10 examples' 54 texts; the
test that hands examples over together and apart fails when examples share a call. One
example's texts in passes of their own make its scores depend on that example alone, so the
choices are the same bits whatever the ranks, their batches or the other examples handed over
(Selector's contract). On a CPU a pass of one example's 17 texts already gives a matrix
product rows enough (tokens x hidden).

The mean is float64 over an exactly rounded sum (math.fsum), as mbr.py's, so duplicates get
bit-identical expected utilities and the tie rule (the earlier candidate) decides between them.
MetricX is an error (0 best, 25 worst): its selections pick the LOWEST expected error or QE
score, the earlier candidate of equal ones; `select_scores` are the metric's values as it gives
them (not negated).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import ConfigError
from .candidates import CandidateSet
from .mbr import Selection, best
from .base import Selector


def _main_value(value: Any) -> float:
    """A metric's per-example Value -> its main key's float (the first of a tuple: BERTScore's F1,
    XCOMET's score before its error spans)."""
    return float(value[0] if isinstance(value, (tuple, list)) else value)


def choose(scores: Sequence[float], higher_is_better: bool) -> int:
    """The best index: highest (or, for an error scale, lowest), the earlier candidate of equal
    ones. Negation is exact, so the lowest is the highest of the negated scores, ties kept."""
    return best(scores if higher_is_better else [-s for s in scores])


class ModelSelector(Selector):
    """One (mode, model metric) selection. The model is loaded at the first `select` (or
    `signature`), through the process's `load`, so `check` runs before it and a model used by
    --metrics too is loaded once."""

    def __init__(self, mode: str, metric: str, resolved: Mapping[str, Any], load: Callable[[str], Any]) -> None:
        self.mode, self.metric = mode, metric
        self.resolved = dict(resolved)
        self._load = load
        self._loaded: Any = None

    # --- before any work ---------------------------------------------------------------------

    def check(self) -> None:
        from ..scoring import registry
        from ..scoring.model_metric import MAX_TOKENS

        self.resolved = dict(registry.resolve_options(
            {k: v for k, v in self.resolved.items() if k in registry.option_names()}))
        self.resolved.setdefault(MAX_TOKENS.name, None)
        problem = self.problem()
        if problem is not None:
            raise ConfigError(f"--select {self.mode} --select_metric {self.metric}: {problem}")
        registry.check(self.metric, self.resolved)  # the model can be found and is of a supported kind

    def problem(self) -> str | None:
        """What this mode cannot do with the model the options name, in words; None if it can."""
        from ..scoring import registry

        o = self.resolved
        if self.metric == "metricx":
            if self.mode == "mbr" and o["metricx_qe"]:
                return ("--metricx_qe makes MetricX reference-free, and mbr scores each candidate against the others "
                        "as references; expected --metricx_model a reference-based MetricX without --metricx_qe "
                        "(or --select qe)")
            if self.mode == "qe" and not o["metricx_qe"]:
                return ("qe scores each candidate against its source alone; expected --metricx_qe with a MetricX-QE "
                        "model (--metricx_model)")
            return None
        if self.metric == "bertscore" and o["bertscore_idf"]:
            # idf weights come from a corpus's references; an example's pseudo-references are its
            # own candidates, so the weights would be a choice the tool does not make for you.
            return "--bertscore_idf is not supported in selection; expected it left out (idf off, as mbrs' default)"
        if self.mode == "mbr" and not registry.reads_references(self.metric, o):
            return (f"{self._model()} is reference-free (it reads no reference), and mbr scores each candidate "
                    "against the others as references; expected a reference-based model (or --select qe)")
        if self.mode == "qe" and registry.inputs(self.metric, o).references:
            return (f"{self._model()} needs a reference, and qe scores each candidate against its source alone; "
                    "expected a reference-free model (a CometKiwi-style one, or --select mbr)")
        return None

    def _model(self) -> str:
        flag = f"{self.metric}_model"
        return f"--{flag} {self.resolved[flag]}" if flag in self.resolved else self.metric

    # --- the work -----------------------------------------------------------------------------

    @property
    def loaded(self) -> Any:
        if self._loaded is None:
            self._loaded = self._load(self.metric)
        return self._loaded

    def signature(self) -> str:
        from ..scoring import registry

        higher = registry.higher_is_better(self.metric)
        rule = "uniform|float64|" if self.mode == "mbr" else ""
        return f"{self.mode}:{self.metric}|{rule}{'max' if higher else 'min'}|{self.loaded.signature}"

    def _budget(self) -> int:
        import torch

        from ..scoring.model_metric import MAX_TOKENS, default_budget

        device = torch.device(getattr(self.loaded, "device", "cpu"))
        return default_budget(self.resolved.get(MAX_TOKENS.name), device.type)

    def select(self, sets: Sequence[CandidateSet]) -> list[Selection]:
        from ..scoring import registry

        higher = registry.higher_is_better(self.metric)
        out = []
        for s in sets:
            scores = self.expected_utilities(s) if self.mode == "mbr" else self.qe_scores(s)
            out.append(Selection(choose(scores, higher), scores))
        return out

    def _score(self, sources: list[str], predictions: list[str], references: list[tuple[str, ...]]) -> list[float]:
        metric = self.loaded
        metric.prepare(sources, predictions, references)
        return [_main_value(v) for v in metric.score(sources, predictions, references, max_tokens=self._budget())]

    def pair_matrix(self, s: CandidateSet) -> np.ndarray:
        """The N x N float64 matrix: row i, column j = candidate i scored against candidate j as its
        one reference (with the example's source); each distinct pair scored once, in one call."""
        distinct = list(dict.fromkeys(s.candidates))
        d = len(distinct)
        values = self._score([s.source] * (d * d), [h for h in distinct for _ in range(d)],
                             [(r,) for _ in range(d) for r in distinct])
        where = {text: k for k, text in enumerate(distinct)}
        at = np.array([where[c] for c in s.candidates], dtype=np.intp)
        return np.array(values, dtype=np.float64).reshape(d, d)[np.ix_(at, at)]

    def expected_utilities(self, s: CandidateSet) -> tuple[float, ...]:
        n = len(s.candidates)
        return tuple(math.fsum(row) / n for row in self.pair_matrix(s).tolist())

    def qe_scores(self, s: CandidateSet) -> tuple[float, ...]:
        distinct = list(dict.fromkeys(s.candidates))
        values = dict(zip(distinct, self._score([s.source] * len(distinct), distinct, [()] * len(distinct))))
        return tuple(values[c] for c in s.candidates)

