"""Tests for seq2seq_eval.scoring (BLEU, ROUGE, the task metric).

Tables of tiny hand-checkable cases first, then parity with the reference implementations
(sacrebleu, rouge-score, nltk) on real text from ../shared/realdata, which is skipped when
that folder is not beside the checkout.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest
import sacrebleu
from rouge_score import rouge_scorer
from sacrebleu.metrics import BLEU

from realdata import REALDATA, WMT17, json_round_trip as _json_round_trip, read_lines as _read_lines, require as _require
from seq2seq_eval.scoring import rouge as rouge_module
from seq2seq_eval.scoring.bleu import bleu_from_statistics, bleu_statistics, corpus_bleu
from seq2seq_eval.scoring.results import ROUGE_KEYS, SEED, BleuResult, RougeResult
from seq2seq_eval.scoring.rouge import corpus_rouge, prepare_for_rouge, rouge_example_scores, rouge_from_example_scores, split_sentences
from seq2seq_eval.scoring.task import combine, example_statistics, metric_dict, score

SIGNATURE = f"nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:{sacrebleu.__version__}"


def _statistics_in_three_chunks(task: str, preds: list[str], refs: list[str]) -> list:
    """Per-example statistics as three ranks of uneven size would produce them, read back
    from JSON and concatenated in example order."""
    n = len(preds)
    cuts = [0, n // 7, n // 7 + n // 2, n]  # about 14%, 50%, 36%
    chunks = [example_statistics(task, preds[a:b], refs[a:b]) for a, b in zip(cuts, cuts[1:])]
    assert len({len(chunk) for chunk in chunks}) == 3, [len(chunk) for chunk in chunks]
    return [row for chunk in _json_round_trip(chunks) for row in chunk]


# ---------------------------------------------------------------------------
# BLEU: hand-checkable cases
# ---------------------------------------------------------------------------

# (prediction, reference, sacrebleu statistics [sys_len, ref_len, correct_1..4, total_1..4], BLEU)
BLEU_CASES = [
    # Clipped n-gram matches 5/6, 3/5, 2/4, 1/3, lengths equal: BLEU = 100 * (1/12) ** (1/4).
    ("the cat sat on the mat", "the cat sat on a mat", [6, 6, 5, 3, 2, 1, 6, 5, 4, 3], 100 * (1 / 12) ** 0.25),
    ("the cat sat on the mat", "the cat sat on the mat", [6, 6, 6, 5, 4, 3, 6, 5, 4, 3], 100.0),
    # No 3- or 4-grams at all: sacrebleu takes log(0) as a huge negative, so BLEU is 0.
    ("the cat", "the cat sat on the mat", [2, 6, 2, 1, 0, 0, 2, 1, 0, 0], 0.0),
    # Empty prediction: nothing matches, brevity penalty 0.
    ("", "the cat", [0, 2, 0, 0, 0, 0, 0, 0, 0, 0], 0.0),
    # 13a splits the final period off; non-ASCII letters are ordinary characters.
    ("Größe ändert sich nicht.", "Größe ändert sich nicht.", [5, 5, 5, 4, 3, 2, 5, 4, 3, 2], 100.0),
    ("我 喜欢 北京 天安门", "我 喜欢 北京 天安门", [4, 4, 4, 3, 2, 1, 4, 3, 2, 1], 100.0),
    # 13a does not segment CJK text (that is tokenize="zh"): one token, so BLEU 0.
    ("我喜欢北京天安门。", "我喜欢北京天安门。", [1, 1, 1, 0, 0, 0, 1, 0, 0, 0], 0.0),
]


@pytest.mark.parametrize("pred, ref, stats, expected", BLEU_CASES)
def test_bleu_hand_cases(pred, ref, stats, expected):
    assert bleu_statistics([pred], [ref]) == [stats]
    result = corpus_bleu([pred], [ref])
    assert isinstance(result, BleuResult)
    assert result.bleu == pytest.approx(expected, abs=1e-9)
    assert result.bleu == sacrebleu.corpus_bleu([pred], [[ref]]).score
    assert result.signature == SIGNATURE


def test_bleu_table_as_one_corpus_matches_sacrebleu():
    preds = [p for p, _, _, _ in BLEU_CASES]
    refs = [r for _, r, _, _ in BLEU_CASES]
    expected = sacrebleu.corpus_bleu(preds, [refs])
    result = corpus_bleu(preds, refs)
    assert result.bleu == expected.score
    assert result.precisions == tuple(expected.precisions)
    assert (result.bp, result.sys_len, result.ref_len) == (expected.bp, expected.sys_len, expected.ref_len)
    # Statistics are integers: their sum is the corpus statistics, whatever the grouping.
    per_example = bleu_statistics(preds, refs)
    corpus_stats = [result.sys_len, result.ref_len, *expected.counts, *expected.totals]
    assert [sum(column) for column in zip(*per_example)] == corpus_stats


def test_bleu_signature_is_sacrebleus():
    metric = BLEU()
    metric.corpus_score(["a b c d"], [["a b c d"]])
    assert corpus_bleu(["a b c d"], ["a b c d"]).signature == str(metric.get_signature()) == SIGNATURE


def test_bleu_statistics_of_nothing_is_empty_but_bleu_of_nothing_is_an_error():
    # A rank can own no examples; the corpus as a whole cannot be empty.
    assert bleu_statistics([], []) == []
    with pytest.raises(ValueError, match="0 examples"):
        bleu_from_statistics([])
    with pytest.raises(ValueError, match="0 examples"):
        corpus_bleu([], [])


@pytest.mark.parametrize(
    "row, match",
    [
        ([1, 2, 3], "example 0 must be 10 non-negative integers"),
        ([1, 1, 1, 1, 1, 1, 1, 1, 1, 1.0], "example 0"),
        ([1, 1, 1, 1, 1, 1, 1, 1, 1, -1], "example 0"),
        ([1, 1, 1, 1, 1, 1, 1, 1, 1, True], "example 0"),
        ("0123456789", "example 0"),
    ],
)
def test_bleu_from_statistics_rejects_malformed_rows(row, match):
    with pytest.raises(ValueError, match=match):
        bleu_from_statistics([row])


# ---------------------------------------------------------------------------
# ROUGE: hand-checkable cases
# ---------------------------------------------------------------------------

# (prediction, reference, {key: F x 100}); rouge-score with use_stemmer=True, sentences on
# their own lines.
ROUGE_CASES = [
    # rouge-score's own example: P = 1, R = 1/3, F = 1/2; no bigram in the prediction.
    ("testing", "testing one two", {"rouge1": 50.0, "rouge2": 0.0, "rougeL": 50.0, "rougeLsum": 50.0}),
    # P = 1, R = 2/3, F = 4/5; bigrams P = 1, R = 1/2, F = 2/3.
    ("testing one", "testing one two", {"rouge1": 80.0, "rouge2": 200 / 3, "rougeL": 80.0, "rougeLsum": 80.0}),
    ("", "testing one two", {"rouge1": 0.0, "rouge2": 0.0, "rougeL": 0.0, "rougeLsum": 0.0}),
    ("The cat sat.", "The cat sat.", {"rouge1": 100.0, "rouge2": 100.0, "rougeL": 100.0, "rougeLsum": 100.0}),
    # Sentence order: the whole-text LCS is "alpha beta gamma" (3/5), but per sentence the
    # union LCS covers all 5 reference tokens. Bigrams: 3 of 4 on each side.
    (
        "Delta epsilon. Alpha beta gamma.",
        "Alpha beta gamma delta epsilon.",
        {"rouge1": 100.0, "rouge2": 75.0, "rougeL": 60.0, "rougeLsum": 100.0},
    ),
    # Porter stemming: cats -> cat, running -> run; "are" and "is" stay apart: 3 of 4.
    # Bigrams "the cat", "cat are", "are run" against "the cat", "cat is", "is run": 1 of 3.
    ("the cats are running", "the cat is run", {"rouge1": 75.0, "rouge2": 100 / 3, "rougeL": 75.0, "rougeLsum": 75.0}),
    # rouge-score keeps [a-z0-9] runs after lowercasing: "café" is the token "caf" on both sides ...
    ("café au lait", "café au lait", {"rouge1": 100.0, "rouge2": 100.0, "rougeL": 100.0, "rougeLsum": 100.0}),
    # ... and text in another script has no tokens at all, so even a perfect match scores 0.
    ("猫が座った。", "猫が座った。", {"rouge1": 0.0, "rouge2": 0.0, "rougeL": 0.0, "rougeLsum": 0.0}),
]


@pytest.mark.parametrize("pred, ref, expected", ROUGE_CASES)
def test_rouge_hand_cases(pred, ref, expected):
    (got,) = rouge_example_scores([pred], [ref])
    assert list(got) == list(ROUGE_KEYS)
    for key in ROUGE_KEYS:
        assert got[key] == pytest.approx(expected[key], abs=1e-12), key
        assert type(got[key]) is float, key


def test_rouge_table_as_one_corpus():
    preds = [p for p, _, _ in ROUGE_CASES]
    refs = [r for _, r, _ in ROUGE_CASES]
    result = corpus_rouge(preds, refs)
    assert isinstance(result, RougeResult)
    assert result.num_examples == len(ROUGE_CASES)
    for key in ROUGE_KEYS:
        expected = math.fsum(case[key] for _, _, case in ROUGE_CASES) / len(ROUGE_CASES)
        assert result.scores[key] == pytest.approx(expected, abs=1e-12)
        assert result.ci_low[key] <= result.scores[key] <= result.ci_high[key]


def test_pegasus_newline_markers_are_removed():
    assert prepare_for_rouge("First one.<n>Second one.") == "First one.Second one."
    assert prepare_for_rouge("First one. <n>Second one.") == "First one.\nSecond one."
    with_markers = rouge_example_scores(["A cat sat. <n>A dog ran."], ["A cat sat. A dog ran."])
    assert with_markers == [{key: 100.0 for key in ROUGE_KEYS}]


def test_rouge_unit_vectors():
    """rouge-score's own test vectors (expected values from ROUGE-1.5.5 runs).

    Our scorer always stems, so a vector computed without stemming is used only where
    stemming does not change rouge-score's own result for it.
    """
    path = _require(REALDATA / "rouge_score_vectors" / "rouge_score_unit_vectors.json")
    checked = 0
    for i, vector in enumerate(json.loads(path.read_text(encoding="utf-8"))["vectors"]):
        target, prediction, keys = vector["target"], vector["prediction"], vector["rouge_types"]
        if not vector["use_stemmer"]:
            stemmed = rouge_scorer.RougeScorer(keys, use_stemmer=True).score(target, prediction)
            plain = rouge_scorer.RougeScorer(keys, use_stemmer=False).score(target, prediction)
            if stemmed != plain:
                continue
        (got,) = rouge_example_scores([prediction], [target])
        for key in keys:
            expected = vector["expected"][key]["fmeasure"]
            # places as in unittest's assertAlmostEqual, on rouge-score's 0-1 scale
            assert round(got[key] / 100 - expected, vector["places"]) == 0, (i, vector["source_test"], key)
        checked += 1
    assert checked == 14, checked


# ---------------------------------------------------------------------------
# Bootstrap aggregation
# ---------------------------------------------------------------------------


def _synthetic_scores(n: int, seed: int = 0) -> list[dict[str, float]]:
    rng = np.random.default_rng(seed)
    table = rng.uniform(0, 100, size=(n, len(ROUGE_KEYS)))
    return [{key: float(x) for key, x in zip(ROUGE_KEYS, row)} for row in table]


def test_bootstrap_is_deterministic_and_brackets_the_mean():
    scores = _synthetic_scores(257)
    first = rouge_from_example_scores(scores)
    again = rouge_from_example_scores(_json_round_trip(scores))
    assert first == again
    assert json.dumps(metric_dict(first)) == json.dumps(metric_dict(again))
    for key in ROUGE_KEYS:
        assert first.ci_low[key] < first.scores[key] < first.ci_high[key]
    other_seed = rouge_from_example_scores(scores, seed=SEED + 1)
    assert other_seed.scores == first.scores
    assert other_seed.ci_low != first.ci_low


def test_mean_does_not_depend_on_example_order():
    scores = _synthetic_scores(300, seed=1)
    shuffled = [scores[i] for i in np.random.default_rng(2).permutation(len(scores))]
    # math.fsum is exactly rounded, so the mean is identical to the last bit.
    assert rouge_from_example_scores(shuffled).scores == rouge_from_example_scores(scores).scores


@pytest.mark.parametrize(
    "values, mean, low, high",
    [
        # One example: every resample is that example.
        ([42.5], 42.5, 42.5, 42.5),
        # Two examples 0 and 100: a resample is all-0 or all-100 with probability 1/4 each,
        # far above 2.5%, so the interval is the whole range.
        ([0.0, 100.0], 50.0, 0.0, 100.0),
        # Three examples: all-0 with probability 1/27 = 3.7% > 2.5%, likewise all-100.
        ([0.0, 50.0, 100.0], 50.0, 0.0, 100.0),
        ([7.0, 7.0, 7.0, 7.0], 7.0, 7.0, 7.0),
    ],
)
def test_bootstrap_hand_cases(values, mean, low, high):
    result = rouge_from_example_scores([{key: v for key in ROUGE_KEYS} for v in values])
    assert result.num_examples == len(values)
    for key in ROUGE_KEYS:
        assert (result.scores[key], result.ci_low[key], result.ci_high[key]) == (mean, low, high)


def test_rouge_aggregation_errors():
    with pytest.raises(ValueError, match="0 examples"):
        rouge_from_example_scores([])
    with pytest.raises(ValueError, match="0 examples"):
        corpus_rouge([], [])
    with pytest.raises(ValueError, match="n_resamples must be an integer >= 1, got 0"):
        rouge_from_example_scores([{key: 1.0 for key in ROUGE_KEYS}], n_resamples=0)
    with pytest.raises(ValueError, match="example 1: rouge2 must be a number in \\[0, 100\\], got None"):
        rouge_from_example_scores([{key: 1.0 for key in ROUGE_KEYS}, {"rouge1": 1.0}])
    with pytest.raises(ValueError, match="example 0: rougeL must be a number in \\[0, 100\\], got 101.0"):
        rouge_from_example_scores([{"rouge1": 1.0, "rouge2": 1.0, "rougeL": 101.0, "rougeLsum": 1.0}])
    with pytest.raises(ValueError, match="example 0 must be a mapping"):
        rouge_from_example_scores([[1.0, 2.0, 3.0, 4.0]])


# ---------------------------------------------------------------------------
# Sentence splitting
# ---------------------------------------------------------------------------

SPLIT_CASES = [
    ("", []),
    ("Hello world", ["Hello world"]),
    ("Dr. Smith went home. He was tired.", ["Dr. Smith went home.", "He was tired."]),
    ("Mr. Brown paid $3.50. Then he left.", ["Mr. Brown paid $3.50.", "Then he left."]),
    ("He left at 5 p.m. on Friday. She stayed.", ["He left at 5 p.m. on Friday.", "She stayed."]),
    ("Wait... what? No!", ["Wait... what?", "No!"]),
    ("Der Größe wegen. Ça va? 你好。", ["Der Größe wegen.", "Ça va?", "你好。"]),
    # From a CNN story: nltk makes the lone "..." a sentence of its own (the punkt package
    # keeps it with the sentence before; see test_split_sentences_matches_punkt_package).
    (
        '"We did not know before. ... Overall we can say more," he said.',
        ['"We did not know before.', "...", 'Overall we can say more," he said.'],
    ),
]


@pytest.mark.parametrize("text, expected", SPLIT_CASES)
def test_split_sentences_hand_cases(text, expected):
    assert split_sentences(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("", ""),
        ("One sentence", "One sentence"),
        ("First sentence. Second one! Third?", "First sentence.\nSecond one!\nThird?"),
    ],
)
def test_prepare_for_rouge_hand_cases(text, expected):
    assert prepare_for_rouge(text) == expected


def _write_punkt_tab(root: Path) -> None:
    """punkt.data.english written back as nltk's punkt_tab/english files."""
    import punkt.data.english as english

    lang_dir = root / "tokenizers" / "punkt_tab" / "english"
    lang_dir.mkdir(parents=True)

    def write(name: str, lines) -> None:
        (lang_dir / name).write_text("".join(f"{line}\n" for line in sorted(lines)), encoding="utf-8")

    write("abbrev_types.txt", english.ABBREV_TYPES)
    write("sent_starters.txt", english.SENT_STARTERS)
    write("collocations.tab", ("\t".join(pair) for pair in english.COLLOCATIONS))
    write("ortho_context.tab", (f"{typ}\t{flags}" for typ, flags in english.ORTHO_CONTEXT.items()))


