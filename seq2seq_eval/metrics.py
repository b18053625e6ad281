"""Corpus metrics: BLEU (sacrebleu) for translation, ROUGE (rouge-score) for summarization.

Every function here is pure: lists of strings in, small named results out. No model,
no files, no process group.

The pipeline scores on N ranks and combines on rank 0, and the combined result must equal
scoring everything in one place, to the last digit. So each metric is split in two:

* a per-example step (``bleu_statistics``, ``rouge_example_scores``) that each rank runs on
  its own predictions; its output is plain JSON (ints, floats, str keys) so it can travel
  through rank files, and Python's ``json`` round-trips those floats exactly;
* a combine step (``bleu_from_statistics``, ``rouge_from_example_scores``) that rank 0 runs
  on the per-example outputs of all ranks, concatenated back in example order.

``example_statistics(task, ...)`` and ``combine(task, ...)`` wrap the two steps per task, and
``score(task, preds, refs) == combine(task, example_statistics(task, preds, refs))`` by
construction.

``--metrics`` picks any of ``METRIC_NAMES`` (bleu, chrf, chrf++, ter, rouge), each example with
one or several references. ``metric_statistics`` / ``combine_metrics`` are the same two steps for
such a list, keyed by metric name (the sacrebleu ones live in ``sacre_metrics``), and
``sentence_scores`` turns an example's statistics into its sentence-level scores.
"""

from __future__ import annotations

import functools
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Union

import numpy as np
import punkt.data.english as punkt_english
from nltk.tokenize.punkt import PunktParameters, PunktSentenceTokenizer
from rouge_score import rouge_scorer
from sacrebleu.metrics import BLEU

from .metric_names import METRIC_NAMES
from .sacre_metrics import SACREBLEU_METRICS, reference_count

__all__ = [
    "METRIC_NAMES",
    "ROUGE_KEYS",
    "SACREBLEU_METRICS",
    "SEED",
    "TASKS",
    "BleuResult",
    "RougeResult",
    "bleu_from_statistics",
    "bleu_statistics",
    "combine",
    "combine_metrics",
    "corpus_bleu",
    "corpus_rouge",
    "example_statistics",
    "lowest_scoring",
    "metric_statistics",
    "metric_dict",
    "ranking_key",
    "reference_tuples",
    "sacrebleu_num_refs",
    "prepare_for_rouge",
    "rouge_example_scores",
    "rouge_from_example_scores",
    "score",
    "score_metrics",
    "sentence_keys",
    "sentence_scores",
    "split_sentences",
]

SEED = 12345
"""Seed of the bootstrap resampling: the same scores give the same interval, byte for byte."""

ROUGE_KEYS = ("rouge1", "rouge2", "rougeL", "rougeLsum")
TASKS = ("translation", "summarization")

# sacrebleu's per-segment statistics: [sys_len, ref_len, correct_1..4, total_1..4].
_BLEU_MAX_NGRAM_ORDER = 4
_BLEU_STATS_LEN = 2 + 2 * _BLEU_MAX_NGRAM_ORDER


@dataclass(frozen=True)
class BleuResult:
    """Corpus BLEU, as sacrebleu's default ``BLEU()`` computes it."""

    bleu: float
    """sacrebleu's ``.score``, unrounded (0-100)."""
    signature: str
    """sacrebleu's signature, e.g. ``nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0``."""
    precisions: tuple[float, ...]
    """n-gram precisions (0-100), n = 1..4."""
    bp: float
    """Brevity penalty."""
    sys_len: int
    """Total hypothesis length in 13a tokens."""
    ref_len: int
    """Total reference length in 13a tokens."""


@dataclass(frozen=True)
class RougeResult:
    """Mean ROUGE F-measure over examples, with a seeded bootstrap 95% interval.

    The score is the plain mean. (Hugging Face's legacy ``calculate_rouge`` reports
    rouge-score's BootstrapAggregator "mid", the median of unseeded bootstrap means, which
    differs from the mean in the last digits and from run to run.)
    """

    scores: dict[str, float]
    """Per key of ``ROUGE_KEYS``: mean F-measure x 100 (unrounded)."""
    ci_low: dict[str, float]
    """Per key: 2.5th percentile of the bootstrap means."""
    ci_high: dict[str, float]
    """Per key: 97.5th percentile of the bootstrap means."""
    num_examples: int


MetricResult = Union[BleuResult, RougeResult]


