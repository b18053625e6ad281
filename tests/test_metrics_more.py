"""--metrics (bleu, chrf, chrf++, ter, rouge), several references and per-example scores.

Tables of tiny hand-checkable cases first; then parity with sacrebleu and rouge-score on real
text, and the official WMT17 figures from ../shared/realdata (skipped when that folder is not
beside the checkout); then the loaders, the config and the `score` command.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import sacrebleu
from rouge_score import rouge_scorer
from sacrebleu.metrics import BLEU, CHRF, TER

from realdata import REALDATA, WMT17, json_round_trip as _json_round_trip, read_lines as _read_lines, require as _require
from seq2seq_eval import cli
from seq2seq_eval.config import EvalConfig
from seq2seq_eval.errors import ConfigError, DataError
from seq2seq_eval.scoring.names import METRIC_NAMES, parse_metric_names
from seq2seq_eval.scoring.results import ROUGE_KEYS
from seq2seq_eval.scoring.rouge import prepare_for_rouge
from seq2seq_eval.scoring.totals import combine_metrics, lowest_scoring, metric_statistics, sacrebleu_num_refs, score_metrics, sentence_scores
from seq2seq_eval.scoring.sacre import reference_streams

VERSION = sacrebleu.__version__


# sacrebleu's metric for each name, with the settings we report.
SACRE = {"bleu": BLEU, "chrf": CHRF, "chrf++": lambda: CHRF(word_order=2), "ter": TER}
SENTENCE = {"bleu": lambda: BLEU(effective_order=True), "chrf": CHRF, "chrf++": lambda: CHRF(word_order=2), "ter": TER}


def _streams(refs) -> list[list]:
    """Per-example references -> sacrebleu's streams, written out independently of our helper."""
    tuples = [(r,) if isinstance(r, str) else tuple(r) for r in refs]
    width = max(len(t) for t in tuples)
    return [[t[k] if k < len(t) else None for t in tuples] for k in range(width)]


def _in_chunks(names, preds, refs, cuts) -> list[dict]:
    """Statistics as ranks owning preds[a:b] would send them: through JSON, back in example order."""
    chunks = [metric_statistics(names, preds[a:b], refs[a:b]) for a, b in zip(cuts, cuts[1:])]
    return [row for chunk in _json_round_trip(chunks) for row in chunk]


# ---------------------------------------------------------------------------
# Hand-checkable cases
# ---------------------------------------------------------------------------

# (metric, prediction, references, statistics row, sentence score)
HAND_CASES = [
    # TER = edits / reference length; tercom lowercases.
    ("ter", "a b c d", ("a b c d",), [0, 4.0], 0.0),
    ("ter", "a b c", ("a b c d",), [1, 4.0], 25.0),  # one deletion
    ("ter", "a b x d", ("a b c d",), [1, 4.0], 25.0),  # one substitution
    ("ter", "The Cat", ("the cat",), [0, 2.0], 0.0),
    ("ter", "", ("a b",), [2, 2.0], 100.0),
    # Several references: the fewest edits over the references, the mean reference length.
    ("ter", "a b", ("a b c d", "a b c d e f"), [2, 5.0], 40.0),
    ("ter", "a b c d", ("a b c d e f", "a b c d"), [0, 5.0], 0.0),
    # chrF: [hyp, ref, match] per character n-gram order 1..6, spaces dropped. "abc" vs "abd":
    # 1-grams 2 of 3, 2-grams 1 of 2, 3-grams 0 of 1; precision = recall, so F = the mean over
    # the 3 orders present = (2/3 + 1/2 + 0) / 3 = 7/18.
    ("chrf", "abc", ("abd",), [3, 3, 2, 2, 2, 1, 1, 1, 0] + [0] * 9, 100 * 7 / 18),
    ("chrf", "a b c", ("abc",), [3, 3, 3, 2, 2, 2, 1, 1, 1] + [0] * 9, 100.0),
    # chrF++ adds word 1- and 2-grams: "abc" vs "abd" is one word each, no match; 4 orders
    # present: (2/3 + 1/2 + 0 + 0) / 4 = 7/24.
    ("chrf++", "abc", ("abd",), [3, 3, 2, 2, 2, 1, 1, 1, 0] + [0] * 9 + [1, 1, 0, 0, 0, 0], 100 * 7 / 24),
    # chrF with several references keeps the statistics of the best one.
    ("chrf", "abc", ("xyz", "abc"), [3, 3, 3, 2, 2, 2, 1, 1, 1] + [0] * 9, 100.0),
    # BLEU: n-grams are clipped by the most generous reference; ref_len is the closest length.
    ("bleu", "the cat sat on the mat", ("the cat sat on a mat", "the cat sat on the mat"),
     [6, 6, 6, 5, 4, 3, 6, 5, 4, 3], 100.0),
    ("bleu", "the cat", ("a b c", "the cat sat on the mat"), [2, 3, 2, 1, 0, 0, 2, 1, 0, 0], None),
]