@pytest.fixture(scope="module")
def nltk_sent_tokenize(tmp_path_factory):
    """The real ``nltk.sent_tokenize``, loading punkt_tab/english through nltk's own loader.

    We cannot download punkt_tab offline, so the files are written from the punkt
    package's copy of the same data into a temporary nltk data directory.
    """
    import nltk
    from nltk.tokenize import _get_punkt_tokenizer

    root = tmp_path_factory.mktemp("nltk_data")
    _write_punkt_tab(root)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(nltk.data, "path", [str(root)] + list(nltk.data.path))
        # nltk caches one tokenizer per language; drop it on the way in and out so no other
        # test sees a tokenizer loaded from this temporary directory.
        _get_punkt_tokenizer.cache_clear()
        yield nltk.sent_tokenize
        _get_punkt_tokenizer.cache_clear()


def test_split_sentences_uses_the_same_parameters_as_nltk(nltk_sent_tokenize):
    from nltk.tokenize import _get_punkt_tokenizer

    nltk_sent_tokenize("Warm up.")
    theirs = _get_punkt_tokenizer("english")._params
    ours = rouge_module._sentence_tokenizer()._params
    assert ours.abbrev_types == theirs.abbrev_types
    assert ours.collocations == theirs.collocations
    assert ours.sent_starters == theirs.sent_starters
    # A defaultdict(int) gains a 0 for every key looked up while tokenizing (earlier tests in the
    # same process do): entries of 0 are the same as absent ones.
    assert {k: v for k, v in ours.ortho_context.items() if v} == {k: v for k, v in theirs.ortho_context.items() if v}
    assert type(ours.ortho_context) is type(theirs.ortho_context)
    for text, _ in SPLIT_CASES:
        assert split_sentences(text) == nltk_sent_tokenize(text, "english")