# ---------------------------------------------------------------------------
# Input checks
# ---------------------------------------------------------------------------


def _check_strings(name: str, values: Any) -> None:
    # A bare str is a Sequence[str] too; scoring its characters is never what was meant.
    if isinstance(values, str) or not isinstance(values, Sequence):
        raise TypeError(f"{name} must be a sequence of strings, got {type(values).__name__}")
    for i, value in enumerate(values):
        if not isinstance(value, str):
            raise TypeError(f"{name}[{i}] must be a str, got {type(value).__name__}: {value!r}")


def _check_pairs(preds: Sequence[str], refs: Sequence[str]) -> None:
    _check_strings("preds", preds)
    _check_strings("refs", refs)
    if len(preds) != len(refs):
        raise ValueError(
            f"preds and refs must have the same length, got {len(preds)} predictions "
            f"and {len(refs)} references"
        )


def _check_references(preds: Sequence[str], refs: Any) -> list[tuple[str, ...]]:
    """Per example a tuple of one or more reference strings, from a str or a sequence of str."""
    _check_strings("preds", preds)
    if isinstance(refs, str) or not isinstance(refs, Sequence):
        raise TypeError(f"refs must be a sequence with one entry per prediction, got {type(refs).__name__}")
    out = []
    for i, entry in enumerate(refs):
        if isinstance(entry, str):
            out.append((entry,))
            continue
        if (
            isinstance(entry, (bytes, Mapping))
            or not isinstance(entry, Sequence)
            or not entry
            or not all(isinstance(r, str) for r in entry)
        ):
            raise TypeError(
                f"refs[{i}] must be a str or a non-empty sequence of str, got {type(entry).__name__}: {entry!r}"
            )
        out.append(tuple(entry))
    if len(preds) != len(out):
        raise ValueError(
            f"preds and refs must have the same length, got {len(preds)} predictions "
            f"and {len(out)} references"
        )
    return out


def _check_task(task: str) -> None:
    if task not in TASKS:
        raise ValueError(f"task must be one of {', '.join(TASKS)}, got {task!r}")


# ---------------------------------------------------------------------------
# BLEU
# ---------------------------------------------------------------------------


def bleu_statistics(preds: Sequence[str], refs: Sequence[str]) -> list[list[int]]:
    """Per-example BLEU sufficient statistics (one reference per prediction).

    Each row is sacrebleu's ``[sys_len, ref_len, correct_1..4, total_1..4]`` under the
    default settings (13a tokenizer, mixed case). They are integers, so summing rows from
    any number of ranks, in any grouping, gives exactly the single-process totals.
    An empty input gives an empty list: a rank may legitimately own no examples.
    """
    _check_pairs(preds, refs)
    if not preds:
        return []
    # A fresh metric per call: _extract_corpus_statistics records num_refs on the object,
    # and building one costs microseconds.
    stats = BLEU()._extract_corpus_statistics(preds, [refs])
    return [[int(x) for x in row] for row in stats]


def _check_bleu_row(i: int, row: Any) -> list[int]:
    if (
        isinstance(row, (str, bytes))
        or not isinstance(row, Sequence)
        or len(row) != _BLEU_STATS_LEN
        or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in row)
    ):
        raise ValueError(
            f"BLEU statistics of example {i} must be {_BLEU_STATS_LEN} non-negative integers "
            f"[sys_len, ref_len, correct_1..4, total_1..4], got {row!r}"
        )
    return list(row)


def bleu_from_statistics(stats: Sequence[Sequence[int]]) -> BleuResult:
    """Corpus BLEU from per-example statistics (sum, then sacrebleu's formula)."""
    if isinstance(stats, (str, bytes)) or not isinstance(stats, Sequence):
        raise TypeError(f"stats must be a sequence of rows, got {type(stats).__name__}")
    if not stats:
        raise ValueError("cannot compute BLEU of 0 examples: stats is empty")
    totals = [0] * _BLEU_STATS_LEN
    for i, row in enumerate(stats):
        for j, x in enumerate(_check_bleu_row(i, row)):
            totals[j] += x
    metric = BLEU()
    # sacrebleu only learns the reference count while caching references, which this
    # path skips; every example here has exactly one reference.
    metric.num_refs = 1
    result = metric._compute_score_from_stats(totals)
    return BleuResult(
        bleu=float(result.score),
        signature=str(metric.get_signature()),
        precisions=tuple(float(p) for p in result.precisions),
        bp=float(result.bp),
        sys_len=int(result.sys_len),
        ref_len=int(result.ref_len),
    )


