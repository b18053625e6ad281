"""What a model metric declares beyond its name and options: its direction, the inputs and keys
its options call for, per-example records that are not numbers, and what one example costs a
forward pass. A metric of this file's own (an error scale with a reference-free variant) goes
through score, compare, the summary's lowest-scoring examples and a run."""

from __future__ import annotations

import json
import math
import re

import pytest

import seq2seq_eval
from seq2seq_eval.errors import ConfigError
from seq2seq_eval.scoring import registry
from seq2seq_eval.scoring.model_metric import ModelMetric, ModelMetricSpec, Option, columns, forward_passes, model_batches


class Miss(ModelMetric):
    """An error scale: per example, the words of the prediction missing from its reference (with
    --miss_qe: from its source), and, with --miss_length, the prediction's word count; a record
    per example: the missing words with their places."""

    name = "miss"

    def __init__(self, options) -> None:
        self.qe, self.length = options["miss_qe"], options["miss_length"]

    @property
    def signature(self) -> str:
        return f"miss|qe:{self.qe}"

    def lengths(self, sources, predictions, references) -> list[int]:
        return [len(p.split()) + 1 for p in predictions]

    def score(self, sources, predictions, references, max_tokens=None) -> list[tuple]:
        out = []
        for s, p, refs in zip(sources, predictions, references):
            against = set((s if self.qe else refs[0]).split())
            missing = [{"word": w, "start": i} for i, w in enumerate(p.split()) if w not in against]
            out.append((float(len(missing)), *((float(len(p.split())),) if self.length else ()), missing))
        return out


MISS = ModelMetricSpec(
    name="miss", what="a test's own error scale", load=lambda options, device: Miss(options),
    check=lambda options: None,
    options=(Option("miss_qe", False, "against the source, no reference", kind=bool),
             Option("miss_length", False, "also the word count", kind=bool)),
    needs_sources=lambda o: o["miss_qe"], needs_references=lambda o: not o["miss_qe"],
    keys=lambda o: ("miss", "miss_words") if o["miss_length"] else ("miss",), records=("miss_spans",),
    higher_is_better=False, decimals=1, scale=10.0)


@pytest.fixture
def miss(monkeypatch):
    monkeypatch.setattr(registry, "_registered", registry.specs())
    registry.register(MISS)
    return MISS


PREDS = ["a b c", "a x y z", "a b"]
REFS = ["a b c", "a b", "a q"]
SRCS = ["x y z", "a x", "b"]


def test_inputs_and_keys_follow_the_options(miss):
    plain = dict(registry.resolve_options({}))
    qe = dict(registry.resolve_options({"miss_qe": True, "miss_length": True}))
    assert registry.inputs("miss", plain) == (False, True) and registry.inputs("miss", qe) == (True, False)
    assert registry.value_keys("miss", plain) == ("miss",) and registry.value_keys("miss", qe) == ("miss", "miss_words")
    assert registry.record_keys("miss", qe) == ("miss_spans",)
    assert registry.needing_sources(["bleu", "miss"], qe) == ("miss",) and registry.needing_sources(["miss"], plain) == ()
    assert registry.needing_references(["bleu", "miss"], qe) == ("bleu",)
    assert registry.needing_references(["miss", "comet"], plain) == ("miss", "comet")


def test_keys_that_depend_on_options_are_checked_when_read(monkeypatch):
    monkeypatch.setattr(registry, "_registered", registry.specs())
    bad = ModelMetricSpec(name="bad", what="", load=lambda o, d: None, check=lambda o: None,
                          keys=lambda o: ("bad",), records=lambda o: ("bad",))
    registry.register(bad)  # a function of the options: known only once they are
    with pytest.raises(ConfigError, match=r"register bad: keys \('bad',\) and records \('bad',\): expected distinct"):
        registry.value_keys("bad", dict(registry.resolve_options({})))
    with pytest.raises(ConfigError, match="records"):
        registry.register(ModelMetricSpec(name="worse", what="", load=lambda o, d: None, check=lambda o: None,
                                          records=("worse_signature",)))


def test_records_are_written_per_example_and_never_averaged(miss):
    got = seq2seq_eval.score(PREDS, REFS, metrics="miss", miss_length=True)
    assert got == {"miss": 4 / 3, "miss_words": 3.0, "miss_signature": "miss|qe:False"}
    values = Miss({"miss_qe": False, "miss_length": False}).score(SRCS, PREDS, [(r,) for r in REFS])
    cols = columns(("miss",), values, ("miss_spans",))
    assert cols == {"miss": [0.0, 3.0, 1.0], "miss_spans": [[], [{"word": "x", "start": 1}, {"word": "y", "start": 2},
                                                                {"word": "z", "start": 3}], [{"word": "b", "start": 1}]]}
    with pytest.raises(ValueError, match=r"expected 2 values per example \(miss, miss_spans\), got \(1.0,\)"):
        columns(("miss",), [(1.0,)], ("miss_spans",))