@pytest.mark.parametrize("name, pred, refs, row, sentence", HAND_CASES)
def test_hand_cases(name, pred, refs, row, sentence):
    (stats,) = metric_statistics([name], [pred], [refs])
    assert stats == {name: row}
    (scores,) = sentence_scores([name], [stats])
    expected = SENTENCE[name]().sentence_score(pred, list(refs)).score
    assert scores == {name: expected}
    if sentence is not None:
        assert expected == pytest.approx(sentence, abs=1e-9)
    # one example: the corpus score is sacrebleu's corpus_score of it
    metric = SACRE[name]()
    corpus = metric.corpus_score([pred], _streams([refs]))
    assert score_metrics([name], [pred], [refs]) == {
        name: corpus.score,
        f"{name}_signature": str(metric.get_signature()),
    }


def test_hand_table_as_one_corpus_with_variable_reference_counts():
    """The whole table per metric: 1 or 2 references per example, so sacrebleu says nrefs:var."""
    for name in SACRE:
        cases = [c for c in HAND_CASES if c[0] == name]
        preds = [c[1] for c in cases]
        refs = [c[2] for c in cases]
        metric = SACRE[name]()
        expected = metric.corpus_score(preds, _streams(refs))
        got = score_metrics([name], preds, refs)
        assert got == {name: expected.score, f"{name}_signature": str(metric.get_signature())}, name
        assert ("nrefs:var" in got[f"{name}_signature"]) == (len({len(r) for r in refs}) > 1), name


def test_signatures_are_sacrebleus():
    got = score_metrics(["bleu", "chrf", "chrf++", "ter"], ["a b c"], [("a b c", "a b d")])
    assert got["bleu_signature"] == f"nrefs:2|case:mixed|eff:no|tok:13a|smooth:exp|version:{VERSION}"
    assert got["chrf_signature"] == f"nrefs:2|case:mixed|eff:yes|nc:6|nw:0|space:no|version:{VERSION}"
    assert got["chrf++_signature"] == f"nrefs:2|case:mixed|eff:yes|nc:6|nw:2|space:no|version:{VERSION}"
    assert got["ter_signature"] == f"nrefs:2|case:lc|tok:tercom|norm:no|punct:yes|asian:no|version:{VERSION}"


def test_rouge_with_several_references_takes_the_best_per_key():
    # "testing one" against "testing one two" (F1 4/5) and "testing" (F1 2/3): the first wins.
    (stats,) = metric_statistics(["rouge"], ["testing one"], [("testing one two", "testing")])
    assert stats["rouge"]["rouge1"] == pytest.approx(80.0, abs=1e-12)
    assert stats["rouge"]["rouge2"] == pytest.approx(200 / 3, abs=1e-12)
    (scores,) = sentence_scores(["rouge"], [stats])
    assert scores == stats["rouge"]
    result = score_metrics(["rouge"], ["testing one"], [("testing one two", "testing")])
    assert result["rouge1"] == stats["rouge"]["rouge1"]


