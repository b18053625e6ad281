"""`select`: MBR over an example's candidates with chrF or BLEU as the utility (docs/selection.md).

The utility matrix against sacrebleu's own sentence scores, hand-checkable cases, the tie rule,
duplicates, the checks before any work, the command's output and its publish, and parity with
mbrs 0.1.8 in the side environment where one is installed (skipped where none is: CI has none).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from sacrebleu.metrics import BLEU, CHRF

from seq2seq_eval.cli import main
from seq2seq_eval.errors import ConfigError
from seq2seq_eval.selection.command import select_main
from seq2seq_eval.selection.mbr import best, expected_utilities, select_mbr, utility_matrix

DATA = Path(__file__).resolve().parent / "data" / "selection"
FIXTURES = {"beam8": DATA / "beam8.jsonl", "sample16": DATA / "sample16.jsonl", "short": DATA / "short.jsonl"}
"""The embedded model's candidates for the first 10 sources of data_samples/translation/test.source,
as its pseudolabel runs wrote them (`{type_path}_pseudolabels.jsonl`): 8 from beam search
(--num_beams 8), 16 sampled (--do_sample true --epsilon_cutoff 0.02 --seed 7), many repeated; and
hand-made short ones: under 4 tokens (where BLEU's effective order decides), empty, duplicated,
tied, differing in case and punctuation."""
MBRS_PYTHON = Path(os.environ.get("S2S_MBRS_PYTHON", "/work/side/venv-mbrs/bin/python"))
SACRE = {"chrf": CHRF(), "bleu": BLEU(effective_order=True)}  # mbrs' MetricChrF / MetricBLEU defaults


def records(name: str) -> list[dict]:
    return [json.loads(line) for line in FIXTURES[name].read_text(encoding="utf-8").splitlines()]


def brute_force(candidates: list[str], utility: str) -> list[list[float]]:
    """sacrebleu's sentence_score for every pair, one call each (what mbrs' Metric.score does)."""
    return [[SACRE[utility].sentence_score(h, [r]).score for r in candidates] for h in candidates]


# --- the pure part ---------------------------------------------------------------------------

def test_hand_checkable_chrf():
    """Identical texts score 100, texts without a common character 0: the means are by hand."""
    sel = select_mbr(["ab", "cd", "ab"], "chrf")
    assert utility_matrix(["ab", "cd", "ab"], "chrf").tolist() == [[100, 0, 100], [0, 100, 0], [100, 0, 100]]
    assert sel.scores == (200 / 3, 100 / 3, 200 / 3)
    assert sel.index == 0  # a tie with candidate 2 (its duplicate): the earlier one


@pytest.mark.parametrize("cands", [["the cat sat on the mat", "a cat sat on a mat", "the dog sat on the mat"],
                                   ["a b c", "a b", "a b c"]])
def test_three_candidates_against_sacrebleu(cands):
    for utility in ("chrf", "bleu"):
        pairs = brute_force(cands, utility)
        assert utility_matrix(cands, utility).tolist() == pairs
        sel = select_mbr(cands, utility)
        assert sel.scores == tuple(math.fsum(row) / 3 for row in pairs)
        assert sel.index == max(range(3), key=lambda i: (sel.scores[i], -i))


@pytest.mark.parametrize("name", sorted(FIXTURES))
@pytest.mark.parametrize("utility", ["chrf", "bleu"])
def test_the_matrix_is_sacrebleus_sentence_scores(name, utility):
    """Each distinct pair is scored once and spread over its positions: the result is every
    pair's own sentence_score, duplicates included (the sampled file repeats most candidates)."""
    for r in records(name)[:4]:
        assert utility_matrix(r["candidates"], utility).tolist() == brute_force(r["candidates"], utility)


def test_short_bleu_is_sentence_bleu_with_effective_order():
    """Under 4 tokens BLEU without effective order is 0 even for a text against itself; mbrs'
    MetricBLEU (and sacrebleu.sentence_bleu) use effective order: "a b" against itself is 100."""
    got = utility_matrix(["a b", "a b", "c d"], "bleu").ravel().tolist()
    assert got == pytest.approx([100, 100, 0, 100, 100, 0, 0, 0, 100], abs=1e-9)  # sacrebleu's 100.00000000000004