def corpus_bleu(preds: Sequence[str], refs: Sequence[str]) -> BleuResult:
    """Corpus BLEU; ``.bleu == sacrebleu.corpus_bleu(preds, [refs]).score`` exactly."""
    return bleu_from_statistics(bleu_statistics(preds, refs))


# ---------------------------------------------------------------------------
# Sentence splitting and ROUGE
# ---------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _sentence_tokenizer() -> PunktSentenceTokenizer:
    """NLTK's English Punkt tokenizer, the one ``nltk.sent_tokenize(text, "english")`` uses.

    nltk loads ``punkt_tab/english`` (a download we cannot make offline) through
    ``nltk.tokenize.punkt.load_punkt_params``; the ``punkt`` package ships the same four
    tables as Python literals. We rebuild exactly the objects that loader builds (sets, a
    set of tuples, a ``defaultdict(int)``) and hand them to the same tokenizer class with
    its default language variables, as ``PunktTokenizer("english")`` does. The tokenizing
    algorithm stays nltk's own: the ``punkt`` package's tokenizer differs in edge cases.
    Built on first use and cached, because the ortho-context table has ~15k entries.
    """
    params = PunktParameters()
    params.abbrev_types = set(punkt_english.ABBREV_TYPES)
    params.collocations = set(punkt_english.COLLOCATIONS)
    params.sent_starters = set(punkt_english.SENT_STARTERS)
    params.ortho_context = defaultdict(int, punkt_english.ORTHO_CONTEXT)
    return PunktSentenceTokenizer(params)


def split_sentences(text: str) -> list[str]:
    """Split ``text`` into sentences exactly as ``nltk.sent_tokenize(text, "english")``."""
    return _sentence_tokenizer().tokenize(text)


def prepare_for_rouge(text: str) -> str:
    """One sentence per line, as rougeLsum expects.

    Follows Hugging Face's legacy seq2seq ``add_newline_to_end_of_each_sentence``, with one
    deliberate difference: that function calls ``re.sub("<n>", "", x)`` and discards the
    result, so Pegasus' ``<n>`` markers survive there (and rouge-score reads them as the
    token "n"). Here they are removed, as its comment intends.
    """
    return "\n".join(split_sentences(text.replace("<n>", "")))


@functools.lru_cache(maxsize=None)
def _rouge_scorer() -> rouge_scorer.RougeScorer:
    # Built once: the scorer is stateless, and building it per call would add up over
    # thousands of examples.
    return rouge_scorer.RougeScorer(list(ROUGE_KEYS), use_stemmer=True)


def rouge_example_scores(
    preds: Sequence[str], refs: Sequence[Union[str, Sequence[str]]]
) -> list[dict[str, float]]:
    """Per example: ``{key: F-measure x 100}`` for every key of ``ROUGE_KEYS``.

    Both sides go through ``prepare_for_rouge`` and are scored with rouge-score's
    ``RougeScorer(ROUGE_KEYS, use_stemmer=True)``: ``.score(target=ref, prediction=pred)`` for
    one reference, ``.score_multi(targets=refs, prediction=pred)`` for several (per key, the
    reference with the best F-measure). rouge-score's tokenizer keeps only ``[a-z0-9]`` runs,
    so text in other scripts scores 0.
    """
    ref_tuples = _check_references(preds, refs)
    scorer = _rouge_scorer()
    out = []
    for pred, example_refs in zip(preds, ref_tuples):
        prepared = prepare_for_rouge(pred)
        if len(example_refs) == 1:
            scores = scorer.score(prepare_for_rouge(example_refs[0]), prepared)
        else:
            scores = scorer.score_multi([prepare_for_rouge(r) for r in example_refs], prepared)
        # float(): rouge-score returns the int 0 for an LCS F-measure with no match, and
        # an int would come back from a JSON rank file as a different type.
        out.append({key: float(scores[key].fmeasure) * 100 for key in ROUGE_KEYS})
    return out


def _check_rouge_row(i: int, row: Any) -> list[float]:
    if not isinstance(row, Mapping):
        raise ValueError(
            f"ROUGE scores of example {i} must be a mapping with keys {', '.join(ROUGE_KEYS)}, "
            f"got {row!r}"
        )
    values = []
    for key in ROUGE_KEYS:
        value = row.get(key)
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not 0.0 <= value <= 100.0
        ):
            raise ValueError(
                f"ROUGE scores of example {i}: {key} must be a number in [0, 100], got {value!r}"
            )
        values.append(float(value))
    return values