def test_reference_streams_pad_with_none():
    assert reference_streams([("a",), ("b", "c"), ("d",)]) == [["a", "b", "d"], [None, "c", None]]
    assert sacrebleu_num_refs(["a", ("b", "c")]) == -1
    assert sacrebleu_num_refs([("a", "x"), ("b", "c")]) == 2
    assert sacrebleu_num_refs(["a", "b"]) == 1


def test_every_split_combines_to_the_whole():
    names = list(METRIC_NAMES)
    preds = [c[1] for c in HAND_CASES]
    refs = [c[2] for c in HAND_CASES]
    whole = score_metrics(names, preds, refs)
    assert set(whole) == {"bleu", "bleu_signature", "chrf", "chrf_signature", "chrf++", "chrf++_signature", "ter",
                          "ter_signature", *ROUGE_KEYS, *(f"{k}_{e}" for k in ROUGE_KEYS for e in ("ci_low", "ci_high"))}
    n = len(preds)
    for cut in range(n + 1):  # empty chunks included: a rank may own no example
        for cut2 in (cut, (cut + n) // 2, n):
            merged = _in_chunks(names, preds, refs, [0, cut, cut2, n])
            assert combine_metrics(names, merged, sacrebleu_num_refs(refs)) == whole, (cut, cut2)


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda: metric_statistics(["bleu"], ["a"], ["a", "b"]), ValueError, "got 1 predictions and 2 references"),
        (lambda: metric_statistics(["bleu"], ["a"], [()]), TypeError, r"refs\[0\] must be a str or a non-empty sequence"),
        (lambda: metric_statistics(["bleu"], ["a"], [("a", None)]), TypeError, r"refs\[0\]"),
        (lambda: metric_statistics(["meteor"], ["a"], ["a"]), ValueError, "unknown metric 'meteor'; valid names: bleu, "),
        (lambda: metric_statistics(["bleu", "bleu"], ["a"], ["a"]), ValueError, "must be distinct"),
        (lambda: combine_metrics(["bleu"], []), ValueError, "cannot compute bleu of 0 examples"),
        (lambda: combine_metrics(["chrf"], [{"bleu": [0] * 10}]), ValueError, "example 0 have no 'chrf' entry"),
        (lambda: combine_metrics(["chrf"], [{"chrf": [0] * 17}]), ValueError, "chrf statistics of example 0 must be 18"),
        (lambda: combine_metrics(["ter"], [{"ter": [1.5, 2.0]}]), ValueError, "ter statistics of example 0"),
        (lambda: combine_metrics(["ter"], [{"ter": [1, -2.0]}]), ValueError, "ter statistics of example 0"),
        (lambda: combine_metrics(["bleu"], [{"bleu": [True] + [0] * 9}]), ValueError, "bleu statistics of example 0"),
    ],
)
def test_input_errors(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_lowest_scoring_orders_worst_first_and_ter_by_highest():
    scores = [{"bleu": 5.0, "ter": 10.0, "rougeL": 3.0}, {"bleu": 1.0, "ter": 90.0, "rougeL": 3.0},
              {"bleu": 5.0, "ter": 50.0, "rougeL": 1.0}]
    assert lowest_scoring("bleu", scores, k=2) == [1, 0]  # tie between 0 and 2 keeps example order
    assert lowest_scoring("ter", scores) == [1, 2, 0]
    assert lowest_scoring("rouge", scores, k=1) == [2]


# ---------------------------------------------------------------------------
# Reference implementations' own numbers
# ---------------------------------------------------------------------------


def _vectors() -> list[dict]:
    path = _require(REALDATA / "sacrebleu_vectors" / "sacrebleu_unit_vectors.json")
    return json.loads(path.read_text(encoding="utf-8"))["vectors"]


def test_sacrebleu_multi_reference_vectors():
    """sacrebleu's own corpus-BLEU vectors with two reference streams and default settings."""
    vectors = [v for v in _vectors() if v["metric"] == "corpus_bleu" and v["params"] in ({}, {"tokenize": "13a"})]
    assert len(vectors) == 3
    for vector in vectors:
        hyps, streams = vector["hypotheses"], vector["references"]
        assert len(streams) == 2
        refs = list(zip(*streams))  # per example
        got = score_metrics(["bleu"], hyps, refs)
        assert abs(got["bleu"] - vector["expected_score"]) <= vector["tolerance"]
        assert got["bleu"] == sacrebleu.corpus_bleu(hyps, streams).score
        assert got["bleu_signature"].startswith("nrefs:2|")


def test_sentence_bleu_vectors():
    """Our sentence BLEU is sacrebleu.sentence_bleu's default (exp smoothing, effective order):
    sacrebleu's own sentence vectors with those settings."""
    vectors = [v for v in _vectors() if v["metric"] == "sentence_bleu"
               and v["params"].get("smooth_method") == "exp" and v["params"].get("tokenize") == "13a"
               and not v["params"].get("lowercase")]
    assert len(vectors) == 2
    for vector in vectors:
        hyp, refs = vector["hypotheses"], vector["references"]
        (scores,) = sentence_scores(["bleu"], metric_statistics(["bleu"], [hyp], [tuple(refs)]))
        assert abs(scores["bleu"] - vector["expected_score"]) <= vector["tolerance"]
        assert scores["bleu"] == sacrebleu.sentence_bleu(hyp, refs).score


def _expected(table: str) -> dict[str, float]:
    data = json.loads(_require(WMT17 / "expected_scores.json").read_text(encoding="utf-8"))
    return data[table]["scores"]


@pytest.fixture(scope="module")
def wmt17_scored():
    """`score --metrics bleu,chrf,chrf++,ter` on the two systems with official chrF figures."""
    ref = _require(WMT17 / "newstest2017-ende-ref.de.txt")
    out = {}
    for system in _expected("chrF"):
        hyp = _require(WMT17 / f"{system}.txt")
        out[system] = cli.score_main(["--metrics", "bleu,chrf,chrf++,ter", "--predictions", str(hyp),
                                      "--references", str(ref)])
    assert set(out) == {"newstest2017.C-3MA.4959.en-de", "newstest2017.FBK.4870.en-de"}
    return out


def test_wmt17_official_bleu_chrf_ter(wmt17_scored):
    for system, got in wmt17_scored.items():
        assert round(got["bleu"], 2) == _expected("BLEU_mteval_v13a")[system]
        # official chrF++.py -nw 0, to its 4 decimals
        assert round(got["chrf"], 4) == _expected("chrF")[system]
        # tercom's Total TER is a fraction with 3 decimals; sacrebleu's is x 100
        assert round(got["ter"] / 100, 3) == _expected("TER")[system]
        assert got["ter_signature"] == f"nrefs:1|case:lc|tok:tercom|norm:no|punct:yes|asian:no|version:{VERSION}"


def test_wmt17_chrf_plus_plus_is_sacrebleus_default_not_the_official_smoothing(wmt17_scored):
    """chrF++ is CHRF(word_order=2) exactly. Its default (effective-order) smoothing is not the
    official chrF++.py's: that one is eps_smoothing=True (FBK: 52.2380 here, 52.233 official)."""
    ref = _read_lines(WMT17 / "newstest2017-ende-ref.de.txt")
    for system, got in wmt17_scored.items():
        hyps = _read_lines(WMT17 / f"{system}.txt")
        assert got["chrf++"] == CHRF(word_order=2).corpus_score(hyps, [ref]).score
        official = _expected("chrF++")[system]
        assert round(got["chrf++"], 4) != official
        assert round(CHRF(word_order=2, eps_smoothing=True).corpus_score(hyps, [ref]).score, 4) == official
        assert "|eff:yes|nc:6|nw:2|" in got["chrf++_signature"]
    assert round(wmt17_scored["newstest2017.FBK.4870.en-de"]["chrf++"], 4) == 52.2380


N_MULTI = 300  # segments: enough for every metric to be far from 0 and 100, fast enough for TER


@pytest.fixture(scope="module")
def wmt17_two_references():
    """FBK's output scored against the reference and, as a second reference, uedin-nmt's output."""
    hyps = _read_lines(WMT17 / "newstest2017.FBK.4870.en-de.txt")[:N_MULTI]
    ref1 = _read_lines(WMT17 / "newstest2017-ende-ref.de.txt")[:N_MULTI]
    ref2 = _read_lines(WMT17 / "newstest2017.uedin-nmt.4722.en-de.txt")[:N_MULTI]
    return hyps, ref1, ref2


def test_wmt17_multi_reference_equals_sacrebleu_at_any_split(wmt17_two_references):
    hyps, ref1, ref2 = wmt17_two_references
    refs = list(zip(ref1, ref2))
    names = ["bleu", "chrf", "chrf++", "ter"]
    whole = score_metrics(names, hyps, refs)
    for name in names:
        metric = SACRE[name]()
        expected = metric.corpus_score(hyps, [ref1, ref2])
        assert whole[name] == expected.score, name
        assert whole[f"{name}_signature"] == str(metric.get_signature()), name
        assert whole[f"{name}_signature"].startswith("nrefs:2|")
        single = SACRE[name]().corpus_score(hyps, [ref1]).score
        assert (whole[name] < single) if name == "ter" else (whole[name] > single), name  # a 2nd reference helps
    # three uneven ranks, statistics through JSON
    merged = _in_chunks(names, hyps, refs, [0, 41, 191, N_MULTI])
    assert combine_metrics(names, merged, 2) == whole
    scores = sentence_scores(names, merged)
    for i in range(0, N_MULTI, 23):
        for name in names:
            assert scores[i][name] == SENTENCE[name]().sentence_score(hyps[i], [ref1[i], ref2[i]]).score, (i, name)


def _xsum(limit: int) -> tuple[list[str], list[tuple[str, str]]]:
    import csv

    path = _require(REALDATA / "xsum_hallucination_annotations/hallucination_annotations_xsum_summaries.csv")
    summaries: dict[tuple[str, str], str] = {}
    with path.open(encoding="utf-8", newline="") as fh:
        for row in csv.DictReader(fh):
            summaries.setdefault((row["bbcid"], row["system"]), row["summary"].replace("\\'", "'"))
    ids = sorted({b for b, s in summaries if s == "Gold"} & {b for b, s in summaries if s == "TranS2S"}
                 & {b for b, s in summaries if s == "BERTS2S"}, key=int)[:limit]
    return [summaries[(i, "BERTS2S")] for i in ids], [(summaries[(i, "Gold")], summaries[(i, "TranS2S")]) for i in ids]


def test_multi_reference_rouge_is_the_mean_of_score_multi():
    """BERTS2S summaries against two references: the gold summary and TranS2S's."""
    preds, refs = _xsum(200)
    assert len(preds) == 200
    scorer = rouge_scorer.RougeScorer(list(ROUGE_KEYS), use_stemmer=True)
    per = [scorer.score_multi([prepare_for_rouge(r) for r in rs], prepare_for_rouge(p)) for p, rs in zip(preds, refs)]
    got = score_metrics(["rouge"], preds, refs)
    gold_only = score_metrics(["rouge"], preds, [r[0] for r in refs])
    for key in ROUGE_KEYS:
        assert got[key] == math.fsum(s[key].fmeasure * 100 for s in per) / len(per), key
        assert got[key] > gold_only[key], key
    merged = _in_chunks(["rouge"], preds, refs, [0, 17, 120, 200])
    assert combine_metrics(["rouge"], merged) == got


# ---------------------------------------------------------------------------
# Config and CLI parsing
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, task, names",
    [
        (None, "translation", ("bleu",)),
        (None, "summarization", ("rouge",)),
        ("chrf", "translation", ("chrf",)),
        ("BLEU, chrF++ ,ter", "summarization", ("bleu", "chrf++", "ter")),
        ("rouge,bleu", "translation", ("rouge", "bleu")),
    ],
)
def test_parse_metric_names(text, task, names):
    assert parse_metric_names(text, task) == names
    assert EvalConfig(metrics=text, task=task).metric_names == names