def _cnn_stories() -> dict[str, str]:
    folder = _require(REALDATA / "allennlp_models_cnn_dm/test_fixtures/generation/bart/data/cnn_stories")
    return {path.name: path.read_text(encoding="utf-8") for path in sorted(folder.glob("*.story"))}


def _xsum_sample() -> list[dict[str, str]]:
    path = _require(REALDATA / "transformers/tests/fixtures/tests_samples/xsum/sample.json")
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _real_texts() -> dict[str, str]:
    texts = {f"cnn/{name}": text for name, text in _cnn_stories().items()}
    for i, record in enumerate(_xsum_sample()):
        texts[f"xsum/{i}/document"] = record["document"]
        texts[f"xsum/{i}/summary"] = record["summary"]
    return texts


def test_split_sentences_equals_nltk_on_real_text(nltk_sent_tokenize):
    texts = _real_texts()
    assert len(texts) == 40
    for name, text in texts.items():
        assert split_sentences(text) == nltk_sent_tokenize(text, "english"), name


# Where the punkt package's own tokenizer disagrees with nltk's algorithm on the real texts.
# nltk's annotation passes the token "..." after "before." as a sentence of its own; the
# punkt package attaches it to the preceding sentence. We follow nltk (that is what
# Hugging Face's rougeLsum preprocessing calls).
KNOWN_PUNKT_PACKAGE_DIFFERENCES = {"cnn/469c6ac05092ca5997728c9dfc19f9ab6b936e40.story"}