def test_ties_go_to_the_earlier_candidate_whatever_its_text():
    for cands in (["ab", "cd"], ["cd", "ab"]):
        sel = select_mbr(cands, "chrf")
        assert sel.scores[0] == sel.scores[1] == 50.0
        assert sel.index == 0
    assert select_mbr(["cd", "ab", "ab"], "chrf").index == 1
    assert best([1.0, 3.0, 2.0, 3.0]) == 1


def test_duplicates_get_the_same_bits_wherever_they_stand():
    """The mean is an exact sum over the row: a permutation of the candidates permutes the
    scores bit for bit (a left-to-right float sum would not promise that)."""
    cands = records("beam8")[3]["candidates"]
    perm = [5, 2, 7, 0, 3, 6, 1, 4]
    for utility in ("chrf", "bleu"):
        a = select_mbr(cands, utility).scores
        b = select_mbr([cands[p] for p in perm], utility).scores
        assert [a[p] for p in perm] == list(b)
    dup = ["x y z", "a b c", "x y z", "x y", "x y z"]
    scores = select_mbr(dup, "chrf").scores
    assert scores[0] == scores[2] == scores[4]


def test_the_mean_is_exact():
    """expected_utilities divides an exactly rounded sum: values whose naive float sum loses a
    digit (1e16 + 1 - 1e16) still average right."""
    import numpy as np

    assert expected_utilities(np.array([[1e16, 1.0, -1e16, 2.0]])) == (0.75,)


def test_select_mbr_refuses_what_it_cannot_do():
    with pytest.raises(ValueError, match="2 or more candidates, got 1"):
        select_mbr(["a"], "chrf")
    with pytest.raises(ValueError, match="chrf, bleu, got 'ter'"):
        select_mbr(["a", "b"], "ter")


# --- the chrF matrix in numpy (selection/chrf.py) against sacrebleu's per-pair loop -------------

def test_chrf_module_keeps_sacrebleus_defaults():
    """chrf.py computes CHRF()'s sentence score: a sacrebleu whose defaults moved fails here."""
    from seq2seq_eval.selection import chrf

    m = CHRF()
    assert (m.char_order, m.word_order, m.beta, m.lowercase, m.whitespace, m.eps_smoothing) == (
        chrf.CHAR_ORDER, 0, chrf.BETA, False, False, False)


CHRF_TEXTS = {
    # n-grams do not run from one text into the next: "bc" shares no bigram with "ab" or "cd",
    # though the texts end to end ("abcdbc") would hold one
    "boundaries": ["ab", "cd", "bc", "abcd"],
    # clipped matches: "aaaa" holds the unigram a 4 times, "aa" twice
    "clipping": ["aaaa", "aa", "aaaaaaa", "a"],
    # shorter than the 6 orders, empty, and blank (nothing left once whitespace goes)
    "short": ["", "a", "ab c", " \t ", "abcdef", "abcdefg"],
    # whitespace as str.split() finds it (no-break, ideographic, line separator, \x1c) is removed;
    # case and punctuation are kept
    "whitespace": ["a\u00a0b\u3000c", "abc", "a\u2028b\x1cc.", "ABC", "a b c"],
    # characters beyond the BMP, combining marks, CJK, and a lone surrogate (a character to
    # Python and to sacrebleu alike)
    "unicode": ["日本語のテキスト", "日本語テキスト", "e\u0301té 😀😀", "été 😀", "\ud800a\ud800", "?a?", "a"],
    "repeats": ["the cat sat on the mat the cat", "the cat sat on the mat", "on the mat the cat sat"],
}


@pytest.mark.parametrize("name", sorted(CHRF_TEXTS))
def test_chrf_matrix_is_sacrebleus_sentence_chrf_bit_for_bit(name):
    from seq2seq_eval.selection.chrf import chrf_matrix

    texts = CHRF_TEXTS[name]
    assert chrf_matrix(texts).tolist() == brute_force(texts, "chrf")


@pytest.mark.parametrize("name", sorted(CHRF_TEXTS))
def test_chrf_pair_statistics_are_sacrebleus_rows(name):
    """The integers behind the scores, sacrebleu's [hyp, ref, match] per order, its convention
    included: no hypothesis n-grams counted for an order the reference has none of."""
    from seq2seq_eval.selection.chrf import pair_statistics

    texts = CHRF_TEXTS[name]
    hyp, ref, match = pair_statistics(texts)
    ours = [[[int(x[n, i, j]) for n in range(6) for x in (hyp, ref, match)] for j in range(len(texts))]
            for i in range(len(texts))]
    assert ours == [[CHRF()._extract_corpus_statistics([h], [[r]])[0] for r in texts] for h in texts]