def rouge_from_example_scores(
    scores: Sequence[Mapping[str, float]], seed: int = SEED, n_resamples: int = 1000
) -> RougeResult:
    """Mean per-example ROUGE and a seeded bootstrap 95% interval.

    The mean is ``math.fsum(values) / n``. fsum is correctly rounded, so the sum does not
    depend on the order or grouping of the examples: however they were split over ranks
    and whatever order the rank files are read back in, the mean is the same to the last
    bit (a plain left-to-right sum would be deterministic only for one fixed order).

    The interval resamples example indices with replacement (``numpy.random.default_rng
    (seed)``, ``n_resamples`` draws of n indices each), takes each resample's mean, and
    reports the 2.5th and 97.5th percentiles (numpy's default linear interpolation). Unlike
    the mean it depends on the order of ``scores``, which the caller keeps in example order.
    """
    if isinstance(scores, (str, bytes, Mapping)) or not isinstance(scores, Sequence):
        raise TypeError(f"scores must be a sequence of mappings, got {type(scores).__name__}")
    if not scores:
        raise ValueError("cannot compute ROUGE of 0 examples: scores is empty")
    if isinstance(n_resamples, bool) or not isinstance(n_resamples, int) or n_resamples < 1:
        raise ValueError(f"n_resamples must be an integer >= 1, got {n_resamples!r}")
    rows = [_check_rouge_row(i, row) for i, row in enumerate(scores)]
    return rouge_from_matrix(np.asarray(rows, dtype=np.float64), seed, n_resamples)


def rouge_from_matrix(matrix: np.ndarray, seed: int = SEED, n_resamples: int = 1000) -> RougeResult:
    """``rouge_from_example_scores`` on checked scores: one row per example, one column per
    key of ``ROUGE_KEYS``, in example order."""
    n = len(matrix)
    means = {key: math.fsum(matrix[:, k].tolist()) / n for k, key in enumerate(ROUGE_KEYS)}
    rng = np.random.default_rng(seed)
    resampled = np.empty((n_resamples, len(ROUGE_KEYS)), dtype=np.float64)
    # One resample at a time keeps memory at O(n) (drawing all at once would need
    # n_resamples * n indices) and fixes which random draws feed which resample. A resample's
    # mean is taken as (how often each example was drawn) @ scores / n: one bincount and one
    # matrix-vector product, about 5x faster than gathering the drawn rows (the interval is
    # most of rank 0's tail on a 100k-example run).
    for r in range(n_resamples):
        counts = np.bincount(rng.integers(0, n, size=n), minlength=n)
        resampled[r] = (counts @ matrix) / n
    low, high = np.percentile(resampled, [2.5, 97.5], axis=0)
    return RougeResult(
        scores=means,
        ci_low={key: float(low[k]) for k, key in enumerate(ROUGE_KEYS)},
        ci_high={key: float(high[k]) for k, key in enumerate(ROUGE_KEYS)},
        num_examples=n,
    )


def corpus_rouge(preds: Sequence[str], refs: Sequence[str]) -> RougeResult:
    """Mean ROUGE over the corpus with its bootstrap interval."""
    return rouge_from_example_scores(rouge_example_scores(preds, refs))


# ---------------------------------------------------------------------------
# Per-task entry points
# ---------------------------------------------------------------------------


def metric_dict(result: MetricResult) -> dict[str, Union[float, str]]:
    """Flat keys for the metrics JSON file.

    Translation: ``bleu``, ``bleu_signature``. Summarization: each ROUGE key, plus
    ``<key>_ci_low`` and ``<key>_ci_high``.
    """
    if isinstance(result, BleuResult):
        return {"bleu": result.bleu, "bleu_signature": result.signature}
    if isinstance(result, RougeResult):
        out: dict[str, Union[float, str]] = {}
        for key in ROUGE_KEYS:
            out[key] = result.scores[key]
        for key in ROUGE_KEYS:
            out[f"{key}_ci_low"] = result.ci_low[key]
            out[f"{key}_ci_high"] = result.ci_high[key]
        return out
    raise TypeError(f"result must be a BleuResult or RougeResult, got {type(result).__name__}")