def test_split_sentences_matches_punkt_package():
    import punkt

    texts = _real_texts()
    differing = {name for name, text in texts.items() if split_sentences(text) != punkt.sent_tokenize(text)}
    assert differing == KNOWN_PUNKT_PACKAGE_DIFFERENCES


# ---------------------------------------------------------------------------
# Task API: score / example_statistics / combine / metric_dict
# ---------------------------------------------------------------------------


def test_metric_dict_keys():
    assert list(score("translation", ["a b c d"], ["a b c d"])) == ["bleu", "bleu_signature"]
    expected = list(ROUGE_KEYS) + [f"{key}_{end}" for key in ROUGE_KEYS for end in ("ci_low", "ci_high")]
    assert list(score("summarization", ["a b"], ["a b"])) == expected
    with pytest.raises(TypeError, match="BleuResult or RougeResult"):
        metric_dict({"bleu": 1.0})


@pytest.mark.parametrize("task", ["translation", "summarization"])
def test_input_errors(task):
    with pytest.raises(ValueError, match="got 1 predictions and 2 references"):
        score(task, ["a"], ["a", "b"])
    with pytest.raises(ValueError, match="got 1 predictions and 2 references"):
        example_statistics(task, ["a"], ["a", "b"])
    with pytest.raises(ValueError, match="0 examples"):
        score(task, [], [])
    with pytest.raises(ValueError, match="0 examples"):
        combine(task, [])
    with pytest.raises(TypeError, match="preds must be a sequence of strings, got str"):
        score(task, "a b", "a b")
    with pytest.raises(TypeError, match=r"refs\[1\] must be a str, got NoneType"):
        score(task, ["a", "b"], ["a", None])