def test_a_reference_free_metric_scores_without_references_and_the_others_are_refused(miss, tmp_path, capsys):
    from seq2seq_eval.cli import main

    assert seq2seq_eval.score(PREDS, None, metrics="miss", sources=SRCS, miss_qe=True)["miss"] == 2.0
    for call, said in [
        (lambda: seq2seq_eval.score(PREDS, None, metrics="miss,bleu", sources=SRCS, miss_qe=True),
         "metrics miss,bleu: bleu needs references"),
        (lambda: seq2seq_eval.score(PREDS, None, metrics="miss"), "metrics miss: miss needs references"),
        (lambda: seq2seq_eval.score(PREDS, None, metrics="miss", miss_qe=True), "metrics miss: miss needs sources (sources=, one per prediction)"),
    ]:
        with pytest.raises(ConfigError) as e:
            call()
        assert str(e.value).startswith(said) and "\n" not in str(e.value)
    for name, lines in (("p", PREDS), ("s", SRCS)):
        (tmp_path / name).write_text("".join(x + "\n" for x in lines), encoding="utf-8")
    assert main(["score", "--metrics", "miss", "--miss_qe", "--sources", str(tmp_path / "s"), "--predictions",
                 str(tmp_path / "p")]) == 0
    assert json.loads(capsys.readouterr().out)["miss"] == 2.0
    assert main(["score", "--metrics", "miss,chrf", "--miss_qe", "--sources", str(tmp_path / "s"), "--predictions",
                 str(tmp_path / "p")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("seq2seq_eval: error: score --metrics miss,chrf: chrf needs references (pass --references, one "
                   "file per set, line-aligned with --predictions); only reference-free metrics run without them "
                   "(docs/metrics.md#model-metrics)")


def test_compare_follows_the_direction(miss):
    """The lower error is the better system: compare's `best`, `better` and the table say so."""
    from seq2seq_eval.comparison.table import format_table

    worse = ["x y c", "q r s t", "m n"]
    out = seq2seq_eval.compare({"base": worse, "new": PREDS}, REFS, metrics="miss,bleu", n_samples=30)
    assert out["results"]["new"]["miss"]["score"] < out["results"]["base"]["miss"]["score"]
    assert out["results"]["new"]["miss"]["better"] is True and out["results"]["base"]["miss"]["better"] is None
    assert out["best"] == {"miss": "new", "bleu": "new"}
    back = seq2seq_eval.compare({"new": PREDS, "base": worse}, REFS, metrics="miss", n_samples=30)
    assert back["results"]["base"]["miss"]["better"] is False and back["best"] == {"miss": "new"}
    assert format_table(out).splitlines()[-1] == "best: miss new (lower is better); bleu new"


def test_the_lowest_scoring_examples_follow_the_first_metric_and_its_direction(miss):
    from seq2seq_eval.outputs.summary import lowest_scoring_line
    from seq2seq_eval.scoring.totals import MetricTotals, metric_statistics, sentence_scores, worst

    assert worst([3.0, 1.0, 3.0, 0.0], higher_is_better=False, k=3) == ([0, 2, 1], [3.0, 3.0, 1.0])
    assert worst([3.0, 1.0, 3.0, 0.0], higher_is_better=True, k=2) == ([3, 1], [0.0, 1.0])

    class Store:
        def ids(self, positions):
            return [f"id{p}" for p in positions]

    totals = MetricTotals(["bleu"])
    stats = metric_statistics(["bleu"], PREDS, REFS)
    totals.add(stats, sentence_scores(["bleu"], stats))
    scored = {"miss": {"values": {"miss": [0.0, 3.0, 1.0]}, "higher_is_better": False}}
    assert lowest_scoring_line(Store(), totals, 2, "miss", scored).split() == ["lowest", "miss", "ids", "id1", "(3.0),",
                                                                              "id2", "(1.0)"]
    assert lowest_scoring_line(Store(), totals, 1, "bleu", scored).startswith("lowest bleu ids")
    assert lowest_scoring_line(Store(), None, 1, "bleu", None) is None
    from seq2seq_eval.config import EvalConfig

    # What the run's finish passes as `first`: the first name given, a model metric included.
    assert EvalConfig(metrics="comet,bleu").ranking_metric == "comet"
    assert EvalConfig(metrics="ter,comet").ranking_metric == "ter" and EvalConfig().ranking_metric == "bleu"


@pytest.mark.parametrize("lengths, budget, row, expected", [
    ([3, 3, 3, 3], 3, 0, [(0, 1, 2, 3)]),  # 4 forward passes' worth of 3 tokens
    ([3, 3, 3, 3], 3, 3, [(0, 1), (2, 3)]),  # each example costs 6: two per 4 x 3
    ([5, 1, 1], 2, 100, [(0,), (1,), (2,)]),  # over the budget alone
])
def test_batches_count_what_an_example_costs_beyond_its_tokens(lengths, budget, row, expected):
    assert model_batches(lengths, budget, row) == expected
    for batch in model_batches(lengths, budget, row):
        assert len(batch) == 1 or len(batch) * (lengths[batch[0]] + row) <= 4 * budget
    passes = forward_passes([2, 7, 2, 1], 10, 3)
    assert passes == [[1], [0, 2], [3]] and all(len(p) * ([2, 7, 2, 1][p[0]] + 3) <= 10 or len(p) == 1 for p in passes)


def test_a_run_without_references_writes_the_records(miss, tmp_path, capsys):
    """evaluate() with sources alone (--input_path without references) and a reference-free
    metric: each example's value and record are the metric's own, and no text metric is added."""
    from seq2seq_eval.config import EMBEDDED_MODEL

    sources = ["Hello world.", "The cat sat on the mat.", "Good day."]
    result = seq2seq_eval.evaluate(str(EMBEDDED_MODEL), sources=sources, metrics="miss", miss_qe=True,
                                   save_dir=str(tmp_path / "out"), return_examples=True)
    rows = result.examples
    direct = Miss({"miss_qe": True, "miss_length": False}).score(sources, [r["prediction"] for r in rows], [()] * 3)
    assert [(r["miss"], r["miss_spans"]) for r in rows] == [(v, s) for v, s in direct]
    assert all(r["references"] == [] for r in rows) and any(s for _, s in direct)
    assert result.metrics["miss"] == math.fsum(v for v, _ in direct) / 3
    assert "miss_spans" not in result.metrics and "bleu" not in result.metrics
    # compare reads the run folder's sources and finds no references there: the metric runs, one
    # that needs references is refused saying where none were found.
    from seq2seq_eval.cli import main

    other = tmp_path / "other.txt"
    other.write_text("".join(s + "\n" for s in sources), encoding="utf-8")
    argv = ["compare", "--predictions", str(tmp_path / "out"), str(other), "--n_samples", "10", "--metrics", "miss"]
    assert main([*argv, "--miss_qe", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["results"]["out"]["miss"]["score"] == result.metrics["miss"] and out["n_references"] == 0
    assert main(argv) == 2
    assert "miss needs references (pass --references; none found for the runs: " in capsys.readouterr().err


class Given(ModelMetric):
    """Per example, how many references it was given (what the framework passes it)."""

    name = "given"
    signature = "given|seq2seq_eval:x"

    def lengths(self, sources, predictions, references) -> list[int]:
        return [1] * len(predictions)

    def score(self, sources, predictions, references, max_tokens=None) -> list[float]:
        return [float(len(r)) for r in references]


LOADS: list[str] = []
GIVEN = ModelMetricSpec(
    name="given", what="references given", load=lambda options, device: LOADS.append("given") or Given(),
    check=lambda options: None,
    options=(Option("given_refs", "optional", "needed, optional (at most one) or never",
                    valid=lambda v: v in ("needed", "optional", "never")),),
    needs_references=lambda o: o["given_refs"] == "needed", reads_references=lambda o: o["given_refs"] != "never",
    max_references=lambda o: 1 if o["given_refs"] == "optional" else None)


@pytest.fixture
def given(monkeypatch, miss):
    registry.register(GIVEN)
    LOADS.clear()
    return GIVEN


def test_a_metric_is_given_what_it_reads_and_its_signature_says_which_examples_had_references(given):
    from seq2seq_eval.scoring.model_metric import with_references

    two = [[r, r + " z"] for r in REFS]
    assert seq2seq_eval.score(PREDS, REFS, metrics="given") == {"given": 1.0, "given_signature":
                                                                "given|refs:all|seq2seq_eval:x"}
    assert seq2seq_eval.score(PREDS, None, metrics="given")["given_signature"] == "given|refs:none|seq2seq_eval:x"
    # Never: given none, whatever the inputs hold; needed: all of them, and the signature is its own.
    assert seq2seq_eval.score(PREDS, two, metrics="given", given_refs="never") == {"given": 0.0, "given_signature":
                                                                                   "given|seq2seq_eval:x"}
    assert seq2seq_eval.score(PREDS, two, metrics="given", given_refs="needed")["given"] == 2.0
    assert with_references("m|seq2seq_eval:1", [("a",), (), ("b", "c")]) == "m|refs:2/3|seq2seq_eval:1"
    out = seq2seq_eval.compare({"a": PREDS, "b": PREDS[::-1]}, None, metrics="given", n_samples=10)
    assert out["signatures"]["given"].startswith("given|refs:none|seq2seq_eval:x|bs:10") and out["n_references"] == 0


def test_more_references_than_a_metric_reads_are_refused_before_any_model_loads(given, tmp_path, capsys):
    """The run (its dry run), score, compare and their Python forms: one line each, nothing loaded."""
    from seq2seq_eval.cli import main

    data = tmp_path / "data"
    data.mkdir()
    for name, lines in (("test.source", SRCS), ("test.target", REFS), ("test.target.1", PREDS), ("p", PREDS)):
        (data / name).write_text("".join(x + "\n" for x in lines), encoding="utf-8")
    said = "given reads at most 1 reference per example, and "
    for call in (lambda: seq2seq_eval.score(PREDS, [REFS, PREDS], metrics="given", reference_layout="streams"),
                 lambda: seq2seq_eval.compare({"a": PREDS, "b": REFS}, [REFS, PREDS], metrics="given,bleu")):
        with pytest.raises(ConfigError, match=re.escape(said + "references= gives 2 for an example; give at most 1")):
            call()
    refs = ["--references", str(data / "test.target"), str(data / "test.target.1")]
    for argv, where in (
            (["--data_dir", str(data), "--metrics", "given", "--dry_run", "--save_dir", str(tmp_path / "o")],
             "--metrics given: " + said + "the data has 2 for an example"),
            (["score", "--metrics", "given", "--predictions", str(data / "p"), *refs],
             "score --metrics given: " + said + "--references gives 2 per prediction"),
            (["compare", "--metrics", "given", "--task", "translation", "--predictions", str(data / "p"),
              str(data / "test.target"), *refs], "compare --metrics given: " + said + "--references gives 2")):
        assert main(argv) == 2
        assert capsys.readouterr().err.strip().startswith("seq2seq_eval: error: " + where)
    assert main(["score", "--metrics", "given", "--given_refs", "never", "--predictions", str(data / "p"), *refs]) == 0
    assert json.loads(capsys.readouterr().out)["given"] == 0.0
    assert LOADS == ["given"] and not (tmp_path / "o").exists()


def test_compare_without_references_and_the_metrics_that_need_them(given, tmp_path, capsys):
    """compare on bare files with sources alone: a reference-free metric is tested in its direction;
    beside a metric that needs references, or alone where it needs them, one line before any model
    loads. The run, score and compare say it alike."""
    from seq2seq_eval.cli import main
    from seq2seq_eval.config import EvalConfig

    worse = ["x y c", "q r s t", "m n"]
    for name, lines in (("base", worse), ("new", PREDS), ("src", SRCS)):
        (tmp_path / name).write_text("".join(x + "\n" for x in lines), encoding="utf-8")
    argv = ["compare", "--task", "translation", "--predictions", str(tmp_path / "base"), str(tmp_path / "new"),
            "--sources", str(tmp_path / "src"), "--n_samples", "20"]
    assert main([*argv, "--metrics", "miss", "--miss_qe", "--json", "--report", str(tmp_path / "r.html")]) == 0
    out = json.loads(capsys.readouterr().out)
    direct = seq2seq_eval.score(PREDS, None, metrics="miss", sources=SRCS, miss_qe=True)["miss"]
    assert out["results"]["new"]["miss"]["score"] == direct and out["best"] == {"miss": "new"}
    assert out["n_references"] == 0 and "source length" in (tmp_path / "r.html").read_text(encoding="utf-8")
    assert main([*argv, "--metrics", "miss", "--miss_qe"]) == 0
    assert "3 examples, no references; baseline: base" in capsys.readouterr().out
    # Neither sources nor references (a metric that reads neither): the report's buckets are the baseline's.
    assert main([*argv[:6], "--metrics", "given", "--report", str(tmp_path / "bare.html")]) == 0
    assert "<strong>baseline prediction</strong> length" in (tmp_path / "bare.html").read_text(encoding="utf-8")
    LOADS.clear()
    ending = "only reference-free metrics run without them (docs/metrics.md#model-metrics)"
    for extra, needing in ((["--metrics", "given,bleu"], "bleu needs"), (["--metrics", "given", "--given_refs", "needed"],
                                                                         "given needs")):
        assert main([*argv, *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"seq2seq_eval: error: compare --metrics {extra[1]}: {needing} references (pass "
                              "--references; a prediction is a bare file)") and err.endswith(ending), err
    assert LOADS == []
    for call in (lambda: EvalConfig(input_path=str(tmp_path / "src"), metrics="given,chrf"),
                 lambda: seq2seq_eval.score(PREDS, None, metrics="given,chrf"),
                 lambda: seq2seq_eval.compare({"a": PREDS, "b": worse}, None, metrics="given,chrf")):
        with pytest.raises(ConfigError) as e:
            call()
        assert ": chrf needs references (" in str(e.value) and str(e.value).endswith(ending)
    assert LOADS == []