def test_chrf_matrix_in_blocks_is_the_same(monkeypatch):
    """Long candidates take the pair rows in blocks (chrf.BLOCK cells at a time): any block size
    gives the same matrix, here one row at a time, on texts of a few thousand characters."""
    from seq2seq_eval.selection import chrf

    texts = list(dict.fromkeys(records("sample16")[2]["candidates"]))
    texts.append(" ".join(records("sample16")[3]["candidates"] * 8))
    whole = chrf.chrf_matrix(texts)
    monkeypatch.setattr(chrf, "BLOCK", 1)
    assert chrf.chrf_matrix(texts).tolist() == whole.tolist() == brute_force(texts, "chrf")


# --- the command -----------------------------------------------------------------------------

def run_select(capsys, *args: str) -> tuple[int, str, str]:
    rc = main(["select", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def write_lines(path: Path, lines: list) -> Path:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines), encoding="utf-8")
    return path


@pytest.mark.parametrize("utility", ["chrf", "bleu"])
def test_select_over_a_pseudolabel_file(capsys, tmp_path, monkeypatch, utility):
    """The tool's own _pseudolabels.jsonl is a candidates file; one line per example, in file
    order; nothing written anywhere without --output."""
    before = sorted(DATA.iterdir())
    monkeypatch.chdir(tmp_path)
    rc, out, err = run_select(capsys, "--candidates", str(FIXTURES["beam8"]), "--select", "mbr",
                              "--select_metric", utility)
    assert rc == 0 and err == ""
    lines = [json.loads(line) for line in out.splitlines()]
    recs = records("beam8")
    assert [x["id"] for x in lines] == [r["id"] for r in recs]
    for line, r in zip(lines, recs):
        sel = select_mbr(r["candidates"], utility)
        assert line["select_scores"] == list(sel.scores)
        assert line["selected"] == sel.index and line["prediction"] == r["candidates"][sel.index]
    assert sorted(DATA.iterdir()) == before and list(tmp_path.iterdir()) == []


def test_output_is_published_and_guarded(capsys, tmp_path):
    cands = write_lines(tmp_path / "c.jsonl", [{"id": "a", "source": "s", "candidates": ["ab", "cd", "ab"]}])
    out_path = tmp_path / "out" / "sel.jsonl"
    rc, out, _ = run_select(capsys, "--candidates", str(cands), "--select", "mbr", "--select_metric", "chrf",
                            "--output", str(out_path))
    assert rc == 0 and out.strip() == f"wrote 1 selections to {out_path}"
    assert json.loads(out_path.read_text(encoding="utf-8")) == {
        "id": "a", "selected": 0, "prediction": "ab", "select_scores": [200 / 3, 100 / 3, 200 / 3]}
    assert (out_path.parent / ".seq2seq_eval_outputs.json").is_file()  # the folder's record: ours to replace
    # Written over: the record says the tool wrote it.
    cands = write_lines(cands, [{"id": "a", "source": "s", "candidates": ["a b c d", "a b c", "a b"]}])
    rc, _, _ = run_select(capsys, "--candidates", str(cands), "--select", "mbr", "--select_metric", "bleu",
                          "--output", str(out_path))
    assert rc == 0
    assert json.loads(out_path.read_text(encoding="utf-8"))["select_scores"] == list(
        select_mbr(["a b c d", "a b c", "a b"], "bleu").scores)
    # A file the tool did not write, and the candidates file itself, are refused before any work.
    theirs = tmp_path / "theirs.jsonl"
    theirs.write_text("keep\n", encoding="utf-8")
    for target, said in ((theirs, "move it away or name another file"), (cands, "would write over --candidates")):
        rc, out, err = run_select(capsys, "--candidates", str(cands), "--select", "mbr", "--select_metric", "chrf",
                                  "--output", str(target))
        assert rc != 0 and out == "" and said in err and len(err.strip().splitlines()) == 1
    assert theirs.read_text(encoding="utf-8") == "keep\n"