def test_unknown_task():
    with pytest.raises(ValueError, match="task must be one of translation, summarization, got 'qa'"):
        score("qa", ["a"], ["a"])
    with pytest.raises(ValueError, match="task must be one of"):
        combine("qa", [])


@pytest.mark.parametrize(
    "task, preds, refs",
    [
        ("translation", [p for p, _, _, _ in BLEU_CASES], [r for _, r, _, _ in BLEU_CASES]),
        ("summarization", [p for p, _, _ in ROUGE_CASES], [r for _, r, _ in ROUGE_CASES]),
    ],
)
def test_combine_of_chunks_equals_score(task, preds, refs):
    whole = score(task, preds, refs)
    assert combine(task, example_statistics(task, preds, refs)) == whole
    for cut in range(len(preds) + 1):  # every two-way split, empty chunks included
        chunks = [
            example_statistics(task, preds[:cut], refs[:cut]),
            example_statistics(task, preds[cut:], refs[cut:]),
        ]
        merged = [row for chunk in _json_round_trip(chunks) for row in chunk]
        assert combine(task, merged) == whole, cut


# ---------------------------------------------------------------------------
# Real data: WMT17 en-de (16 systems), sacrebleu's unit vectors
# ---------------------------------------------------------------------------


def _wmt17_expected() -> dict[str, float]:
    data = json.loads(_require(WMT17 / "expected_scores.json").read_text(encoding="utf-8"))
    return data["BLEU_mteval_v13a"]["scores"]