def example_statistics(task: str, preds: Sequence[str], refs: Sequence[str]) -> list:
    """What a rank computes for its own examples, JSON-serialisable.

    translation: ``bleu_statistics`` rows; summarization: ``rouge_example_scores`` dicts.
    """
    _check_task(task)
    if task == "translation":
        return bleu_statistics(preds, refs)
    return rouge_example_scores(preds, refs)


def combine(task: str, per_example: Sequence) -> dict[str, Union[float, str]]:
    """The flat metric dict from per-example statistics of all ranks, in example order."""
    _check_task(task)
    if task == "translation":
        return metric_dict(bleu_from_statistics(per_example))
    return metric_dict(rouge_from_example_scores(per_example))


def score(task: str, preds: Sequence[str], refs: Sequence[str]) -> dict[str, Union[float, str]]:
    """Score a whole corpus in one place; equals ``combine`` over any split of it."""
    _check_task(task)
    _check_pairs(preds, refs)
    return combine(task, example_statistics(task, preds, refs))


# ---------------------------------------------------------------------------
# Several metrics at once (--metrics): the registry the pipeline and `score` use
# ---------------------------------------------------------------------------


def _check_names(names: Sequence[str]) -> tuple[str, ...]:
    if isinstance(names, str) or not isinstance(names, Sequence) or not names:
        raise TypeError(f"names must be a non-empty sequence of metric names, got {names!r}")
    unknown = [n for n in names if n not in METRIC_NAMES]
    if unknown:
        raise ValueError(f"unknown metric {unknown[0]!r}; valid names: {', '.join(METRIC_NAMES)}")
    if len(set(names)) != len(names):
        raise ValueError(f"metric names must be distinct, got {', '.join(names)}")
    return tuple(names)


def sentence_keys(name: str) -> tuple[str, ...]:
    """The per-example score keys a metric writes: its name, or the four ROUGE keys."""
    return ROUGE_KEYS if name == "rouge" else (name,)


def ranking_key(name: str) -> tuple[str, bool]:
    """(sentence score key, higher is better) that ranks examples for a metric.

    ROUGE ranks by rougeL; TER is an error rate, so its worst examples are the highest.
    """
    if name == "rouge":
        return "rougeL", True
    return name, SACREBLEU_METRICS[name].higher_is_better


def reference_tuples(refs: Sequence[Union[str, Sequence[str]]]) -> list[tuple[str, ...]]:
    """Per-example references as tuples; a str is one reference."""
    return [(r,) if isinstance(r, str) else tuple(r) for r in refs]


def sacrebleu_num_refs(refs: Sequence[Union[str, Sequence[str]]]) -> int:
    """What sacrebleu's signature reports for these per-example references (-1: variable)."""
    return reference_count(reference_tuples(refs))


def metric_statistics(
    names: Sequence[str], preds: Sequence[str], refs: Sequence[Union[str, Sequence[str]]]
) -> list[dict[str, Any]]:
    """What a rank computes for its own examples: per example ``{name: statistics}``.

    ``refs`` holds one entry per prediction: a reference string, or a sequence of several.
    sacrebleu metrics give their segment statistics rows (see ``sacre_metrics``); ``rouge``
    gives ``rouge_example_scores``' dict. All of it is plain JSON.
    """
    names = _check_names(names)
    ref_tuples = _check_references(preds, refs)
    columns = {
        name: rouge_example_scores(preds, ref_tuples) if name == "rouge"
        else SACREBLEU_METRICS[name].statistics(preds, ref_tuples)
        for name in names
    }
    return [{name: columns[name][i] for name in names} for i in range(len(preds))]


def _column(name: str, per_example: Sequence[Mapping[str, Any]]) -> list[Any]:
    if isinstance(per_example, (str, bytes, Mapping)) or not isinstance(per_example, Sequence):
        raise TypeError(f"per_example must be a sequence of mappings, got {type(per_example).__name__}")
    column = []
    for i, row in enumerate(per_example):
        if not isinstance(row, Mapping) or name not in row:
            raise ValueError(f"statistics of example {i} have no {name!r} entry, got {row!r}")
        column.append(row[name])
    return column