@pytest.mark.parametrize(
    "text, message",
    [
        ("bleu,meteor", "--metrics 'bleu,meteor': unknown metric 'meteor'; valid names: bleu, chrf, chrf++, ter, rouge"),
        ("bleu,", "--metrics 'bleu,': unknown metric an empty name; valid names: "),
        ("chrf,CHRF", "--metrics 'chrf,CHRF': chrf is given twice"),
    ],
)
def test_metric_name_errors(text, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        EvalConfig(metrics=text)
    with pytest.raises(ConfigError, match=re.escape(message)):
        cli.build_config(["--metrics", text])


def test_metric_file_keeps_the_task_name():
    cfg = EvalConfig(metrics="chrf,ter")
    assert cfg.metric_name == "bleu" and cfg.metric_names == ("chrf", "ter") and cfg.metrics == "chrf,ter"


def test_cli_metrics_target_columns_and_examples_switch():
    cfg = cli.build_config(["--metrics", "Ter,bleu", "--no_examples_file", "--dataset", "d.jsonl",
                            "--target_column", "a", "--target-column", "b.c"])
    assert (cfg.metrics, cfg.no_examples_file, cfg.target_column) == ("ter,bleu", True, ("a", "b.c"))
    one = cli.build_config(["--dataset", "d.jsonl", "--target_column", "a"])
    assert (one.target_column, one.no_examples_file, one.metrics) == ("a", False, None)
    with pytest.raises(ConfigError, match="--target_column: a column is given twice in a, a"):
        cli.build_config(["--dataset", "d.jsonl", "--target_column", "a", "--target_column", "a"])


# ---------------------------------------------------------------------------
# Loaders: several references
# ---------------------------------------------------------------------------


def _legacy(folder: Path, files: dict[str, list[str]]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, lines in files.items():
        (folder / name).write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return folder


def test_legacy_dir_with_several_references(tmp_path):
    from seq2seq_eval.inputs.files import load_legacy

    d = _legacy(tmp_path / "d", {"test.source": ["s1", "s2"], "test.target": ["a1", "a2"], "test.target.1": ["b1", "b2"],
                                 "test.target.2": ["c1", "c2"], "test.target.bak": ["x"], "val.target.5": ["x"]})
    examples = load_legacy(d, "test", need_targets=True)
    assert [(e.id, e.target) for e in examples.items] == [(0, ("a1", "b1", "c1")), (1, ("a2", "b2", "c2"))]
    assert examples.items[0].references == ("a1", "b1", "c1")
    # one reference: unchanged, a plain string (same data fingerprint as before)
    d1 = _legacy(tmp_path / "d1", {"test.source": ["s1"], "test.target": ["a1"]})
    (one,) = load_legacy(d1, "test", need_targets=True).items
    assert one.target == "a1" and one.references == ("a1",)


@pytest.mark.parametrize(
    "files, message",
    [
        ({"test.target.1": ["b1"]}, "{d}/test.target.1: 1 lines but test.source has 2; expected one reference per source line"),
        ({"test.target.1": ["b1", "b2"], "test.target.2": ["c1", "  "]},
         "{d}/test.target.2 line 2: blank reference (empty or whitespace only); expected a text with a "
         "non-whitespace character"),
        ({"test.target.2": ["c1", "c2"]}, "{d}/test.target.2: found, but test.target.1 is missing"),
    ],
)
def test_legacy_reference_errors(tmp_path, files, message):
    from seq2seq_eval.inputs.files import load_legacy

    d = _legacy(tmp_path / "d", {"test.source": ["s1", "s2"], "test.target": ["a1", "a2"], **files})
    with pytest.raises(DataError, match=re.escape(message.format(d=d))):
        load_legacy(d, "test", need_targets=True)


def test_jsonl_target_lists(tmp_path):
    from seq2seq_eval.inputs.files import load_jsonl

    path = tmp_path / "d.jsonl"
    path.write_text('{"source": "s", "target": ["a", "b"]}\n{"source": "t", "target": ["c"]}\n'
                    '{"source": "u", "target": "d"}\n', encoding="utf-8")
    assert [e.target for e in load_jsonl(path, need_targets=True).items] == [("a", "b"), "c", "d"]
    for bad, message in (('[]', "field 'target': an empty list; expected one or more references"),
                         ('["a", ""]', "field 'target' item 1: blank reference (empty); expected a text with a non-whitespace "
                                        "character"),
                         ('["a", 3]', "field 'target' item 1: expected a non-empty string, got 3")):
        path.write_text('{"source": "s", "target": "a"}\n{"source": "s", "target": %s}\n' % bad, encoding="utf-8")
        with pytest.raises(DataError, match=re.escape(f"{path} line 2 {message}")):
            load_jsonl(path, need_targets=True)


def _saved(folder: Path, columns: dict) -> Path:
    import datasets

    datasets.DatasetDict({"test": datasets.Dataset.from_dict(columns)}).save_to_disk(folder)
    return folder


def test_dataset_several_target_columns_and_list_columns(tmp_path):
    from seq2seq_eval.inputs.hub import load_hf_examples

    ds = _saved(tmp_path / "ds", {"source": ["s1", "s2"], "target": ["a1", "a2"], "alt": ["b1", "b2"],
                                  "refs": [["c1", "d1"], ["c2"]]})
    cases = [
        (("target", "alt"), [("a1", "b1"), ("a2", "b2")]),
        ("refs", [("c1", "d1"), "c2"]),
        (("alt", "refs"), [("b1", "c1", "d1"), ("b2", "c2")]),
        ("target", ["a1", "a2"]),
    ]
    for columns, expected in cases:
        examples = load_hf_examples(EvalConfig(dataset=str(ds), target_column=columns), need_targets=True)
        assert [e.target for e in examples.items] == expected, columns
    with pytest.raises(DataError, match=re.escape("no column 'nope' (--target_column)")):
        load_hf_examples(EvalConfig(dataset=str(ds), target_column=("target", "nope")), need_targets=True)
    bad = _saved(tmp_path / "bad", {"source": ["s1", "s2"], "refs": [["c1"], ["c2", ""]]})
    with pytest.raises(DataError, match=re.escape("split test row 1 column 'refs' item 1: blank reference (empty); expected a text "
                                                     "with a non-whitespace character")):
        load_hf_examples(EvalConfig(dataset=str(bad), target_column="refs"), need_targets=True)
    empty = _saved(tmp_path / "empty", {"source": ["s1"], "refs": [[]]})
    with pytest.raises(DataError, match=re.escape("row 0 column 'refs': an empty list; expected one or more references")):
        load_hf_examples(EvalConfig(dataset=str(empty), target_column="refs"), need_targets=True)


# ---------------------------------------------------------------------------
# The score command
# ---------------------------------------------------------------------------


def test_score_several_references_and_metrics(tmp_path):
    preds = ["the cat sat on the mat", "a dog ran", "hello there world"]
    r1 = ["the cat sat on a mat", "the dog ran", "hello world"]
    r2 = ["a cat sat on the mat", "a dog ran fast", "hello there"]
    files = _legacy(tmp_path, {"p.txt": preds, "r1.txt": r1, "r2.txt": r2})
    got = cli.score_main(["--metrics", "bleu,chrf,chrf++,ter,rouge", "--predictions", str(files / "p.txt"),
                          "--references", str(files / "r1.txt"), str(files / "r2.txt")])
    for name in SACRE:
        metric = SACRE[name]()
        assert got[name] == metric.corpus_score(preds, [r1, r2]).score
        assert got[f"{name}_signature"] == str(metric.get_signature())
    scorer = rouge_scorer.RougeScorer(list(ROUGE_KEYS), use_stemmer=True)
    per = [scorer.score_multi([a, b], p) for p, a, b in zip(preds, r1, r2)]  # one sentence each: no newlines
    assert got["rougeL"] == math.fsum(s["rougeL"].fmeasure * 100 for s in per) / 3
    # the task alone picks its metric, as before
    single = cli.score_main(["--task", "translation", "--predictions", str(files / "p.txt"),
                             "--references", str(files / "r1.txt")])
    assert single == {"bleu": sacrebleu.corpus_bleu(preds, [r1]).score,
                      "bleu_signature": f"nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:{VERSION}"}