@pytest.fixture(scope="module")
def wmt17_ref():
    return _read_lines(WMT17 / "newstest2017-ende-ref.de.txt")


@pytest.fixture(scope="module")
def wmt17_sacrebleu(wmt17_ref):
    """sacrebleu's default BLEU with the reference processed once for all 16 systems.

    Same computation as ``sacrebleu.corpus_bleu(hyps, [ref])`` (which
    test_wmt17_combine_in_uneven_chunks calls literally), at half the cost.
    """
    return BLEU(references=[wmt17_ref])


WMT17_SYSTEMS = (
    "newstest2017.C-3MA.4959.en-de", "newstest2017.FBK.4870.en-de", "newstest2017.KIT.4950.en-de",
    "newstest2017.LIUM-NMT.4900.en-de", "newstest2017.LMU-nmt-reranked.4934.en-de",
    "newstest2017.LMU-nmt-single.4893.en-de", "newstest2017.PROMT-Rule-based.4735.en-de",
    "newstest2017.RWTH-nmt-ensemble.4921.en-de", "newstest2017.SYSTRAN.4847.en-de",
    "newstest2017.TALP-UPC.4834.en-de", "newstest2017.online-A.0.en-de", "newstest2017.online-B.0.en-de",
    "newstest2017.online-F.0.en-de", "newstest2017.online-G.0.en-de", "newstest2017.uedin-nmt.4722.en-de",
    "newstest2017.xmu.4910.en-de",
)