def sentence_scores(names: Sequence[str], per_example: Sequence[Mapping[str, Any]]) -> list[dict[str, float]]:
    """Each example's sentence-level scores from its statistics: ``{key: score}`` with the
    keys of ``sentence_keys``. sacrebleu metrics give ``sentence_score(pred, refs).score``
    (BLEU with effective order, as ``sacrebleu.sentence_bleu``); ROUGE its F-measures x 100.
    """
    names = _check_names(names)
    out: list[dict[str, float]] = [{} for _ in per_example]
    for name in names:
        column = _column(name, per_example)
        if name == "rouge":
            for i, row in enumerate(column):
                out[i].update(zip(ROUGE_KEYS, _check_rouge_row(i, row)))
        else:
            for i, value in enumerate(SACREBLEU_METRICS[name].sentence_scores(column)):
                out[i][name] = value
    return out


def combine_metrics(
    names: Sequence[str], per_example: Sequence[Mapping[str, Any]], num_refs: int = 1
) -> dict[str, Union[float, str]]:
    """The flat metric dict from every example's ``metric_statistics``, in example order.

    Keys: ``bleu``/``chrf``/``chrf++``/``ter`` with ``<name>_signature``, and for ``rouge``
    the keys of ``metric_dict``. ``num_refs`` goes into sacrebleu's signatures (``num_refs``
    of the references: -1 when it varies between examples).
    """
    names = _check_names(names)
    out: dict[str, Union[float, str]] = {}
    for name in names:
        column = _column(name, per_example)
        if name == "rouge":
            out.update(metric_dict(rouge_from_example_scores(column)))
        else:
            out.update(SACREBLEU_METRICS[name].combine(column, num_refs))
    return out


def score_metrics(
    names: Sequence[str], preds: Sequence[str], refs: Sequence[Union[str, Sequence[str]]]
) -> dict[str, Union[float, str]]:
    """Score a whole corpus in one place; equals ``combine_metrics`` over any split of it."""
    stats = metric_statistics(names, preds, refs)
    return combine_metrics(names, stats, sacrebleu_num_refs(refs))


def lowest_scoring(name: str, scores: Sequence[Mapping[str, float]], k: int = 5) -> list[int]:
    """Positions of the ``k`` worst examples by ``ranking_key(name)``, worst first; ties keep
    example order."""
    key, higher_is_better = ranking_key(name)
    sign = 1.0 if higher_is_better else -1.0
    return sorted(range(len(scores)), key=lambda i: sign * scores[i][key])[:k]


class MetricTotals:
    """``combine_metrics`` over examples that arrive in chunks, in example order, with the same
    arithmetic (sacrebleu's column sums left to right; ROUGE scores kept as float64 columns for
    the mean and the bootstrap), so rank 0 never holds every example's statistics as objects.
    It also keeps each example's ranking score, for the lowest-scoring examples."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = _check_names(names)
        self.n = 0
        self._totals = {n: [0] * SACREBLEU_METRICS[n].row_len for n in self.names if n != "rouge"}
        self._rouge: list[np.ndarray] = []
        self._key, self._higher_is_better = ranking_key(self.names[0])
        self._ranking: list[np.ndarray] = []

    def add(self, per_example: Sequence[Mapping[str, Any]], sentence: Sequence[Mapping[str, float]]) -> None:
        for name, totals in self._totals.items():
            metric = SACREBLEU_METRICS[name]
            for i, row in enumerate(_column(name, per_example)):
                for j, x in enumerate(metric.check_row(self.n + i, row)):
                    totals[j] += x
        if "rouge" in self.names:
            rows = [_check_rouge_row(self.n + i, row) for i, row in enumerate(_column("rouge", per_example))]
            self._rouge.append(np.asarray(rows, dtype=np.float64).reshape(len(rows), len(ROUGE_KEYS)))
        self._ranking.append(np.asarray([s[self._key] for s in sentence], dtype=np.float64))
        self.n += len(per_example)

    def result(self, num_refs: int = 1) -> dict[str, Union[float, str]]:
        if self.n == 0:
            raise ValueError("cannot compute metrics of 0 examples")
        out: dict[str, Union[float, str]] = {}
        for name in self.names:
            if name == "rouge":
                out.update(metric_dict(rouge_from_matrix(np.concatenate(self._rouge))))
            else:
                out.update(SACREBLEU_METRICS[name].score_from_totals(self._totals[name], num_refs))
        return out

    def lowest(self, k: int = 5) -> tuple[str, list[int], list[float]]:
        """(key, positions, scores) of the k worst examples, worst first; ties keep example order."""
        values = np.concatenate(self._ranking) if self._ranking else np.zeros(0)
        order = np.argsort(values if self._higher_is_better else -values, kind="stable")[:k]
        return self._key, order.tolist(), values[order].tolist()