@pytest.mark.parametrize("mode, metric, said", [
    ("qe", "chrf", "chrf needs a reference"),
    ("qe", "bleu", "bleu needs a reference"),
    ("qe", "ter", "ter needs a reference"),
    ("qe", "kiwi", "--select qe --select_metric 'kiwi' is not a metric the tool knows"),
    ("mbr", "ter", "--select mbr --select_metric 'ter' is not a mbr metric here; expected chrf or bleu"),
    ("mbr", "chrf++", "--select mbr --select_metric 'chrf++' is not a mbr metric here"),
    ("mbr", "CHRF", "--select mbr --select_metric 'CHRF' is not a metric the tool knows; expected chrf or bleu"),
    ("rerank", "chrf", "--select 'rerank': expected one of mbr, qe"),
])
def test_modes_and_metrics_refused_in_one_line(capsys, mode, metric, said):
    """Before the candidates are read: the file named does not even exist."""
    rc, out, err = run_select(capsys, "--candidates", "/nonexistent/c.jsonl", "--select", mode, "--select_metric", metric)
    assert rc == 2 and out == "" and said in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("line, said", [
    ('{"id": 1, "source": "s", "candidates": ["only one"]}', "line 2 field 'candidates': 1 candidate; --select mbr needs 2"),
    ('{"id": 1, "source": "s", "candidates": []}', "line 2 field 'candidates': 0 candidates"),
    ('{"id": 1, "source": "s", "candidates": "a b"}', "line 2 field 'candidates': expected a list of 2 or more"),
    ('{"id": 1, "source": "s", "candidates": ["a", 3]}', "line 2 field 'candidates' item 1: expected a string, got 3"),
    ('{"id": 1, "source": "s", "candidates": ["a", "\\ud800"]}', "item 1: holds a lone surrogate (U+D800"),
    ('{"id": 1, "source": "s"}', "line 2: missing field 'candidates'; expected a list"),
    ('{"id": 1, "source": "s", "preds": ["a", "b"]}', "(a pseudolabel_results.json record's 'preds'"),
    ('{"id": 1, "candidates": ["a", "b"]}', "line 2: missing field 'source'"),
    ('{"id": 1, "source": " ", "candidates": ["a", "b"]}', "line 2 field 'source': blank source"),
    ('{"id": [1], "source": "s", "candidates": ["a", "b"]}', "line 2 field 'id': an id must be a string or an integer"),
    ('{"id": 0, "source": "s", "candidates": ["a", "b"]}', "line 2 field 'id': duplicated id 0 (first on line 1)"),
    ('{"id": 1, "source": "s", "candidates": ["a", "b"]', "line 2: malformed JSON"),
    ('["a", "b"]', "line 2: expected a JSON object, got list"),
])
def test_malformed_lines_refused_before_any_work(capsys, tmp_path, line, said):
    """A bad second line: the first example's selection is not printed either."""
    path = write_lines(tmp_path / "c.jsonl", [{"id": 0, "source": "s", "candidates": ["a b", "a c"]}, line])
    rc, out, err = run_select(capsys, "--candidates", str(path), "--select", "mbr", "--select_metric", "chrf")
    assert rc != 0 and out == "" and len(err.strip().splitlines()) == 1
    assert str(path) in err and said in err, err


def test_whole_file_refusals(capsys, tmp_path):
    legacy = tmp_path / "pseudolabel_results.json"
    legacy.write_text('[\n{"id": 0, "source": "s", "target": [], "preds": ["a", "b"]}\n]\n', encoding="utf-8")
    empty = write_lines(tmp_path / "empty.jsonl", ["", "  "])
    for path, said in ((legacy, "a JSON list (pseudolabel_results.json's form)"), (empty, "no records"),
                       (tmp_path / "missing.jsonl", "file not found")):
        rc, out, err = run_select(capsys, "--candidates", str(path), "--select", "mbr", "--select_metric", "chrf")
        assert rc != 0 and out == "" and said in err and len(err.strip().splitlines()) == 1


def test_ranks_need_a_temp_dir():
    """Under torchrun the ranks share their work through a temp dir (test_select_ranks.py): printing
    without one is refused before the file is read."""
    from seq2seq_eval.run.dist import DistEnv

    with pytest.raises(ConfigError, match="under torchrun the ranks share their selections through a temp dir"):
        select_main(["--candidates", "nowhere.jsonl", "--select", "mbr", "--select_metric", "chrf"],
                    DistEnv(rank=1, world_size=2))


def test_empty_candidates_are_scored_not_refused():
    """A model may generate nothing: an empty candidate is a (poor) output, scored as sacrebleu does."""
    sel = select_mbr(["", "a b c", "a b c d"], "chrf")
    assert sel.scores[0] == sum(brute_force(["", "a b c", "a b c d"], "chrf")[0]) / 3
    assert sel.index in (1, 2)