def test_wmt17_expected_scores_cover_all_systems():
    assert set(_wmt17_expected()) == set(WMT17_SYSTEMS)


@pytest.mark.parametrize("system", WMT17_SYSTEMS)
def test_wmt17_bleu_matches_sacrebleu_and_mteval(system, wmt17_ref, wmt17_sacrebleu):
    expected = _wmt17_expected()[system]
    hyps = _read_lines(WMT17 / f"{system}.txt")
    assert len(hyps) == len(wmt17_ref) == 3004
    result = corpus_bleu(hyps, wmt17_ref)
    assert result.bleu == wmt17_sacrebleu.corpus_score(hyps, None).score
    # expected_scores.json holds mteval-v13a's figures to 2 decimals (sacrebleu's test.sh
    # checks them with tolerance 0.01); rounding ours to 2 places gives them exactly.
    assert round(result.bleu, 2) == expected


def test_wmt17_combine_in_uneven_chunks(wmt17_ref):
    hyps = _read_lines(WMT17 / "newstest2017.uedin-nmt.4722.en-de.txt")
    whole = score("translation", hyps, wmt17_ref)
    merged = _statistics_in_three_chunks("translation", hyps, wmt17_ref)
    assert combine("translation", merged) == whole
    assert whole == {"bleu": sacrebleu.corpus_bleu(hyps, [wmt17_ref]).score, "bleu_signature": SIGNATURE}


# BLEU() keyword arguments that leave sacrebleu's defaults unchanged.
_DEFAULT_BLEU_PARAMS = ({}, {"tokenize": "13a"}, {"max_ngram_order": 4})


def test_sacrebleu_unit_vectors():
    """sacrebleu's corpus-BLEU vectors that use the default settings.

    Sentence BLEU, chrF and non-default BLEU settings are not part of our API. The default
    vectors all have two reference streams, while our API takes one reference per
    prediction, so each is checked twice: sacrebleu's multi-reference statistics through
    our combine step must give the expected score, and each single stream through
    corpus_bleu must give what sacrebleu gives for it.
    """
    path = _require(REALDATA / "sacrebleu_vectors" / "sacrebleu_unit_vectors.json")
    vectors = [
        v
        for v in json.loads(path.read_text(encoding="utf-8"))["vectors"]
        if v["metric"] == "corpus_bleu" and v["params"] in _DEFAULT_BLEU_PARAMS
    ]
    assert len(vectors) == 4
    for i, vector in enumerate(vectors):
        hyps, streams = vector["hypotheses"], vector["references"]
        multi = BLEU()._extract_corpus_statistics(hyps, streams)
        got = bleu_from_statistics(multi).bleu
        assert abs(got - vector["expected_score"]) <= vector["tolerance"], (i, got, vector["expected_score"])
        for stream in streams:
            single = corpus_bleu(hyps, stream).bleu
            assert single == sacrebleu.corpus_bleu(hyps, [stream]).score, i
            if len(streams) == 1:
                assert abs(single - vector["expected_score"]) <= vector["tolerance"], i


