"""ROUGE (rouge-score) in two steps: per-example F-measures on each rank, their mean (and a seeded
bootstrap interval) on rank 0; sentence splitting for rougeLsum as the legacy script did it."""

from __future__ import annotations

import functools
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Union

import numpy as np

from .results import (
    ROUGE_KEYS,
    SEED,
    RougeResult,
    check_references,
)

if TYPE_CHECKING:
    from nltk.tokenize.punkt import PunktSentenceTokenizer
    from rouge_score.rouge_scorer import RougeScorer

# rouge-score and nltk are imported where they are used: they take about 0.3 s to import, which
# every rank of every translation run would otherwise pay for a metric it never computes.


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
    import punkt.data.english as punkt_english
    from nltk.tokenize.punkt import PunktParameters, PunktSentenceTokenizer

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
def _rouge_scorer() -> RougeScorer:
    # Built once: the scorer is stateless, and building it per call would add up over
    # thousands of examples.
    from rouge_score.rouge_scorer import RougeScorer

    return RougeScorer(list(ROUGE_KEYS), use_stemmer=True)


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
    ref_tuples = check_references(preds, refs)
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


def check_rouge_row(i: int, row: Any) -> list[float]:
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
    rows = [check_rouge_row(i, row) for i, row in enumerate(scores)]
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
