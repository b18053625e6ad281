"""One meaning for each option, everywhere (issue #34): options that cannot apply are refused,
`score`, `compare` and the run read metric names with one function, references given as lists
have one reading (or a one-line refusal), and `compare` takes the documented container."""

from __future__ import annotations

import pytest

import seq2seq_eval
from seq2seq_eval.config import EMBEDDED_MODEL, EvalConfig
from seq2seq_eval.errors import ConfigError, DataError

PREDS = ["the cat sat on the mat", "a dog runs in the park"]
# Per example: two references each. Read as two reference streams instead, the first stream
# would pair "the cat sat on the mat" with the second prediction: another score, no error.
PER_EXAMPLE = [["the cat sat on the mat", "a cat sat on a mat"], ["a dog runs in the park", "the dog runs"]]
STREAMS = [[PER_EXAMPLE[0][0], PER_EXAMPLE[1][0]], [PER_EXAMPLE[0][1], PER_EXAMPLE[1][1]]]


@pytest.mark.parametrize("options, message", [
    ({"dataset": "wmt16", "data_dir": "data"}, "--dataset 'wmt16' and --data_dir 'data': both name the data"),
    ({"metrics": "chrf", "num_return_sequences": 2, "generate_kwargs": (("num_beams", 2),)},
     "--metrics 'chrf': pseudolabels (--num_return_sequences > 1) are not scored"),
    ({"metrics": "bleu", "input_path": "sources.txt"},
     "--metrics bleu: bleu needs references (--input_path without --reference_path gives none); only "
     "reference-free metrics run without them"),
    ({"metrics": ""}, "--metrics '': no metric given"),
    ({"metrics": "bleu,comet", "shared_tail": True},
     "--shared_tail with --metrics comet: the ranks' slices cannot hold the model metrics' values"),
])
def test_options_that_cannot_apply_are_refused(options, message):
    with pytest.raises(ConfigError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        EvalConfig(**options)


def _refusals(spec):
    """What the run, score and compare say of `spec`, in that order."""
    calls = (lambda: EvalConfig(metrics=spec), lambda: seq2seq_eval.score(PREDS, PREDS, metrics=spec),
             lambda: seq2seq_eval.compare({"a": PREDS, "b": PREDS}, PREDS, metrics=spec, n_samples=10))
    said = []
    for call in calls:
        with pytest.raises(ConfigError) as e:
            call()
        said.append(str(e.value))
    return said


@pytest.mark.parametrize("spec, message", [
    ("bleu,bleu", "--metrics 'bleu,bleu': bleu is given twice"),
    ("rougeL", "--metrics 'rougeL': unknown metric 'rougeL'; valid names: bleu, chrf, chrf++, ter, rouge{models}; "
               "rouge reports rouge1, rouge2, rougeL and rougeLsum"),
    ("", "--metrics '': no metric given; valid names: bleu, chrf, chrf++, ter, rouge{models} (leave --metrics out for "
         "the task's metric)"),
    ("bleu,", "--metrics 'bleu,': unknown metric an empty name; valid names: bleu, chrf, chrf++, ter, rouge{models}"),
])
def test_run_score_and_compare_refuse_the_same_metric_names_alike(spec, message):
    from seq2seq_eval.scoring import registry

    # The model metrics follow the text metrics, in their registration order (comet first).
    assert registry.names()[0] == "comet"
    models = "".join(f", {name}" for name in registry.names())
    assert _refusals(spec) == [message.format(models=models)] * 3


def test_run_score_and_compare_accept_the_same_names():
    assert EvalConfig(metrics="CHRF, bleu").metric_names == ("chrf", "bleu")
    assert {"chrf", "bleu"} <= set(seq2seq_eval.score(PREDS, PREDS, metrics="CHRF, bleu"))
    assert seq2seq_eval.compare({"a": PREDS, "b": PREDS}, PREDS, metrics="CHRF, bleu", n_samples=10)["metrics"] == \
        ["chrf", "bleu"]


def test_compare_subcommand_refuses_a_repeated_metric(tmp_path, capsys):
    from seq2seq_eval.cli import main

    for name in ("a", "b", "r"):
        (tmp_path / f"{name}.txt").write_text("\n".join(PREDS) + "\n")
    argv = ["compare", "--predictions", str(tmp_path / "a.txt"), str(tmp_path / "b.txt"), "--references",
            str(tmp_path / "r.txt"), "--task", "translation", "--metrics", "bleu,bleu"]
    assert main(argv) == 2
    assert capsys.readouterr().err.strip() == "seq2seq_eval: error: --metrics 'bleu,bleu': bleu is given twice"


def test_references_of_both_shapes_are_refused_unless_the_layout_is_named():
    with pytest.raises(DataError, match=r"^references: 2 lists of 2 texts can be one list per example or 2 "
                                        r"reference streams, and the two give different scores; pass "
                                        r"reference_layout='examples' or 'streams'$"):
        seq2seq_eval.score(PREDS, PER_EXAMPLE)
    as_examples = seq2seq_eval.score(PREDS, PER_EXAMPLE, reference_layout="examples")
    assert as_examples == seq2seq_eval.score(PREDS, STREAMS, reference_layout="streams")
    assert as_examples["bleu"] == pytest.approx(100.0)
    assert seq2seq_eval.score(PREDS, PER_EXAMPLE, reference_layout="streams")["bleu"] != 100.0
    # evaluate() reads them the same way, before any model is loaded
    with pytest.raises(DataError, match="reference_layout='examples' or 'streams'"):
        seq2seq_eval.evaluate(str(EMBEDDED_MODEL), sources=["a b", "c d"], references=PER_EXAMPLE, save_dir="unused")


def test_references_of_one_shape_need_no_layout():
    three = PREDS + ["it is red"]
    per_example = [["the cat sat on the mat"], ["a dog runs in the park", "the dog runs"], "it is red"]
    assert seq2seq_eval.score(three, per_example)["bleu"] == pytest.approx(100.0)  # per example: the only reading
    streams = [["the cat sat on the mat", "a dog runs in the park", "it is red"], ["x", "y", "z"]]
    assert seq2seq_eval.score(three, streams)["bleu"] == pytest.approx(100.0)  # 2 streams of 3: the only reading
    with pytest.raises(DataError, match=r"references\[0\]: 3 texts but 2 predictions; a reference stream"):
        seq2seq_eval.score(PREDS, [["a", "b", "c"]], reference_layout="streams")


@pytest.mark.parametrize("systems", [[PREDS, PREDS], (PREDS, PREDS), "ab"])
def test_compare_takes_a_dict_of_systems(systems):
    with pytest.raises(ConfigError, match=r"^compare\(systems\): expected a dict of name -> predictions"):
        seq2seq_eval.compare(systems, PREDS)


def test_compare_refuses_a_system_that_is_not_a_list_of_texts():
    with pytest.raises(DataError, match=r"^compare\(systems\): system b: expected a list of predictions"):
        seq2seq_eval.compare({"a": PREDS, "b": "one text"}, PREDS)


def test_score_subcommand_reads_reference_files_as_streams(tmp_path, capsys):
    """Two reference files for two predictions fit both layouts as lists; files are streams,
    so the command line names the layout and never asks the user for one."""
    from seq2seq_eval.cli import main

    (tmp_path / "p.txt").write_text("\n".join(PREDS) + "\n")
    for k, stream in enumerate(STREAMS):
        (tmp_path / f"r{k}.txt").write_text("\n".join(stream) + "\n")
    argv = ["score", "--metrics", "chrf", "--predictions", str(tmp_path / "p.txt"), "--references",
            str(tmp_path / "r0.txt"), str(tmp_path / "r1.txt")]
    assert main(argv) == 0
    import json

    got = json.loads(capsys.readouterr().out)
    assert got["chrf"] == seq2seq_eval.score(PREDS, STREAMS, metrics="chrf", reference_layout="streams")["chrf"]
    assert got["chrf"] == 100.0