# ---------------------------------------------------------------------------
# Real data: ROUGE parity with rouge-score
# ---------------------------------------------------------------------------


def _reference_rouge(preds: list[str], refs: list[str]) -> dict[str, float]:
    """rouge-score's own scorer, applied as the brief defines our metric."""
    scorer = rouge_scorer.RougeScorer(list(ROUGE_KEYS), use_stemmer=True)
    per = [scorer.score(prepare_for_rouge(r), prepare_for_rouge(p)) for p, r in zip(preds, refs)]
    return {key: math.fsum(s[key].fmeasure * 100 for s in per) / len(per) for key in ROUGE_KEYS}


def _assert_rouge_parity(preds: list[str], refs: list[str]) -> dict:
    got = score("summarization", preds, refs)
    expected = _reference_rouge(preds, refs)
    for key in ROUGE_KEYS:
        assert got[key] == expected[key], key
        assert got[f"{key}_ci_low"] <= got[key] <= got[f"{key}_ci_high"], key
    return got


def _xsum_pairs(system: str, limit: int) -> tuple[list[str], list[str]]:
    path = _require(REALDATA / "xsum_hallucination_annotations/hallucination_annotations_xsum_summaries.csv")
    summaries: dict[tuple[str, str], str] = {}
    with path.open(encoding="utf-8", newline="") as fh:
        for row in csv.DictReader(fh):
            # One summary per (document, system), repeated once per annotator row.
            # The file stores apostrophes backslash-escaped.
            summaries.setdefault((row["bbcid"], row["system"]), row["summary"].replace("\\'", "'"))
    gold_ids = {bbcid for bbcid, name in summaries if name == "Gold"}
    system_ids = {bbcid for bbcid, name in summaries if name == system}
    ids = sorted(gold_ids & system_ids, key=int)[:limit]
    return [summaries[(i, system)] for i in ids], [summaries[(i, "Gold")] for i in ids]


def test_xsum_rouge_matches_rouge_score():
    preds, refs = _xsum_pairs("BERTS2S", limit=300)
    assert len(preds) == 300
    preds = ["" if i % 37 == 5 else p for i, p in enumerate(preds)]  # some empty predictions
    assert preds.count("") == 8
    got = _assert_rouge_parity(preds, refs)

    merged = _statistics_in_three_chunks("summarization", preds, refs)
    assert combine("summarization", merged) == got
    # Sanity: plain numpy mean agrees to rounding error (ours is the exactly rounded one).
    for key in ROUGE_KEYS:
        assert got[key] == pytest.approx(np.mean([row[key] for row in merged]), rel=1e-12)
        assert 5.0 < got[key] < 60.0


def test_rouge_score_testdata_matches_rouge_score():
    folder = _require(REALDATA / "rouge_score_vectors" / "testdata")
    multi_pred = (folder / "pyrouge_files" / "prediction_multi.0.txt").read_text(encoding="utf-8")
    multi_target = (folder / "pyrouge_files" / "target_multi.0.txt").read_text(encoding="utf-8")
    # The two single-line pairs, the multi-line pair as one example each, and an empty prediction.
    preds = _read_lines(folder / "prediction.txt") + [multi_pred, ""]
    refs = _read_lines(folder / "target.txt") + [multi_target, "Some text."]
    assert len(preds) == len(refs) == 4
    _assert_rouge_parity(preds, refs)


def test_cnn_highlights_rouge_matches_rouge_score():
    """Multi-sentence summaries, where rougeLsum depends on the sentence splitter."""
    refs, preds = [], []
    for text in _cnn_stories().values():
        article, _, rest = text.partition("@highlight")
        refs.append(" ".join(h.strip() + "." for h in rest.split("@highlight") if h.strip()))
        preds.append(" ".join(p.strip() for p in article.split("\n\n")[:3]))  # a lead-3 baseline
    got = _assert_rouge_parity(preds, refs)
    assert got["rougeLsum"] != got["rougeL"]