def test_a_reader_that_stops_reading_ends_it_quietly(tmp_path):
    """`select ... | head -1`: more than a pipe's buffer of output, the reader gone after one line."""
    long = "a" * 6000
    path = write_lines(tmp_path / "c.jsonl", [{"id": i, "source": "s", "candidates": [long, long + "b"]} for i in range(40)])
    proc = subprocess.Popen([sys.executable, "-m", "seq2seq_eval", "select", "--candidates", str(path), "--select", "mbr",
                             "--select_metric", "chrf"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert json.loads(proc.stdout.readline())["id"] == 0
    proc.stdout.close()
    assert proc.wait(timeout=120) == 0
    assert proc.stderr.read() == b""


def test_select_is_a_subcommand_not_a_legacy_model_path():
    from seq2seq_eval.legacy import is_legacy_command

    assert not is_legacy_command(["select", "--candidates", "c.jsonl", "--select", "mbr", "--select_metric", "chrf"])


# --- parity with mbrs 0.1.8 (side environment) -----------------------------------------------

F32_TOLERANCE = 1e-4
"""How far mbrs' float32 matrix and mean may be from the float64 mean on the 100-point scale
(float32 keeps ~7 digits: at most ~1e-5 here); a best unique by more than this must agree."""


@pytest.fixture(scope="module")
def mbrs_results() -> dict:
    """mbrs' results for every fixture and both utilities, from one side process."""
    if not MBRS_PYTHON.is_file():
        pytest.skip(f"no mbrs side environment at {MBRS_PYTHON} (docs/selection.md says how to make one)")
    paths = [str(p) for p in FIXTURES.values()]
    side = subprocess.run([str(MBRS_PYTHON), str(Path(__file__).parent / "mbrs_side.py"), *paths],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": ""})
    assert side.returncode == 0, side.stderr[-2000:]
    return json.loads(side.stdout)


@pytest.mark.parametrize("name", sorted(FIXTURES))
@pytest.mark.parametrize("utility", ["chrf", "bleu"])
def test_parity_with_mbrs(mbrs_results, name, utility):
    theirs = mbrs_results[utility][str(FIXTURES[name])]
    compared = texts = 0
    for r, m in zip(records(name), theirs, strict=True):
        assert m["id"] == r["id"]
        ours = select_mbr(r["candidates"], utility)
        n = len(r["candidates"])
        # mbrs' own utility per pair, averaged in float64: equal to 1e-9.
        assert ours.scores == pytest.approx([sum(row) / n for row in m["pairs"]], abs=1e-9, rel=0)
        # mbrs' DecoderMBR expected utilities (float32): equal within float32's rounding.
        assert ours.scores == pytest.approx(m["expected"], abs=F32_TOLERANCE, rel=0)
        top = sorted(m["expected"], reverse=True)
        if top[0] - top[1] > F32_TOLERANCE:
            assert ours.index == m["selected"]
            compared += 1
        # Duplicates tie with each other: where the best TEXT is unique, the same text is chosen
        # (mbrs picks any of its copies, the tool the first).
        by_text = sorted({c: e for c, e in zip(r["candidates"], m["expected"])}.items(), key=lambda x: -x[1])
        if len(by_text) == 1 or by_text[0][1] - by_text[1][1] > F32_TOLERANCE:
            assert r["candidates"][ours.index] == r["candidates"][m["selected"]] == by_text[0][0]
            assert ours.index == r["candidates"].index(by_text[0][0])
            texts += 1
    assert compared > 0 and texts >= compared, "no example with a unique best: the fixture compares no selection"


@pytest.mark.parametrize("metric, flag", [("chrf", "--comet_model"), ("bleu", "--metricx_qe"), ("chrf", "--model_metric_max_tokens")])
def test_a_model_option_the_selection_does_not_read_is_refused(capsys, tmp_path, metric, flag):
    """Before the candidates are read (the file named does not exist): a flag that changes nothing."""
    value = [] if flag == "--metricx_qe" else ["512" if flag.endswith("tokens") else str(tmp_path / "m")]
    rc, out, err = run_select(capsys, "--candidates", str(tmp_path / "none.jsonl"), "--select", "mbr",
                              "--select_metric", metric, flag, *value)
    assert rc == 2 and out == "" and f"{flag}" in err and f"--select_metric {metric}" in err
    assert len(err.strip().splitlines()) == 1
